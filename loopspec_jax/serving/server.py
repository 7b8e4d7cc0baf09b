"""An OpenAI-compatible HTTP API over a serving `Engine` (FastAPI app; uvicorn runs it).

  POST /v1/completions        prompt as text or token ids; `stream: true` answers server-sent events, one
                              event per committed chunk, then `data: [DONE]`
                              (`logprobs` / `echo`: the full-depth model's log-probabilities, scoring.py)
  POST /v1/chat/completions   messages rendered by the model's chat template (a 400 when it has none)
  GET  /v1/models, /v1/models/{id}   the one served model
  GET  /health                liveness: 200 {"status": "ok" | "starting", "ready": bool} once the port is open
  GET  /ready                 readiness: 200 once the engine is compiled (`ready` set), else 503
  GET  /tokenizer_info, POST /tokenize, /detokenize   vLLM's tokenizer routes (lm-eval's remote tokenizer)
  GET  /metrics               Prometheus text (requests running / waiting, tokens/s, mean accepted length,
                              gate-open rate, live lanes)

Errors use OpenAI's body, {"error": {"message", "type", "param", "code"}} (protocol.py), for every status:
400 for bad fields (naming the field), 404 for an unknown model or path, 405, 413 for a body over
`max_body_bytes` (refused from its Content-Length before it is read), 415 for a POST body that is not
`application/json` (a web page can send text/plain or a form to localhost without a CORS preflight; it cannot
send JSON), 429 with Retry-After when the engine's waiting queue is full, 503 with Retry-After before the engine
is ready, 500 `engine_failed` for the requests in flight when the engine loop died (503 for later ones),
500 for a server bug.

Supervision: when the engine's loop raises (`Engine.fail`), every waiting and running request is answered at
once (500, or an error event on a stream), /health and /ready answer 503 with the cause, /metrics'
`loopspec_engine_up` drops to 0, and loopspec-serve exits non-zero (experiments/serve.py) for its supervisor to
restart it.

Nothing slow runs on the event loop: the body's JSON, tokenization (long texts in child processes that hold
only the tokenizer: tokenize.py; /tokenize too) and validation run on the parse pool, scoring forward passes on
their own pool, so neither /health nor a short request waits behind them. A client that disconnects cancels its
request, streamed or not (the non-streamed handler waits on the connection's disconnect message too), which
frees its slot at the engine's next step; one that leaves while sending its body is not an error.
The engine runs on its own thread (`Engine.start`); handlers only submit, await and format.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
import uuid
from typing import Optional

import fastapi
from fastapi import responses
from starlette import exceptions as starlette_exceptions
from starlette import requests as starlette_requests

from loopspec_jax.serving import chat
from loopspec_jax.serving import protocol
from loopspec_jax.serving import scoring
from loopspec_jax.serving import tokenize
from loopspec_jax.serving.engine import Chunk, Engine, EngineFailedError, QueueFullError
from loopspec_jax.serving.protocol import APIError

log = logging.getLogger("loopspec_jax.serving")
RETRY_AFTER_S = 1  # what a 429 / 503 tells the client to wait
PARSE_WORKERS = 4  # threads parsing / tokenizing request bodies (apart from the scoring threads)
SCORE_WORKERS = 2  # threads running logprobs / echo forward passes


def create_app(
    engine: Engine,
    model_name: str,
    *,
    ready: Optional[threading.Event] = None,
    chat_template=None,
    max_body_bytes: int = protocol.DEFAULT_MAX_BODY_BYTES,
) -> fastapi.FastAPI:
  """The FastAPI app serving `engine` under `model_name` (the engine must be `start()`ed to make progress).

  ready: set once the engine is compiled (None: ready now); until then /ready and the completion routes
  answer 503. chat_template: a `chat.ChatTemplate` (None: chat requests get a 400 saying there is none).
  max_body_bytes: larger request bodies get a 413 without being read."""
  app = fastapi.FastAPI(title="loopspec_jax", version="1")
  ctx = _Context(engine, model_name, ready, chat_template, max_body_bytes)
  app.state.encoder = ctx.encoder  # the text encoder (its tokenizer processes: tests kill one)
  _add_error_handlers(app)
  _add_info_routes(app, ctx)
  _add_tokenizer_routes(app, ctx)

  @app.post("/v1/completions")
  async def completions(request: fastapi.Request):
    return await ctx.serve(request, protocol.parse_completion, _CompletionFormat)

  @app.post("/v1/chat/completions")
  async def chat_completions(request: fastapi.Request):
    parse = lambda body, eng, name, encoder: protocol.parse_chat(body, eng, name, ctx.chat_template, encoder)
    return await ctx.serve(request, parse, _ChatFormat)

  return app


def _json_error(exc: APIError) -> responses.JSONResponse:
  return responses.JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _add_error_handlers(app: fastapi.FastAPI) -> None:
  """OpenAI-style bodies for our refusals, for FastAPI's own 404 / 405, and for any bug (500, logged)."""

  @app.exception_handler(APIError)
  async def _api_error(_, exc: APIError):
    return _json_error(exc)

  @app.exception_handler(starlette_exceptions.HTTPException)
  async def _http_error(request, exc):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = {
        404: f"no route {request.url.path}",
        405: f"method {request.method} is not allowed on {request.url.path}",
    }
    err = APIError(exc.status_code, message.get(exc.status_code, str(exc.detail)), kind=kind)
    err.headers = dict(getattr(exc, "headers", None) or {})
    return _json_error(err)

  @app.exception_handler(starlette_requests.ClientDisconnect)
  async def _gone(request, _):
    log.info("client left while sending its body to %s", request.url.path)
    return responses.Response(status_code=499)  # nobody reads it

  @app.exception_handler(Exception)
  async def _bug(_, exc):
    log.exception("internal error")
    return _json_error(APIError(500, f"internal server error ({type(exc).__name__})", kind="server_error"))


def _add_info_routes(app: fastapi.FastAPI, ctx: "_Context") -> None:
  created = int(time.time())
  card = {"id": ctx.model_name, "object": "model", "created": created, "owned_by": "loopspec_jax"}

  @app.get("/health")
  async def health():
    ok, failure = ctx.is_ready(), ctx.engine.failure
    body = {
        "status": "failed" if failure else "ok" if ok else "starting",
        "ready": ok and not failure,
        "model": ctx.model_name,
        "method": ctx.engine.method.name,
    }
    if failure:
      return responses.JSONResponse(dict(body, error=failure), status_code=503)
    return body

  @app.get("/ready")
  async def ready():
    ctx.check_ready()
    return {"status": "ready", "model": ctx.model_name}

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [card]}

  @app.get("/v1/models/{model_id:path}")
  async def model(model_id: str):
    if model_id != ctx.model_name:
      raise APIError(404, f"model {model_id!r} does not exist", "model", code="model_not_found")
    return card

  @app.get("/metrics")
  async def metrics():
    return responses.PlainTextResponse(ctx.engine.prometheus(), media_type="text/plain; version=0.0.4")


def _add_tokenizer_routes(app: fastapi.FastAPI, ctx: "_Context") -> None:
  """vLLM's /tokenizer_info, /tokenize and /detokenize: what lm-eval's `local-completions` uses as its
  'remote' tokenizer, so it needs no local copy of the model's tokenizer."""

  def tokenizer():
    tok = ctx.engine.model.tokenizer
    if tok is None:
      raise APIError(400, "this model has no tokenizer", code="no_tokenizer")
    return tok

  @app.get("/tokenizer_info")
  async def tokenizer_info():
    tokenizer()
    model, template = ctx.engine.model, ctx.chat_template
    return {
        "eos_token": chat.token_text(model, model.config.eos_id) or None,
        "bos_token": chat.token_text(model, getattr(model.config, "bos_id", None)) or None,
        "pad_token": None,
        "chat_template": None if template is None else template.source,
        "model_max_length": ctx.engine.total,
    }

  def tokenize_body(raw: bytes) -> responses.Response:
    body = protocol.loads(raw)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
      raise APIError(400, "prompt must be a string", "prompt")
    special = bool(body.get("add_special_tokens", True))
    text = protocol.check_text(body["prompt"], "prompt")
    tokenizer()
    ids = ctx.encoder.encode(text, add_special_tokens=special)  # long texts in the tokenizer's child process
    body = {"tokens": ids, "count": len(ids), "max_model_len": ctx.engine.total}
    return responses.Response(json.dumps(body), media_type="application/json")  # rendered here, not on the loop

  @app.post("/tokenize")
  async def tokenize_route(request: fastapi.Request):
    return await ctx.parse(tokenize_body, await ctx.read_body(request))

  @app.post("/detokenize")
  async def detokenize_route(request: fastapi.Request):
    body = await ctx.parse(protocol.loads, await ctx.read_body(request))
    ids = body.get("tokens") if isinstance(body, dict) else None
    vocab = ctx.engine.cfg.vocab_size
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
    ):
      raise APIError(400, f"tokens must be a list of token ids in [0, {vocab})", "tokens")
    return {"prompt": tokenizer().decode(ids)}


class _Context:
  """What the completion handlers share: the engine, the served name, readiness and limits."""

  def __init__(self, engine, model_name, ready, chat_template, max_body_bytes):
    self.engine, self.model_name, self.ready = engine, model_name, ready
    self.chat_template, self.max_body_bytes = chat_template, int(max_body_bytes)
    tok = engine.model.tokenizer
    self.encoder = None if tok is None else tokenize.TextEncoder(tok)
    self.parse_pool = concurrent.futures.ThreadPoolExecutor(PARSE_WORKERS, thread_name_prefix="loopspec-parse")
    self.score_pool = concurrent.futures.ThreadPoolExecutor(SCORE_WORKERS, thread_name_prefix="loopspec-score")

  async def parse(self, fn, *args):
    """fn(*args) on the parse pool (JSON, tokenization, validation: never on the event loop)."""
    return await asyncio.get_running_loop().run_in_executor(self.parse_pool, fn, *args)

  async def score(self, fn, *args):
    """fn(*args) on the scoring pool (forward passes for logprobs / echo), apart from request parsing."""
    return await asyncio.get_running_loop().run_in_executor(self.score_pool, fn, *args)

  def is_ready(self) -> bool:
    return self.ready is None or self.ready.is_set()

  def check_ready(self) -> None:
    if self.engine.failure is not None:
      raise engine_failed(self.engine.failure, 503)
    if not self.is_ready():
      raise APIError(
          503,
          "the engine is still compiling; retry shortly",
          kind="server_error",
          code="not_ready",
          headers={"Retry-After": str(RETRY_AFTER_S)},
      )

  async def read_body(self, request: fastapi.Request) -> bytes:
    """The body, refused with 415 unless it is JSON, with 413 from its Content-Length (or as soon as a chunked
    body passes the limit)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
      raise APIError(
          415,
          f"the request body must be JSON (Content-Type: application/json), got {kind or 'no Content-Type'!r}",
          code="unsupported_media_type",
      )
    limit = self.max_body_bytes
    too_big = APIError(413, f"the request body exceeds the limit of {limit} bytes", code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
      raise too_big
    parts, size = [], 0
    async for part in request.stream():
      size += len(part)
      if size > limit:
        raise too_big
      parts.append(part)
    return b"".join(parts)

  async def serve(self, request: fastapi.Request, parse, fmt_cls):
    """Reads, parses (on a worker thread), submits, then streams or answers once."""
    self.check_ready()
    raw = await self.read_body(request)
    parse_all = lambda: parse(protocol.loads(raw), self.engine, self.model_name, self.encoder)
    parsed: protocol.Parsed = await self.parse(parse_all)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    on_chunk = lambda seq, chunk: loop.call_soon_threadsafe(queue.put_nowait, chunk)
    if parsed.score_only:
      return await self.score(fmt_cls(self.model_name, len(parsed.request.prompt)).scored, self, parsed)
    try:
      seq = self.engine.submit(parsed.request, on_chunk=on_chunk)
    except QueueFullError as e:
      headers = {"Retry-After": str(RETRY_AFTER_S)}
      raise APIError(429, str(e), kind="rate_limit_exceeded", code="queue_full", headers=headers) from None
    except EngineFailedError:
      raise engine_failed(self.engine.failure, 503) from None
    fmt = fmt_cls(self.model_name, len(parsed.request.prompt))
    if not parsed.stream:
      out = await self._answer(request, seq, queue, fmt)
      if isinstance(out, dict) and (parsed.echo or parsed.logprobs is not None):
        await self.score(fmt.add_logprobs, out, self, parsed, seq)
      return out
    events = self._events(request, seq, queue, fmt, parsed.include_usage)
    return responses.StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

  async def _answer(self, request, seq, queue, fmt):
    """The non-streamed answer; a client that disconnects first cancels the request (its slot is freed at
    the engine's next step: the connection's http.disconnect message wakes this handler at once)."""
    disconnect = asyncio.ensure_future(_wait_disconnect(request))
    try:
      while True:
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait({getter, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
          getter.cancel()
          self.engine.cancel(seq)
          return responses.Response(status_code=499)  # nobody reads it
        chunk: Chunk = getter.result()
        if chunk.finish_reason == "error":
          raise engine_failed(self.engine.failure, 500)
        if chunk.finished:
          break
    except asyncio.CancelledError:
      self.engine.cancel(seq)
      raise
    finally:
      disconnect.cancel()
    return fmt.whole(seq, protocol.finish_reason(chunk.finish_reason))

  async def _events(self, request, seq, queue, fmt, include_usage: bool):
    """Server-sent events: one per chunk with text or tokens, the usage chunk if asked, then [DONE]."""
    try:
      while True:
        try:
          chunk = await asyncio.wait_for(queue.get(), timeout=0.25)
        except asyncio.TimeoutError:  # also notices a client that leaves while its request still waits
          if await request.is_disconnected():
            return
          continue
        if chunk.finish_reason == "error":  # the status line is sent: an error event ends the stream
          yield _sse(engine_failed(self.engine.failure, 500).body())
          return
        if chunk.tokens or chunk.text or chunk.finished:
          reason = protocol.finish_reason(chunk.finish_reason) if chunk.finished else None
          yield _sse(fmt.piece(chunk.text, chunk.tokens, reason))
        if chunk.finished:
          break
      if include_usage:
        yield _sse(fmt.usage_chunk(seq))
      yield "data: [DONE]\n\n"
    finally:
      if not seq.finished:
        self.engine.cancel(seq)  # the client went away: free the slot


def engine_failed(failure: Optional[str], status: int) -> APIError:
  """The error of a request the failed engine could not serve (500 in flight, 503 after)."""
  return APIError(
      status,
      f"the engine failed ({failure}); this server must be restarted",
      kind="server_error",
      code="engine_failed",
  )


async def _wait_disconnect(request: fastapi.Request) -> None:
  """Returns when the client disconnects (the body has been read: the next ASGI message is the disconnect)."""
  while (await request.receive())["type"] != "http.disconnect":
    pass


def _sse(data: dict) -> str:
  return f"data: {json.dumps(data)}\n\n"


class _CompletionFormat:
  """Response bodies of /v1/completions ('text_completion' objects)."""

  object = "text_completion"

  def __init__(self, model_name: str, prompt_tokens: int):
    self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    self.model_name, self.prompt_tokens = model_name, prompt_tokens

  def envelope(self, choices: list) -> dict:
    return {"id": self.id, "object": self.object, "created": self.created, "model": self.model_name, "choices": choices}

  def choice(self, text: str, tokens: list, reason: Optional[str]) -> dict:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": reason, "token_ids": tokens}

  def piece(self, text: str, tokens: list, reason: Optional[str]) -> dict:
    return self.envelope([self.choice(text, tokens, reason)])

  def whole(self, seq, reason: Optional[str]) -> dict:
    out = self.envelope([self.choice(seq.text, list(seq.tokens), reason)])
    out["usage"] = protocol.usage(self.prompt_tokens, len(seq.tokens))
    return out

  def usage_chunk(self, seq) -> dict:
    out = self.envelope([])
    out["usage"] = protocol.usage(self.prompt_tokens, len(seq.tokens))
    return out

  def add_logprobs(self, out: dict, ctx: "_Context", parsed, seq) -> None:
    """`logprobs` (and, with echo, the prompt's text first) into a finished answer (`seq`: the finished request,
    None when scoring the prompt only); runs a forward pass."""
    model, prompt, choice = ctx.engine.model, list(parsed.request.prompt), out["choices"][0]
    text_of = model.decode if model.tokenizer is not None else (lambda ids: "")
    completion = [] if seq is None else list(seq.tokens)
    if parsed.logprobs is not None:
      cut = None if seq is None or model.tokenizer is None else len(seq.text)
      choice["logprobs"] = scoring.completion_logprobs(model, prompt, completion, parsed.logprobs, parsed.echo, cut)
    if parsed.echo:
      choice["text"] = text_of(prompt) + choice["text"]
      choice["token_ids"] = prompt + choice["token_ids"]

  def scored(self, ctx: "_Context", parsed) -> dict:
    """echo with max_tokens=0: the prompt scored, nothing generated."""
    out = self.envelope([self.choice("", [], "length")])
    out["usage"] = protocol.usage(self.prompt_tokens, 0)
    self.add_logprobs(out, ctx, parsed, None)
    return out


class _ChatFormat(_CompletionFormat):
  """Response bodies of /v1/chat/completions ('chat.completion' and 'chat.completion.chunk' objects)."""

  object = "chat.completion"

  def __init__(self, model_name: str, prompt_tokens: int):
    super().__init__(model_name, prompt_tokens)
    self.id, self.started = f"chatcmpl-{uuid.uuid4().hex}", False

  def piece(self, text: str, tokens: list, reason: Optional[str]) -> dict:
    delta = {"content": text} if text or reason is None else {}
    if not self.started:
      delta, self.started = {"role": "assistant", **delta}, True
    out = self.envelope([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}])
    out["object"] = "chat.completion.chunk"
    return out

  def whole(self, seq, reason: Optional[str]) -> dict:
    message = {"role": "assistant", "content": seq.text}
    out = self.envelope([{"index": 0, "message": message, "logprobs": None, "finish_reason": reason}])
    out["usage"] = protocol.usage(self.prompt_tokens, len(seq.tokens))
    return out

  def usage_chunk(self, seq) -> dict:
    out = super().usage_chunk(seq)
    out["object"] = "chat.completion.chunk"
    return out
