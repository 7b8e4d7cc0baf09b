"""OpenAI's wire format for the server: request bodies parsed into engine `Request`s, errors, response bodies.

Everything here is plain Python (no FastAPI), so the HTTP layer (`server.py`) only reads bytes, calls these
off the event loop and formats. Every refusal is an `APIError` that renders OpenAI's error body
{"error": {"message", "type", "param", "code"}} and names the offending field.

Fields: /v1/completions takes model, prompt (text, token ids, or a batch of one), max_tokens, temperature,
top_p, top_k (an extension; -1 or 0: off), seed, stop (a string or up to `engine.MAX_STOPS` strings), stream,
stream_options.include_usage, user; /v1/chat/completions takes messages instead of prompt (rendered by the
model's chat template, `chat.py`; roles system / developer / user / assistant / tool / function; content a
string, null, or a list of text parts) and max_completion_tokens as max_tokens (default: the rest of the
context, as OpenAI's; completions' default is 16). Completions also take `logprobs`
(0..MAX_LOGPROBS alternatives) and `echo` (not streamed; `max_tokens: 0` with echo scores the prompt only):
the full-depth model's log-probabilities, `scoring.py`. Refused unless left at their
defaults (400 naming the field): n, best_of, suffix, chat's logprobs, and the penalties presence_penalty,
frequency_penalty and logit_bias, which would change the target distribution every speculative method verifies
against; they are not implemented, and accepting them while ignoring them would be silently wrong.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from loopspec_jax.serving.engine import Engine, Request, RequestError

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024  # refused with 413 before it is read; see server.create_app

# field: its only accepted value(s) (None, absent and these pass)
_UNSUPPORTED = {
    "n": (1,),
    "best_of": (1,),
    "suffix": ("",),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
}
_SAMPLING = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}
_COMMON = {"model", "stream", "stream_options", "user"} | _SAMPLING | set(_UNSUPPORTED)
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
_CHAT_UNSUPPORTED = {"logprobs": (False,), "top_logprobs": (0,)}
MAX_LOGPROBS = 20  # top alternatives per position


class APIError(Exception):
  """A refusal with OpenAI's error body; `headers` go with the response (Retry-After on 429 and 503)."""

  def __init__(
      self,
      status: int,
      message: str,
      param: Optional[str] = None,
      kind: str = "invalid_request_error",
      code: Optional[str] = None,
      headers: Optional[dict] = None,
  ):
    message, param = _printable(message), None if param is None else _printable(param)
    super().__init__(message)
    self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
    self.headers = headers or {}

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class Parsed:
  """A parsed request: the engine request, whether to stream, and whether a stream ends with a usage chunk."""

  request: Request
  stream: bool
  include_usage: bool
  logprobs: Optional[int] = None  # completions: alternatives per position (0: only the chosen tokens')
  echo: bool = False  # completions: the prompt's text (and logprobs) first
  score_only: bool = False  # echo with max_tokens=0: score the prompt, generate nothing


def _printable(text: str) -> str:
  """`text` with lone surrogates (valid in JSON, not in UTF-8) escaped, so an error body naming them encodes."""
  return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def loads(raw: bytes):
  """The JSON body; malformed, non-UTF-8, too deeply nested JSON or an integer past Python's digit limit is a
  400 (never a 500)."""
  try:
    return json.loads(raw)
  except RecursionError:
    raise APIError(400, "the request body is nested too deeply") from None
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
    raise APIError(400, f"the request body is not valid JSON: {e}") from None


def check_text(value: str, param: str) -> str:
  """A string field that must be valid Unicode text (a lone surrogate such as "\\ud800" is refused)."""
  try:
    value.encode("utf-8")
  except UnicodeEncodeError as e:
    raise APIError(400, f"{param} is not valid Unicode text ({e.reason} at index {e.start})", param) from None
  return value


def check_common(body, model_name: str, fields: set, unsupported: dict = _UNSUPPORTED) -> None:
  """Body shape, model, unknown and unsupported fields (shared by completions and chat)."""
  if not isinstance(body, dict):
    raise APIError(400, "the request body must be a JSON object")
  if body.get("model") is None:
    raise APIError(400, f"model is required (this server serves {model_name!r})", "model")
  if body["model"] != model_name:
    raise APIError(
        404,
        f"model {body['model']!r} does not exist; this server serves {model_name!r}",
        "model",
        code="model_not_found",
    )
  unknown = sorted(set(body) - fields)
  if unknown:
    raise APIError(400, f"unknown field {unknown[0]!r}", unknown[0])
  for name, allowed in unsupported.items():
    value = body.get(name)
    if value is not None and (value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool)):
      raise APIError(400, f"{name}={value!r} is not supported (only {allowed[0]!r})", name)


def stream_flags(body) -> tuple:
  """(stream, include_usage) from `stream` and `stream_options`."""
  stream = body.get("stream", False)
  if stream is None:
    stream = False
  if not isinstance(stream, bool):
    raise APIError(400, f"stream must be a boolean, got {stream!r}", "stream")
  opts = body.get("stream_options")
  if opts is None:
    return stream, False
  if not stream:
    raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
  if (
      not isinstance(opts, dict)
      or set(opts) - {"include_usage"}
      or not isinstance(opts.get("include_usage", False), bool)
  ):
    raise APIError(400, f"stream_options must be {{'include_usage': bool}}, got {opts!r}", "stream_options")
  return stream, opts.get("include_usage", False)


def encode(engine: Engine, text: str, encoder=None, param: str = "prompt") -> list:
  """Token ids of a text prompt (`encoder`: a tokenize.TextEncoder, which keeps long texts off this process's
  GIL; None: the model's tokenizer on this thread). A text that cannot fit the context is refused before it
  is tokenized (the encoder's character bound)."""
  if engine.model.tokenizer is None:
    raise APIError(400, "this model has no tokenizer: give the prompt as token ids", param)
  if encoder is None:
    return engine.model.encode(text)
  limit = encoder.max_chars(engine.total)
  if limit is not None and len(text) > limit:
    raise APIError(
        400,
        f"the {param} has {len(text)} characters: more tokens than the context of {engine.total} positions "
        f"(a token spans at most {encoder.max_token_chars} characters)",
        param,
    )
  return encoder.encode(text)


def sampling_request(body, engine: Engine, ids: list, score_only: bool = False) -> Request:
  """The engine request for prompt `ids` and the body's sampling fields, validated (400 naming the field;
  `score_only`: the prompt alone must fit the context)."""
  kw = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
  kw.setdefault("temperature", 0.0 if engine.config.greedy_only else 1.0)  # OpenAI's default, greedy-only: 0
  if kw.get("top_k") == -1:  # vLLM's spelling of 'no top-k'
    kw["top_k"] = 0
  for name in ("temperature", "top_p"):
    if isinstance(kw.get(name), int) and not isinstance(kw.get(name), bool):
      kw[name] = float(kw[name])
  stop = kw.get("stop")
  for i, s in enumerate([stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []):
    if isinstance(s, str):
      check_text(s, "stop")
  try:
    return engine.validate(Request(prompt=ids, **kw), score_only=score_only)
  except RequestError as e:
    raise APIError(400, str(e), e.param) from None


def parse_completion(body, engine: Engine, model_name: str, encoder=None) -> Parsed:
  """A /v1/completions body -> Parsed; raises APIError naming the offending field. Tokenizes: call it off
  the event loop."""
  check_common(body, model_name, COMPLETION_FIELDS)
  stream, include_usage = stream_flags(body)
  if "prompt" not in body:
    raise APIError(400, "prompt is required", "prompt")
  prompt = body["prompt"]
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
    prompt = prompt[0]  # a batch of one prompt
  if isinstance(prompt, str):
    ids = encode(engine, check_text(prompt, "prompt"), encoder)
  elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
    ids = prompt
  else:
    raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt")
  logprobs, echo = body.get("logprobs"), body.get("echo") or False
  if logprobs is not None and (
      isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS
  ):
    raise APIError(400, f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {logprobs!r}", "logprobs")
  if not isinstance(echo, bool):
    raise APIError(400, f"echo must be a boolean, got {echo!r}", "echo")
  if stream and (echo or logprobs is not None):
    raise APIError(
        400,
        "logprobs and echo are not supported on streamed completions",
        "logprobs" if logprobs is not None else "echo",
    )
  score_only = echo and body.get("max_tokens") == 0  # score the prompt only (lm-eval's loglikelihood can ask so)
  req = sampling_request(dict(body, max_tokens=1) if score_only else body, engine, ids, score_only)
  return Parsed(req, stream, include_usage, logprobs, echo, score_only)


def parse_chat(body, engine: Engine, model_name: str, template, encoder=None) -> Parsed:
  """A /v1/chat/completions body -> Parsed: the messages rendered by `template` (chat.ChatTemplate, or None:
  a 400 saying the model has none), then tokenized as a completion prompt."""
  check_common(body, model_name, CHAT_FIELDS, dict(_UNSUPPORTED, **_CHAT_UNSUPPORTED))
  stream, include_usage = stream_flags(body)
  if template is None:
    raise APIError(
        400,
        f"model {model_name!r} has no chat template: use /v1/completions, or start the server with a template "
        "(--config.chat_template=PATH of a Jinja file)",
        "messages",
        code="no_chat_template",
    )
  messages = chat_messages(body.get("messages"))
  if body.get("max_completion_tokens") is not None:
    if body.get("max_tokens") is not None:
      raise APIError(400, "give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    body = dict(body, max_tokens=body["max_completion_tokens"])
  try:
    prompt = template.render(messages)
  except Exception as e:  # the template's raise_exception, or a template error
    raise APIError(400, f"the chat template refused the messages: {e}", "messages") from None
  ids = encode(engine, prompt, encoder, "messages")
  if body.get("max_tokens") is None:  # OpenAI's default: as many as the context holds
    body = dict(body, max_tokens=max(engine.total - len(ids), 1))
  return Parsed(sampling_request(body, engine, ids), stream, include_usage)


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def chat_messages(messages) -> list:
  """The messages as the template sees them: roles checked, content a string (null on an assistant turn: '', a
  list of text parts: their text joined); other keys (name, tool_calls, tool_call_id) kept. 400 naming
  `messages` otherwise."""
  if not isinstance(messages, list) or not messages:
    raise APIError(400, "messages must be a non-empty list of {role, content} objects", "messages")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
      role = m.get("role") if isinstance(m, dict) else None
      raise APIError(400, f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}", "messages")
    content = m.get("content")
    if isinstance(content, list):
      if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        raise APIError(400, f"messages[{i}].content parts must be {{'type': 'text', 'text': str}}", "messages")
      content = "".join(p["text"] for p in content)
    elif content is None and m["role"] == "assistant":  # an assistant turn that only called tools
      content = ""
    elif not isinstance(content, str):
      raise APIError(400, f"messages[{i}].content must be a string, null or a list of text parts", "messages")
    out.append(dict(m, content=check_text(content, "messages")))
  return out


def finish_reason(reason: Optional[str]) -> Optional[str]:
  return "stop" if reason in ("stop", "cancelled") else reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  return {
      "prompt_tokens": prompt_tokens,
      "completion_tokens": completion_tokens,
      "total_tokens": prompt_tokens + completion_tokens,
  }
