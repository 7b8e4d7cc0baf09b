"""Defaults shared by the training configs: every key `loopspec_jax.train.trainer.Trainer` reads."""

import ml_collections
from ml_collections import config_dict


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "model"
  c.model = ml_collections.ConfigDict()  # ModelConfig fields (loopspec_configs.models._common.model_config)
  c.seed = 0
  c.steps = 1000
  c.batch_size = 16
  c.seq_len = 256
  c.lr = 2e-3
  c.warmup_steps = 50
  c.min_lr_ratio = 0.1
  c.weight_decay = 0.1
  c.grad_clip = 1.0
  c.b1 = 0.9
  c.b2 = 0.95
  c.compute_dtype = "float32"  # or "bfloat16" (float32 master weights)
  c.init_contraction = ml_collections.FieldReference(None, field_type=float)
  # objective: 'raven' (random depth, truncated backprop) or 'ouro' (loss at every depth)
  c.objective = "raven"
  c.mean_recurrence = 8.0
  c.sigma = 0.5
  c.max_recurrence = 32
  c.backprop_depth = 4
  c.aux_depths = ()
  c.aux_weight = 1.0
  c.ouro_reduce = "mean"
  c.init_state = "random"
  c.mtp_weight = 0.0  # > 0: train one DeepSeek-V3 MTP module too (loopspec_jax/heads/mtp.py), this loss weight
  # data
  c.data = ml_collections.ConfigDict()
  c.data.cache_dir = config_dict.placeholder(str)  # none: ~/.cache/loopspec_jax
  c.data.vocab_size = 2048
  c.data.stdlib_max_bytes = 4_000_000
  c.data.weights = ml_collections.ConfigDict({"shakespeare": 0.4, "gsm8k": 0.3, "stdlib": 0.3})
  # checkpoints, logging, evaluation, export
  c.workdir = "/tmp/loopspec_train/model"
  c.save_every = 100
  c.keep_checkpoints = 2
  c.log_every = 10
  c.eval_every = 100
  c.eval_windows = 8
  c.eval_depths = (1, 2, 4, 8)
  c.card_eval_windows = 48
  c.card_depths = (1, 2, 4, 8)
  c.export_dir = config_dict.placeholder(str)  # none: no export
  c.heads_export_dir = config_dict.placeholder(str)  # where a head trained with the model goes (mtp)
  return c
