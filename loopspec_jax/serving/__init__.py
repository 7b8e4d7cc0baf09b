"""Serving: continuous batching of AR / chain / LoopSpec requests (`engine`) behind an OpenAI-compatible
HTTP API (`server`, FastAPI + uvicorn)."""

from loopspec_jax.serving.engine import Chunk, Engine, EngineConfig, QueueFullError, Request, RequestError

__all__ = ["Chunk", "Engine", "EngineConfig", "QueueFullError", "Request", "RequestError"]
