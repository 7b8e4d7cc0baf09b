"""Tests for loopspec_jax.theory: the cost identity, the power-law fit, and Theorems 1 and 2."""

import numpy as np
import pytest

from loopspec_jax.analysis import theory


class TestCostIdentity:
  """The expected-cost formula, its gamma, and the release's count-based gamma."""

  def test_no_rejections_costs_d1(self):
    assert theory.expected_cost(32, 2, 8, 0.0, 0.0) == 2.0
    assert theory.expected_gamma(32, 2, 8, 0.0, 0.0) == 16.0
    assert theory.expected_cost(32, 2, None, 0.0) == 2.0

  def test_always_restart_costs_R(self):
    assert theory.expected_cost(32, 2, 8, 1.0, 1.0) == 32.0
    assert theory.expected_gamma(32, 2, 8, 1.0, 1.0) == 1.0
    assert theory.expected_cost(32, 2, None, 1.0) == 32.0

  def test_general_value(self):
    # 2 + 6 * 0.3 + 24 * 0.1 = 6.2
    assert theory.expected_cost(32, 2, 8, 0.3, 0.1) == pytest.approx(6.2)
    assert theory.single_proposal_gamma(4, 1, 0.2) == pytest.approx(4 / (1 + 3 * 0.2))

  def test_single_ignores_restart(self):
    assert theory.expected_cost(32, 2, None, 0.3, 0.9) == theory.expected_cost(32, 2, None, 0.3)

  def test_array_inputs(self):
    c = theory.expected_cost(32, 2, 8, np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    np.testing.assert_allclose(c, [2.0, 32.0])

  def test_bad_inputs(self):
    with pytest.raises(ValueError):
      theory.expected_cost(32, 2, 8, 0.3)  # missing p_restart
    with pytest.raises(ValueError):
      theory.expected_cost(32, 2, 8, 1.3, 0.1)
    with pytest.raises(ValueError):
      theory.expected_cost(32, 8, 2, 0.1, 0.1)

  @pytest.mark.parametrize("d2", [8, None])
  def test_counts_match_rates(self, d2):
    n, n_rej1, n_restart = 1000, 137, 21
    g = theory.gamma_from_counts(32, 2, d2, n, n_rej1, n_restart)
    c = theory.expected_cost(32, 2, d2, n_rej1 / n, n_restart / n)
    assert g == pytest.approx(32 / c, rel=1e-12)

  def test_counts_release_formula(self):
    n, n_rej1, n_restart = 500, 40, 5
    want = 32 * n / (n * 2 + n_rej1 * 6 + n_restart * 24)
    assert theory.gamma_from_counts(32, 2, 8, n, n_rej1, n_restart) == pytest.approx(want)
    with pytest.raises(ValueError):
      theory.gamma_from_counts(32, 2, 8, 0, 0, 0)


class TestPowerLawFit:
  """Least-squares recovery and the upper envelope."""

  BETA, ALPHA = 0.3, 0.9

  def _data(self, sigma=0.05, seed=0):
    rng = np.random.default_rng(seed)
    r = np.arange(1, 33, dtype=np.float64)
    tv = self.BETA * r ** (-self.ALPHA) * np.exp(sigma * rng.standard_normal(r.shape))
    return r, tv

  def test_power_law(self):
    assert theory.power_law(4.0, 0.3, 0.5) == pytest.approx(0.15)
    np.testing.assert_allclose(theory.power_law(np.array([1.0, 4.0]), 0.3, 0.5), [0.3, 0.15])

  def test_exact_recovery(self):
    r = np.arange(1, 33, dtype=np.float64)
    beta, alpha = theory.fit_power_law(r, theory.power_law(r, 0.175, 1.03))
    assert beta == pytest.approx(0.175, rel=1e-9)
    assert alpha == pytest.approx(1.03, rel=1e-9)

  def test_noisy_recovery(self):
    beta, alpha = theory.fit_power_law(*self._data())
    assert beta == pytest.approx(self.BETA, rel=0.05)
    assert alpha == pytest.approx(self.ALPHA, rel=0.05)

  def test_ignores_non_positive(self):
    r, tv = self._data()
    tv = tv.copy()
    tv[[3, 17]] = [0.0, -1e-3]
    beta, alpha = theory.fit_power_law(r, tv)
    assert alpha == pytest.approx(self.ALPHA, rel=0.05)
    with pytest.raises(ValueError):
      theory.fit_power_law([1.0, 2.0], [0.1, 0.0])

  def test_envelope_above_and_non_increasing(self):
    r, tv = self._data(sigma=0.2, seed=1)
    tv = tv.copy()
    tv[5] = 0.0
    beta, alpha = theory.fit_power_law(r, tv, envelope=True)
    phi = theory.power_law(r, beta, alpha)
    assert np.all(phi >= tv * (1 - 1e-12))
    assert np.any(np.isclose(phi, tv, rtol=1e-12))  # tight: touches at least one point
    assert alpha >= 0.0
    dense = theory.power_law(np.linspace(1, 64, 500), beta, alpha)
    assert np.all(np.diff(dense) <= 0.0)

  def test_envelope_clips_increasing_data(self):
    r = np.arange(1.0, 9.0)
    tv = 0.01 * r  # increasing: the envelope must be flat at the max
    beta, alpha = theory.fit_power_law(r, tv, envelope=True)
    assert alpha == 0.0
    assert beta == pytest.approx(0.08)


class TestTheorem2:
  """Closed-form optimum and feasible rounding."""

  def test_paper_check_value(self):
    d1, d2 = theory.optimal_depths(32, 0.175, 1.03)
    assert abs(d1 - 1.258) < 0.01 and abs(d2 - 8.845) < 0.01

  def test_optimum_is_stationary(self):
    R, beta, alpha = 32, 0.175, 1.03
    d1, d2 = theory.optimal_depths(R, beta, alpha)
    j = theory.cost_bound(R, d1, d2, beta, alpha)
    for e1 in (-0.05, 0.0, 0.05):
      for e2 in (-0.2, 0.0, 0.2):
        assert theory.cost_bound(R, d1 + e1, d2 + e2, beta, alpha) >= j - 1e-12

  def test_cost_bound_value(self):
    # J = 2 + 8 * 0.2 * 2^-1 + 64 * 0.2 * 8^-1 = 2 + 0.8 + 1.6
    assert theory.cost_bound(32, 2, 8, 0.2, 1.0) == pytest.approx(4.4)
    assert theory.predicted_gamma_bound(32, 2, 8, 0.2, 1.0) == pytest.approx(32 / 4.4)
    assert theory.cost_bound(32, 2, None, 0.2, 1.0) == pytest.approx(2 + 30 * 0.1)

  def test_feasible_configs(self):
    assert theory.feasible_configs(4) == [(1, 2), (1, 3)]
    assert theory.feasible_configs(4, include_single=True) == [(1, 2), (1, 3), (1, None), (2, None)]
    for d1, d2 in theory.feasible_configs(32):
      assert 32 % d1 == 0 and d2 % d1 == 0 and d1 < d2 < 32
    assert (2, 8) in theory.feasible_configs(32)

  def test_best_feasible(self):
    R, beta, alpha = 32, 0.175, 1.03
    d1, d2 = theory.best_feasible_depths(R, beta, alpha)
    print(f"best feasible (d1, d2) for R={R}, beta={beta}, alpha={alpha}: ({d1}, {d2})")
    assert R % d1 == 0 and d2 % d1 == 0 and d1 < d2 < R
    best = theory.cost_bound(R, d1, d2, beta, alpha)
    assert all(theory.cost_bound(R, a, b, beta, alpha) >= best for a, b in theory.feasible_configs(R))
    assert theory.predicted_gamma_bound(R, d1, d2, beta, alpha) == pytest.approx(R / best)
    assert theory.best_feasible_depths(4, 0.175, 1.03) in theory.feasible_configs(4)


class TestTheorem1AndChain:

  def test_theorem1(self):
    out = theory.theorem1_check(0.15, 0.1, gated=True)
    assert out["bound"] == pytest.approx(0.2) and out["holds"]
    assert not theory.theorem1_check(0.15, 0.1, gated=False)["holds"]
    assert theory.theorem1_check(0.105, 0.1, gated=False, slack=0.01)["holds"]
    assert out["restart_rate"] == 0.15

  def test_chain_expected_tokens(self):
    assert theory.chain_expected_tokens(1.0, 4) == 5.0
    assert theory.chain_expected_tokens(0.0, 4) == 1.0
    assert theory.chain_expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert theory.chain_expected_tokens(0.8, 5) == pytest.approx(sum(0.8**k for k in range(6)))
    np.testing.assert_allclose(theory.chain_expected_tokens(np.array([0.5, 1.0]), 2), [1.75, 3.0])
