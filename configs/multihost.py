"""Settings of the multi-process check (experiments/multihost_check.py).

  launch/local.sh --processes 2 --cpu-devices 2 experiments.multihost_check               # this config
  launch/local.sh --processes 2 --cpu-devices 2 experiments.multihost_check --config=multihost.py:quick
Lists: `methods` is ';'-separated ('name:arg=value,...'), `samplings` comma-separated; `none` is an absent value.
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "random:ouro:tiny"  # 'random:<family>:<variant>', a bundled model or a checkpoint directory
  c.contraction = ml_collections.FieldReference(0.05, field_type=float)  # 'random:' models only
  c.seed = 0  # model weights (random models), prompts and sampling
  c.mesh = "auto"  # 'auto': (processes, devices per process); or 'DxM' (data x model) over all devices
  c.methods = "ar;chain:d1=1,gamma=2;loopspec:d1=1,d2=2"
  c.samplings = "greedy,sample"  # names from sampling_settings
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.9}}
  c.num_prompts = 3  # an odd count: padded to the data axis
  c.min_prompt_len = 3
  c.max_prompt_len = 9
  c.max_new_tokens = 8
  c.reference = True  # also decode without a mesh on the first local device and require equal tokens
  c.out_dir = "results/multihost"  # process 0 writes multihost.json here
  c.kill_process = config_dict.placeholder(int)  # fault injection: this process SIGKILLs itself ...
  c.kill_after_runs = 0  # ... once this many runs are done (0: before the first); the others must fail, not hang
  if arg == "quick":  # the default test (tests/parallel/test_multihost.py): greedy and sampled LoopSpec, a few tokens
    c.methods = "loopspec:d1=1,d2=2"
    c.max_new_tokens = 4
  elif arg:
    raise ValueError(f"unknown preset {arg!r}")
  return c
