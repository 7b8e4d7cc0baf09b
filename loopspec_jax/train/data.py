"""The offline training corpus, its byte-level BPE tokenizer, and reproducible random-window batches.

Sources: tiny-shakespeare minus a held-out tail (the last 5% of characters, kept for evaluation), GSM8K
*train* (question + answer) and the Python standard library source (test directories excluded, capped).
Evaluation sets (GSM8K test, MATH-500, MBPP, HumanEval) are never read here. Tokens are cached as .npy
under a cache dir (default ~/.cache/loopspec_jax), keyed by a hash of the corpus text and tokenizer settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from typing import Optional

import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")  # loopspec_jax/data
EOT = "<|endoftext|>"
HELDOUT_FRACTION = 0.05
SOURCES = ("shakespeare", "gsm8k", "stdlib")
_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "loopspec_jax")


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _shakespeare_split():
  text = _read(os.path.join(DATA_DIR, "tinyshakespeare", "input.txt"))
  cut = int(len(text) * (1.0 - HELDOUT_FRACTION))
  return text[:cut], text[cut:]


def train_shakespeare() -> str:
  """Tiny-shakespeare without its held-out tail."""
  return _shakespeare_split()[0]


def heldout_shakespeare() -> str:
  """The last 5% of tiny-shakespeare's characters: never trained on, used for eval loss and agreement."""
  return _shakespeare_split()[1]


def gsm8k_train_docs() -> list:
  """GSM8K train problems as 'Question: ...\\nAnswer: ...' documents (the test split is never read)."""
  docs = []
  with open(os.path.join(DATA_DIR, "gsm8k", "train.jsonl"), encoding="utf-8") as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        docs.append(f"Question: {row['question']}\nAnswer: {row['answer']}")
  return docs


def stdlib_docs(max_bytes: int) -> list:
  """Python standard library .py files in sorted path order (tests excluded) until `max_bytes` is reached."""
  base = sysconfig.get_paths()["stdlib"]
  paths = []
  for root, dirs, files in os.walk(base):
    dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP_DIRS and not d.startswith("test"))
    paths.extend(os.path.join(root, f) for f in files if f.endswith(".py") and not f.startswith("test_"))
  docs, total = [], 0
  for p in sorted(paths, key=lambda p: os.path.relpath(p, base)):
    try:
      text = _read(p)
    except (UnicodeDecodeError, OSError):
      continue
    if total + len(text) > max_bytes:
      continue
    docs.append(text)
    total += len(text)
  return docs


def corpus_docs(stdlib_max_bytes: int) -> dict:
  """{source: list of documents} in a fixed order."""
  return {"shakespeare": [train_shakespeare()], "gsm8k": gsm8k_train_docs(), "stdlib": stdlib_docs(stdlib_max_bytes)}


def train_tokenizer(docs: dict, vocab_size: int):
  """A byte-level BPE (ByteLevel pre-tokenizer and decoder) with `<|endoftext|>` as token 0."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=[EOT],
      show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  tok.train_from_iterator((d for src in SOURCES for d in docs[src]), trainer=trainer)
  return tok


class Corpus:
  """Token arrays per source (documents joined by EOT) plus the tokenizer; built once, then cached."""

  def __init__(self, tokens: dict, tokenizer, key: str):
    self.tokens = tokens
    self.tokenizer = tokenizer
    self.key = key

  @property
  def eot_id(self) -> int:
    return self.tokenizer.token_to_id(EOT)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self.tokenizer.encode(text).ids, np.int32)


def load_corpus(
    cache_dir: Optional[str] = None, vocab_size: int = 2048, stdlib_max_bytes: int = 4_000_000, verbose: bool = False
) -> Corpus:
  """Tokenizer and tokenized corpus from the cache, building (and caching) them on first use."""
  from tokenizers import Tokenizer

  cache_dir = os.path.expanduser(cache_dir or DEFAULT_CACHE)
  docs = corpus_docs(stdlib_max_bytes)
  h = hashlib.sha256(f"v1|{vocab_size}|{stdlib_max_bytes}".encode())
  for src in SOURCES:
    for d in docs[src]:
      h.update(d.encode("utf-8"))
      h.update(b"\0")
  key = h.hexdigest()[:16]
  d = os.path.join(cache_dir, f"corpus-{key}")
  tok_path, npz_path = os.path.join(d, "tokenizer.json"), os.path.join(d, "tokens.npy")
  if os.path.exists(tok_path) and os.path.exists(npz_path):
    tok = Tokenizer.from_file(tok_path)
    flat = np.load(npz_path)
    with open(os.path.join(d, "offsets.json")) as f:
      offsets = json.load(f)
    tokens = {s: flat[offsets[s][0] : offsets[s][1]] for s in SOURCES}
    return Corpus(tokens, tok, key)
  if verbose:
    print(f"building the corpus cache in {d} ...", flush=True)
  tok = train_tokenizer(docs, vocab_size)
  eot = tok.token_to_id(EOT)
  tokens = {}
  for src in SOURCES:
    parts = []
    for enc in tok.encode_batch(docs[src]):
      parts.append(np.asarray(enc.ids, np.int32))
      parts.append(np.asarray([eot], np.int32))
    tokens[src] = np.concatenate(parts)
  os.makedirs(d, exist_ok=True)
  offsets, start = {}, 0
  for src in SOURCES:
    offsets[src] = (start, start + len(tokens[src]))
    start += len(tokens[src])
  tmp = os.path.join(d, f".tmp-{os.getpid()}")
  np.save(tmp + ".npy", np.concatenate([tokens[s] for s in SOURCES]))
  with open(tmp + ".json", "w") as f:
    json.dump(offsets, f)
  tok.save(tmp + ".tok")
  os.replace(tmp + ".npy", npz_path)
  os.replace(tmp + ".json", os.path.join(d, "offsets.json"))
  os.replace(tmp + ".tok", tok_path)  # last: its presence marks a complete cache
  return Corpus(tokens, tok, key)


def batch_at(corpus: Corpus, step: int, *, seed: int, batch_size: int, seq_len: int, weights: dict) -> np.ndarray:
  """int32 [batch, seq_len + 1] random windows for `step`: the RNG is seeded by (seed, step), so any step's
  batch (and so a resumed run's data order) is reproducible. Each row picks a source by `weights`."""
  rng = np.random.default_rng([int(seed), int(step)])
  names = [s for s in SOURCES if weights.get(s, 0) > 0]
  p = np.asarray([weights[s] for s in names], np.float64)
  srcs = rng.choice(len(names), size=batch_size, p=p / p.sum())
  out = np.empty((batch_size, seq_len + 1), np.int32)
  for i, si in enumerate(srcs):
    arr = corpus.tokens[names[si]]
    start = rng.integers(0, len(arr) - seq_len - 1)
    out[i] = arr[start : start + seq_len + 1]
  return out


def eval_windows(corpus: Corpus, seq_len: int, max_windows: Optional[int] = None) -> np.ndarray:
  """Non-overlapping [n, seq_len + 1] windows of the held-out Shakespeare tail, in order."""
  ids = corpus.encode(heldout_shakespeare())
  n = (len(ids) - 1) // seq_len
  if max_windows is not None:
    n = min(n, max_windows)
  return np.stack([ids[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])
