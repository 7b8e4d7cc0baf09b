"""Chat templates: a list of {role, content} messages rendered to one prompt string, as HF `transformers` does.

A template is a Jinja string (a checkpoint's chat_template.jinja, the `chat_template` of its
tokenizer_config.json, or a file given to the server). It is rendered in Jinja's immutable sandbox with HF's conventions: `messages`,
`add_generation_prompt=True`, `bos_token` / `eos_token` (the model's, as text) and `raise_exception(msg)`.
A model without a template gets a clear 400 from /v1/chat/completions (protocol.parse_chat), not a guess.
"""

from __future__ import annotations

import json
import os
from typing import Optional


class ChatTemplate:
  """A compiled chat template with the model's bos / eos token text."""

  def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
    from jinja2 import sandbox  # the 'serve' extra; imported only when a template is used

    from jinja2 import meta

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    self.source = source
    self.template = env.from_string(source)
    self.variables = frozenset(meta.find_undeclared_variables(env.parse(source)))  # e.g. 'enable_thinking'
    self.bos_token, self.eos_token = bos_token, eos_token

  def render(self, messages: list, add_generation_prompt: bool = True, **variables) -> str:
    """The prompt text of `messages`; `variables`: further template variables (e.g. enable_thinking=True)."""
    return self.template.render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token,
        eos_token=self.eos_token,
        **variables,
    )


def _raise(message):
  import jinja2

  raise jinja2.TemplateError(message)


def token_text(model, token_id: Optional[int]) -> str:
  """The text of one special token of the model's tokenizer ('' when there is none)."""
  if token_id is None or token_id < 0 or model.tokenizer is None:
    return ""
  return model.tokenizer.id_to_token(int(token_id)) or ""


TEMPLATE_FILE = "chat_template.jinja"  # HF's file name (transformers >= 4.43 saves the template there)


def find_template(model) -> Optional[str]:
  """The chat template a checkpoint directory ships: its chat_template.jinja, else tokenizer_config.json's
  chat_template, else None. The bundled models ship a chat_template.jinja."""
  source = getattr(model, "source", None)
  if source and os.path.isfile(os.path.join(str(source), TEMPLATE_FILE)):
    with open(os.path.join(str(source), TEMPLATE_FILE)) as f:
      return f.read()
  path = os.path.join(str(source), "tokenizer_config.json") if source else ""
  if not path or not os.path.isfile(path):
    return None
  with open(path) as f:
    template = json.load(f).get("chat_template")
  if isinstance(template, list):  # named templates: the default one
    template = next((t.get("template") for t in template if t.get("name") == "default"), None)
  return template if isinstance(template, str) else None


def load(model, path_or_source: Optional[str] = None) -> Optional[ChatTemplate]:
  """The model's chat template: `path_or_source` (a Jinja file, or template text) if given, else the one its
  checkpoint ships, else None."""
  source = path_or_source
  if source and os.path.isfile(source):
    with open(source) as f:
      source = f.read()
  source = source or find_template(model)
  if not source:
    return None
  bos = token_text(model, getattr(model.config, "bos_id", None))
  return ChatTemplate(source, bos, token_text(model, model.config.eos_id))
