# chain d1 = 1 (and AR, the timing reference) under sampling seeds 8..15
O=results/trees_shape/epyc2-2026-12-04-kseq-b
for s in 8 9 10 11 12 13 14 15; do
  (date -u; uptime) > $O/uptime_start_chain_seed$s.txt
  .venv/bin/python -P -m loopspec_experiments.bench_trees --config=scripts/results/trees_shape/bench_config.py:kseq \
      --config.out_dir=$O/chain_seed$s --config.seed=$s \
      --config.only='ar;chain:d1=1,gamma=6' > $O/log_chain_seed$s.txt 2>&1
done
(date -u; uptime) > $O/uptime_end_chain_seeds.txt
