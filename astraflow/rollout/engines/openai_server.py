"""Serve any :class:`Engine` as an OpenAI-compatible endpoint (``/v1/completions``, chat, models).

Why: a frozen policy (an opponent, a judge) trained here can be served to other runs, tools and the
``openai`` engine without vLLM. The completions route takes a text prompt or a list of token ids and,
like vLLM, returns the generated token ids when asked (``return_token_ids``) and per-token log-probs
(``logprobs``), so token-in/token-out clients lose nothing. Every route except ``GET /healthz`` and
``GET /health`` needs ``Authorization: Bearer <api_key>``.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from astraflow.rollout.engines.base import Engine, Generation, SamplingParams


class _Body(BaseModel):
    # Clients send many OpenAI fields we do not use (user, presence_penalty=0, ...): accept them.
    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = Field(1, ge=1, le=256)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False


class CompletionRequest(_Body):
    prompt: str | list[int] = Field(..., description="text, or a list of token ids")
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False


def _params(body: _Body, max_tokens: int) -> SamplingParams:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return SamplingParams(
        n=body.n,
        temperature=body.temperature,
        top_p=body.top_p,
        max_tokens=max_tokens,
        stop=tuple(stop),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
    )


def _text(tokenizer: Any, gen: Generation, stops: tuple[str, ...]) -> str:
    """The completion's text as OpenAI returns it: special tokens dropped, cut before a stop string."""
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    cuts = [text.find(s) for s in stops if s and s in text]
    return text[: min(cuts)] if cuts else text


def create_app(
    engine: Engine,
    model_name: str,
    api_key: str,
    endpoints: tuple[str, ...] = ("completions", "chat"),
) -> FastAPI:
    """A FastAPI app serving ``engine`` under ``model_name``; ``endpoints`` picks the routes."""
    if not api_key:
        raise ValueError("api_key is required: every route but /healthz needs a bearer token")
    unknown = set(endpoints) - {"completions", "chat"}
    if unknown:
        raise ValueError(f"unknown endpoints {sorted(unknown)}; expected 'completions' or 'chat'")
    app = FastAPI(title=f"AstraFlow OpenAI-compatible server ({model_name})")
    tokenizer = engine.tokenizer

    def authorize(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise HTTPException(401, "missing or wrong 'Authorization: Bearer <api key>' header")

    def check_model(name: str) -> None:
        if name != model_name:
            raise HTTPException(
                404, f"model {name!r} is not served here; this server has {model_name!r}"
            )

    async def run(prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        try:
            return await engine.generate(prompt_ids, params)
        except (ValueError, TypeError) as exc:
            raise HTTPException(400, str(exc)) from exc

    @app.get("/healthz")
    @app.get("/health")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "owned_by": "astraflow"}],
        }

    if "completions" in endpoints:

        @app.post("/v1/completions", dependencies=[Depends(authorize)])
        async def completions(body: CompletionRequest) -> dict[str, Any]:
            check_model(body.model)
            if isinstance(body.prompt, str):
                prompt_ids = tokenizer.encode(body.prompt)
            else:
                prompt_ids = list(body.prompt)
            params = _params(body, body.max_tokens)
            gens = await run(prompt_ids, params)
            choices = []
            for i, gen in enumerate(gens):
                choice: dict[str, Any] = {
                    "index": i,
                    "text": _text(tokenizer, gen, params.stop),
                    "finish_reason": gen.finish_reason,
                    "stop_reason": gen.meta.get("stop"),
                    "logprobs": None,
                }
                if body.logprobs is not None:
                    pieces = [tokenizer.decode([t]) for t in gen.token_ids]
                    offsets, pos = [], 0
                    for piece in pieces:
                        offsets.append(pos)
                        pos += len(piece)
                    choice["logprobs"] = {
                        "tokens": pieces,
                        "token_logprobs": gen.logprobs,
                        "top_logprobs": None,
                        "text_offset": offsets,
                    }
                if body.return_token_ids:
                    choice["token_ids"] = gen.token_ids
                    choice["prompt_token_ids"] = prompt_ids
                choices.append(choice)
            return _envelope("text_completion", model_name, choices, prompt_ids, gens)

    if "chat" in endpoints:

        @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
        async def chat(body: ChatRequest) -> dict[str, Any]:
            check_model(body.model)
            messages = [m.model_dump() for m in body.messages]
            try:
                prompt_ids = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True
                )
            except Exception as exc:  # noqa: BLE001 - template errors are the client's
                raise HTTPException(
                    400, f"cannot render messages with the chat template: {exc}"
                ) from exc
            if hasattr(prompt_ids, "keys"):
                prompt_ids = prompt_ids["input_ids"]
            max_tokens = body.max_completion_tokens or body.max_tokens or 256
            params = _params(body, max_tokens)
            gens = await run(list(prompt_ids), params)
            choices = []
            for i, gen in enumerate(gens):
                choice: dict[str, Any] = {
                    "index": i,
                    "message": {"role": "assistant", "content": _text(tokenizer, gen, params.stop)},
                    "finish_reason": gen.finish_reason,
                    "logprobs": None,
                }
                if body.logprobs:
                    choice["logprobs"] = {
                        "content": [
                            {"token": tokenizer.decode([t]), "logprob": lp, "top_logprobs": []}
                            for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)
                        ]
                    }
                if body.return_token_ids:
                    choice["token_ids"] = gen.token_ids
                    choice["prompt_token_ids"] = list(prompt_ids)
                choices.append(choice)
            return _envelope("chat.completion", model_name, choices, list(prompt_ids), gens)

    return app


def _envelope(
    kind: str, model: str, choices: list, prompt_ids: list[int], gens: list[Generation]
) -> dict[str, Any]:
    completion_tokens = sum(len(g.token_ids) for g in gens)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
        "system_fingerprint": f"astraflow-v{gens[0].version}" if gens else None,
    }


class BackgroundServer:
    """Run an ASGI app with uvicorn in a daemon thread (tests, notebooks); ``stop()`` ends it.

    ``port=0`` picks a free port; ``base_url`` is set once the server listens.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self._config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(self._config)
        self._thread = threading.Thread(target=self._server.run, name="openai-server", daemon=True)
        self.host = host
        self.base_url: str | None = None

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the OpenAI-compatible server did not start")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{self.host}:{port}"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
