"""An OpenAI-compatible HTTP API over a serving `Engine` (FastAPI app; uvicorn runs it).

  POST /v1/completions   prompt as text or token ids; `stream: true` answers server-sent events, one event
                         per committed chunk, then `data: [DONE]`
  GET  /v1/models        the one served model
  GET  /health           {"status": "ok"} once the engine is ready
  GET  /metrics          Prometheus text (requests running / waiting, tokens/s, mean accepted length, gate-open
                         rate, live lanes)

Errors use OpenAI's body, {"error": {"message", "type", "param", "code"}}: 400 for bad fields (naming the field),
404 for an unknown model, 429 when the engine's waiting queue is full. A streaming client that disconnects
cancels its request, which frees its slot at the engine's next step; the other requests continue.
The engine runs on its own thread (`Engine.start`); handlers only submit, await and format.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Optional

import fastapi
from fastapi import responses

from loopspec_jax.serving.engine import Chunk, Engine, QueueFullError, Request, RequestError

# Request fields we accept; the OpenAI fields we do not implement are refused unless left at their default.
_UNSUPPORTED_DEFAULTS = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "suffix": None}
_IGNORED = {
    "model",
    "prompt",
    "stream",
    "stream_options",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
}
_FIELDS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}


class APIError(Exception):

  def __init__(
      self,
      status: int,
      message: str,
      param: Optional[str] = None,
      kind: str = "invalid_request_error",
      code: Optional[str] = None,
  ):
    super().__init__(message)
    self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

  def response(self) -> responses.JSONResponse:
    body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
    return responses.JSONResponse(body, status_code=self.status)


def parse_completion(body, engine: Engine, model_name: str) -> tuple:
  """(Request, stream) from a /v1/completions JSON body; raises APIError naming the offending field."""
  if not isinstance(body, dict):
    raise APIError(400, "the request body must be a JSON object")
  if body.get("model") != model_name:
    raise APIError(
        404,
        f"model {body.get('model')!r} does not exist; this server serves {model_name!r}",
        "model",
        code="model_not_found",
    )
  for name, default in _UNSUPPORTED_DEFAULTS.items():
    if body.get(name, default) not in (default, None):
      raise APIError(400, f"{name}={body[name]!r} is not supported (only {default!r})", name)
  unknown = sorted(set(body) - _FIELDS - _IGNORED - set(_UNSUPPORTED_DEFAULTS))
  if unknown:
    raise APIError(400, f"unknown field {unknown[0]!r}", unknown[0])
  stream = body.get("stream", False)
  if not isinstance(stream, bool):
    raise APIError(400, f"stream must be a boolean, got {stream!r}", "stream")
  if "prompt" not in body:
    raise APIError(400, "prompt is required", "prompt")
  prompt = body["prompt"]
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
    prompt = prompt[0]  # a batch of one prompt
  if isinstance(prompt, str):
    if engine.model.tokenizer is None:
      raise APIError(400, "this model has no tokenizer: give the prompt as token ids", "prompt")
    ids = engine.model.encode(prompt)
  elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
    ids = prompt
  else:
    raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt")
  kw = {k: body[k] for k in _FIELDS if body.get(k) is not None}
  kw.setdefault("temperature", 0.0 if engine.config.greedy_only else 1.0)  # OpenAI's default, greedy-only: 0
  if "top_k" in kw and kw["top_k"] == -1:  # vLLM's spelling of 'no top-k'
    kw["top_k"] = 0
  if isinstance(kw.get("temperature"), int) and not isinstance(kw.get("temperature"), bool):
    kw["temperature"] = float(kw["temperature"])
  if isinstance(kw.get("top_p"), int) and not isinstance(kw.get("top_p"), bool):
    kw["top_p"] = float(kw["top_p"])
  try:
    req = engine.validate(Request(prompt=ids, **kw))
  except RequestError as e:
    raise APIError(400, str(e), e.param) from None
  return req, stream


def create_app(engine: Engine, model_name: str) -> fastapi.FastAPI:
  """The FastAPI app serving `engine` under `model_name` (the engine must be `start()`ed to make progress)."""
  app = fastapi.FastAPI(title="loopspec_jax", version="1")
  created = int(time.time())

  @app.exception_handler(APIError)
  async def _api_error(_, exc: APIError):
    return exc.response()

  @app.get("/health")
  async def health():
    return {"status": "ok", "model": model_name, "method": engine.config.method}

  @app.get("/v1/models")
  async def models():
    card = {"id": model_name, "object": "model", "created": created, "owned_by": "loopspec_jax"}
    return {"object": "list", "data": [card]}

  @app.get("/metrics")
  async def metrics():
    return responses.PlainTextResponse(engine.prometheus(), media_type="text/plain; version=0.0.4")

  @app.post("/v1/completions")
  async def completions(request: fastapi.Request):
    raw = await request.body()
    try:
      body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise APIError(400, f"the request body is not valid JSON: {e}") from None
    req, stream = parse_completion(body, engine, model_name)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    on_chunk = lambda seq, chunk: loop.call_soon_threadsafe(queue.put_nowait, chunk)
    try:
      seq = engine.submit(req, on_chunk=on_chunk)
    except QueueFullError as e:
      raise APIError(429, str(e), kind="rate_limit_exceeded", code="queue_full") from None
    cid = f"cmpl-{uuid.uuid4().hex}"
    now = int(time.time())
    choice = lambda text, tokens, reason: {
        "text": text,
        "index": 0,
        "logprobs": None,
        "finish_reason": reason,
        "token_ids": tokens,
    }
    envelope = lambda choices: {
        "id": cid,
        "object": "text_completion",
        "created": now,
        "model": model_name,
        "choices": choices,
    }
    usage = lambda: {
        "prompt_tokens": len(req.prompt),
        "completion_tokens": len(seq.tokens),
        "total_tokens": len(req.prompt) + len(seq.tokens),
    }

    if not stream:
      try:
        while True:
          chunk: Chunk = await queue.get()
          if chunk.finished:
            break
      except asyncio.CancelledError:
        engine.cancel(seq)
        raise
      out = envelope([choice(seq.text, list(seq.tokens), _reason(chunk.finish_reason))])
      out["usage"] = usage()
      return out

    async def events():
      try:
        while True:
          try:
            chunk = await asyncio.wait_for(queue.get(), timeout=0.25)
          except asyncio.TimeoutError:  # also notices a client that leaves while its request still waits
            if await request.is_disconnected():
              return
            continue
          if chunk.tokens or chunk.text or chunk.finished:
            data = envelope(
                [choice(chunk.text, chunk.tokens, _reason(chunk.finish_reason) if chunk.finished else None)]
            )
            if chunk.finished:
              data["usage"] = usage()
            yield f"data: {json.dumps(data)}\n\n"
          if chunk.finished:
            break
        yield "data: [DONE]\n\n"
      finally:
        if not seq.finished:
          engine.cancel(seq)  # the client went away: free the slot

    return responses.StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

  return app


def _reason(reason: Optional[str]) -> Optional[str]:
  return "stop" if reason in ("stop", "cancelled") else reason
