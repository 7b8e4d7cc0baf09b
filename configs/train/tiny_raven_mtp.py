"""tiny-raven-mtp: tiny-raven's model, corpus and budget, trained from the start with one DeepSeek-V3 MTP module
(loopspec_jax/heads/mtp.py, loss weight lambda = 0.3, DeepSeek-V3's early-training value). Exports the backbone
to assets/models/tiny-raven-mtp and the MTP module to assets/heads/tiny-raven-mtp."""

from loopspec_configs.train import tiny_raven


def get_config(arg=None):
  c = tiny_raven.get_config(arg)
  c.name = "tiny-raven-mtp"
  c.mtp_weight = 0.3
  c.workdir = "/tmp/loopspec_train/tiny-raven-mtp"
  c.export_dir = "loopspec_jax/assets/models/tiny-raven-mtp"
  c.heads_export_dir = "loopspec_jax/assets/heads/tiny-raven-mtp"
  return c
