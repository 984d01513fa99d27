"""Serve any :class:`Engine` as an OpenAI-compatible endpoint (``/v1/completions``, chat, models).

Why: a policy trained here can be served to other runs, tools and agent code (``astraflow serve
policy``), and the rollout node serves its own engines this way to agent code written against the
``openai`` SDK (the ``openai_agent`` workflow), recording every call. The completions route takes a
text prompt or a list of token ids and, like vLLM, returns the generated token ids when asked
(``return_token_ids``) and per-token log-probs (``logprobs``), so token-in/token-out clients lose
nothing. Both generation routes stream Server-Sent Events when ``stream`` is true; our engines return
whole completions, so a stream carries a completion token by token once it is generated (the SSE
framing clients expect, not a lower time to first token). Every route except ``GET /healthz`` and
``GET /health`` needs ``Authorization: Bearer <api_key>``.

Who may call and what a model name means is a :class:`Router`'s job: :class:`StaticRouter` serves a
fixed table of engines under one API key; the ``openai_agent`` workflow's router resolves each
episode's own key to that episode's engines and a :class:`CallRecorder`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from astraflow.errors import AstraFlowError
from astraflow.protocol.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from astraflow.protocol.prometheus import ServiceMetrics, Stopwatch, exposition
from astraflow.rollout.engines.base import Engine, Generation, SamplingParams
from astraflow.rollout.engines.openai_tools import (
    MessageToolCall,
    ToolChoice,
    ToolSpec,
    plan_tools,
    read_reply,
    refuse_unsupported,
    tool_call_deltas,
)
from astraflow.tools.chat import render_chat
from astraflow.tools.parsers import ToolParser, get_tool_parser, turn_text

#: Bounds of the sampling values a request may send (see :class:`_Body`).
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1
MAX_TOKENS = 1 << 20
MAX_STOPS = 64
MAX_STOP_CHARS = 1024


@dataclass(frozen=True)
class ServerLimits:
    """What one request and one client may ask of the server (issue 48 #6).

    Why: ``astraflow serve policy`` may face clients it does not trust. Without limits a 16 MiB
    prompt peaked at 3.6 GB while being tokenized, and one ``n=256`` request made a normal
    request wait 93.5 s. ``max_body_bytes``: larger bodies are 413 before they are read;
    ``max_prompt_tokens``: longer prompts are 413 (None: the engine's ``max_context``, else
    :data:`DEFAULT_MAX_PROMPT_TOKENS`); ``max_n``: completions per request; and
    ``max_inflight_per_client``: completions (``n`` each) one client address may have running at
    once, more are 429 (None: no limit, as for a rollout node's own gateway, whose one client is
    the node's agent code).
    """

    max_body_bytes: int = 4 << 20
    max_prompt_tokens: int | None = None
    max_n: int = 16
    max_inflight_per_client: int | None = None


#: Prompt-token limit when neither the server nor the engine names one.
DEFAULT_MAX_PROMPT_TOKENS = 32768


class _Body(BaseModel):
    # Clients send many OpenAI fields that change nothing here (user, metadata, store, ...):
    # accept them; the ones that would change the reply are refused (``refuse_unsupported``).
    model_config = ConfigDict(extra="allow")

    # Every sampling value is bounded here, per request: the engines batch concurrent requests,
    # so a value that fails inside a batch (``seed: 2**100`` overflowed torch's generator) failed
    # every other client's generation in it (issue 48 #6). Out of range is a 422 naming the field
    # and the range; ``n`` above the server's ``max_n`` is a 400 naming it.
    model: str
    n: int = Field(1, ge=1, le=256)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, max_length=MAX_STOPS)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    ignore_eos: bool = False
    return_token_ids: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(len(x) > MAX_STOP_CHARS for x in stops):
            raise ValueError(f"a stop string has at most {MAX_STOP_CHARS} characters")
        return stop


class CompletionRequest(_Body):
    prompt: str | list[Annotated[int, Field(ge=0)]] = Field(
        ..., description="text, or a list of token ids"
    )
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=1)


class ChatMessage(BaseModel):
    """One message; ``content`` may be null on an assistant message that carries ``tool_calls``,
    a list of text parts is joined, and a ``tool`` message answers a call by ``tool_call_id``."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                kinds = sorted({str(p.get("type")) for p in content if isinstance(p, dict)})
                raise ValueError(f"only text content parts are supported, got {kinds}")
            return "".join(str(p.get("text", "")) for p in content)
        return content

    @model_validator(mode="after")
    def _complete(self) -> ChatMessage:
        if self.role == "developer":  # OpenAI's newer name for the system role
            self.role = "system"
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                f"a {self.role} message needs content (null only on an assistant message "
                "with tool_calls)"
            )
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role}")
        return self

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CallRecorder(Protocol):
    """Sees every generation of one client (an episode) so its calls can become training data.

    ``chat_prompt``/``completion_prompt`` may replace the prompt ids the server would render (to
    reuse the exact ids of the conversation so far instead of re-tokenizing its text) and raise
    :class:`CallRejected` for a call that cannot be recorded; ``room`` bounds how many tokens a
    call may generate (0: the conversation is full, the reply ends with ``length`` at once);
    ``record`` gets each call's ids and, for chat, the reply message as returned."""

    def chat_prompt(
        self,
        model: str,
        messages: list[dict[str, Any]],
        rendered: list[int],
        tools: list[dict[str, Any]] | None,
    ) -> list[int]: ...

    def room(self, model: str, prompt_ids: list[int]) -> int | None: ...

    def completion_prompt(
        self, model: str, prompt: str | list[int], encoded: list[int]
    ) -> list[int]: ...

    def record(
        self,
        model: str,
        prompt_ids: list[int],
        gen: Generation,
        text: str,
        messages: list[dict[str, Any]] | None,
        reply: dict[str, Any] | None = None,
        turn: Any = None,
    ) -> None: ...


class CallRejected(AstraFlowError, ValueError):
    """A call the recorder cannot turn into training data; answered 400 with this message."""


@dataclass
class Route:
    """What one model name resolves to for one caller."""

    engine: Engine
    #: sampling values used for fields the request leaves out (the policy's recipe settings)
    defaults: SamplingParams | None = None
    #: values that win over the request's (an evaluation's greedy decoding, a token budget)
    overrides: dict[str, Any] = field(default_factory=dict)
    recorder: CallRecorder | None = None
    #: how the served policy writes tool calls (a registered parser name, or "auto")
    tool_parser: str = "auto"


class Router(Protocol):
    def authorize(self, token: str) -> Any | None:
        """The caller's context for a bearer token, or None (401)."""

    def models(self, caller: Any) -> list[str]: ...

    def route(self, caller: Any, model: str) -> Route:
        """The route of ``model`` for ``caller``; KeyError when it is not served to them (404)."""


class StaticRouter:
    """A fixed table ``model name -> engine`` behind one API key (``astraflow serve policy``)."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        api_key: str,
        defaults: Mapping[str, SamplingParams] | None = None,
        tool_parser: str = "auto",
    ):
        if not api_key:
            raise ValueError("api_key is required: every route but /healthz needs a bearer token")
        if not engines:
            raise ValueError("at least one model must be served")
        self._routes = {
            name: Route(engine, (defaults or {}).get(name), tool_parser=tool_parser)
            for name, engine in engines.items()
        }
        self._key = api_key

    def authorize(self, token: str) -> Any | None:
        return True if secrets.compare_digest(token, self._key) else None

    def models(self, caller: Any) -> list[str]:
        return list(self._routes)

    def route(self, caller: Any, model: str) -> Route:
        return self._routes[model]


_SAMPLING_FIELDS = ("n", "temperature", "top_p", "seed", "ignore_eos")


def _params(body: _Body, route: Route, max_tokens: int | None) -> SamplingParams:
    """The request's sampling settings; fields it leaves out come from the route's defaults."""
    base = route.defaults or SamplingParams()
    given = body.model_fields_set
    values: dict[str, Any] = {
        f: getattr(body, f) for f in _SAMPLING_FIELDS if f in given or route.defaults is None
    }
    if "stop" in given or route.defaults is None:
        values["stop"] = tuple([body.stop] if isinstance(body.stop, str) else (body.stop or []))
    if "stop_token_ids" in given or route.defaults is None:
        values["stop_token_ids"] = tuple(body.stop_token_ids or ())
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    values.update(route.overrides)
    try:
        return replace(base, **values)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc


def _text(tokenizer: Any, gen: Generation, stops: tuple[str, ...]) -> str:
    """The completion's text as OpenAI returns it: special tokens dropped, cut before a stop string."""
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    cuts = [text.find(s) for s in stops if s and s in text]
    return text[: min(cuts)] if cuts else text


def _pieces(tokenizer: Any, gen: Generation, text: str) -> list[str]:
    """``text`` split at token boundaries (the deltas of a stream), each token's new characters."""
    pieces, done = [], ""
    for i in range(1, len(gen.token_ids) + 1):
        upto = tokenizer.decode(gen.token_ids[:i], skip_special_tokens=True)[: len(text)]
        if len(upto) > len(done) and text.startswith(upto):
            pieces.append(upto[len(done) :])
            done = upto
    if done != text:  # decoding prefixes did not reproduce the text: send the rest at once
        pieces.append(text[len(done) :])
    return pieces


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def create_app(
    engine: Engine | None = None,
    model_name: str | None = None,
    api_key: str | None = None,
    endpoints: tuple[str, ...] = ("completions", "chat"),
    *,
    router: Router | None = None,
    title: str | None = None,
    tool_parser: str = "auto",
    limits: ServerLimits | None = None,
) -> FastAPI:
    """A FastAPI app serving ``engine`` under ``model_name`` behind ``api_key``, or whatever
    ``router`` resolves; ``endpoints`` picks the generation routes; ``limits`` bound what one
    request and one client may ask (:class:`ServerLimits`)."""
    limits = limits or ServerLimits()
    if router is None:
        if engine is None or not model_name:
            raise ValueError("give an engine and its model_name, or a router")
        router = StaticRouter({model_name: engine}, api_key or "", tool_parser=tool_parser)
    unknown = set(endpoints) - {"completions", "chat"}
    if unknown:
        raise ValueError(f"unknown endpoints {sorted(unknown)}; expected 'completions' or 'chat'")
    app = FastAPI(title=title or f"AstraFlow OpenAI-compatible server ({model_name or 'router'})")
    _openai_errors(app)
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes)
    # Tokenizing and rendering run on this thread, never on the event loop: an 8 MiB prompt
    # kept the loop (and /healthz) for 14.6 s. One thread: tokenizers are not all thread-safe.
    tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="openai-tokenize")
    inflight: dict[str, int] = {}

    async def off_loop(fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            tokenize_pool, functools.partial(fn, *args, **kwargs)
        )

    def check_prompt(route: Route, prompt_ids: list[int], params: SamplingParams) -> None:
        """413 for a prompt over the limit; 400 for token ids outside the vocabulary (an id
        the model cannot embed failed the whole batch it was in)."""
        engine_limit = getattr(route.engine, "max_context", None)
        limit = limits.max_prompt_tokens or engine_limit or DEFAULT_MAX_PROMPT_TOKENS
        # a recording route bounds its conversation itself (a full one gets an empty reply)
        if route.recorder is None and len(prompt_ids) > limit:
            raise HTTPException(
                413,
                f"prompt has {len(prompt_ids)} tokens; this server accepts at most {limit} "
                "(the model's context, or `serve policy --max-prompt-tokens`)",
            )
        vocab = _vocab_size(route.engine.tokenizer)
        if vocab is not None:
            for what, ids in (("prompt", prompt_ids), ("stop_token_ids", params.stop_token_ids)):
                bad = next((t for t in ids if not 0 <= t < vocab), None)
                if bad is not None:
                    raise HTTPException(
                        400, f"{what}: token id {bad} is outside the vocabulary 0..{vocab - 1}"
                    )

    @contextlib.contextmanager
    def client_share(request: Request, n: int):
        """Count ``n`` completions against the client's in-flight limit while they run."""
        if n > limits.max_n:
            raise HTTPException(
                400, f"n is {n}; this server accepts 1..{limits.max_n} (`serve policy --max-n`)"
            )
        cap = limits.max_inflight_per_client
        host = request.client.host if request.client else "unknown"
        if cap is not None and inflight.get(host, 0) + n > cap:
            raise HTTPException(
                429,
                f"client {host} has {inflight.get(host, 0)} completions in flight and asked for "
                f"{n} more; the limit is {cap} per client (`serve policy "
                "--max-inflight-per-client`): retry when some have finished",
                headers={"retry-after": "1"},
            )
        inflight[host] = inflight.get(host, 0) + n
        try:
            yield
        finally:
            left = inflight.get(host, 0) - n
            if left > 0:
                inflight[host] = left
            else:
                inflight.pop(host, None)

    def authorize(request: Request) -> Any:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        caller = router.authorize(token.strip()) if scheme.lower() == "bearer" else None
        if caller is None:
            raise HTTPException(401, "missing or wrong 'Authorization: Bearer <api key>' header")
        return caller

    def resolve(caller: Any, name: str) -> Route:
        try:
            return router.route(caller, name)
        except KeyError:
            served = ", ".join(repr(m) for m in router.models(caller))
            raise HTTPException(
                404, f"model {name!r} is not served here; this server has {served}"
            ) from None

    metrics = ServiceMetrics()
    generate_s = metrics.histogram(
        "astraflow_generate_seconds", "Seconds per generation request", ("model",)
    )
    tokens = metrics.counter("astraflow_generated_tokens", "Tokens generated", ("model",))

    async def run(route: Route, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        name = model_name or "router"
        try:
            with Stopwatch(generate_s.labels(name)):
                out = await route.engine.generate(prompt_ids, params)
        except (ValueError, TypeError) as exc:
            raise HTTPException(400, str(exc)) from exc
        tokens.labels(name).inc(sum(len(g.token_ids) for g in out))
        return out

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(caller: Any = Depends(authorize)) -> Response:
        return Response(exposition(metrics.registry), media_type=PROMETHEUS_CONTENT_TYPE)

    def check_recordable(route: Route, body: _Body) -> None:
        if route.recorder is not None and body.n != 1:
            raise HTTPException(
                400,
                f"n must be 1 on a recording endpoint, got {body.n}: each call extends one "
                "conversation (the node already runs task.group_size episodes per task)",
            )

    def recorded(call, *args):
        try:
            return call(*args)
        except CallRejected as exc:
            raise HTTPException(400, str(exc)) from exc

    parsers: dict[tuple[str, int], ToolParser] = {}

    def parser_of(route: Route) -> ToolParser:
        key = (route.tool_parser, id(route.engine.tokenizer))
        if key not in parsers:
            parsers[key] = get_tool_parser(route.tool_parser, route.engine.tokenizer)
        return parsers[key]

    def within_room(route: Route, model: str, prompt_ids: list[int], params: SamplingParams):
        """``params`` capped to the recorder's room; None when the conversation is full."""
        room = route.recorder.room(model, prompt_ids) if route.recorder is not None else None
        if room is None:
            return params
        if room <= 0:
            return None
        return replace(params, max_tokens=min(params.max_tokens, room))

    async def generate(route: Route, model: str, prompt_ids: list[int], params: SamplingParams):
        capped = within_room(route, model, prompt_ids, params)
        if capped is None:  # nothing may be generated: an empty reply that ends with length
            return [Generation([], [], "length", route.engine.version, {"context_full": True})]
        return await run(route, prompt_ids, capped)

    @app.get("/healthz")
    @app.get("/health")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(caller: Any = Depends(authorize)) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "astraflow"}
                for m in router.models(caller)
            ],
        }

    if "completions" in endpoints:

        @app.post("/v1/completions")
        async def completions(
            body: CompletionRequest, request: Request, caller: Any = Depends(authorize)
        ):
            refuse_unsupported(body)
            route = resolve(caller, body.model)
            check_recordable(route, body)
            tokenizer = route.engine.tokenizer
            if isinstance(body.prompt, str):
                prompt_ids = await off_loop(tokenizer.encode, body.prompt)
            else:
                prompt_ids = list(body.prompt)
            if route.recorder is not None:
                prompt_ids = recorded(
                    route.recorder.completion_prompt, body.model, body.prompt, prompt_ids
                )
            given_max = "max_tokens" in body.model_fields_set or route.defaults is None
            params = _params(body, route, body.max_tokens if given_max else None)
            check_prompt(route, prompt_ids, params)
            with client_share(request, params.n):
                gens = await generate(route, body.model, prompt_ids, params)
            texts = [_text(tokenizer, gen, params.stop) for gen in gens]
            if route.recorder is not None:
                for gen, text in zip(gens, texts, strict=True):
                    if not gen.meta.get("context_full"):
                        recorded(route.recorder.record, body.model, prompt_ids, gen, text, None)
            choices = []
            for i, (gen, text) in enumerate(zip(gens, texts, strict=True)):
                choice: dict[str, Any] = {
                    "index": i,
                    "text": text,
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
            envelope = _envelope("text_completion", body.model, choices, prompt_ids, gens)
            if not body.stream:
                return envelope
            # decoding every prefix of a long completion is work: off the loop too
            chunks = await off_loop(_completion_chunks, tokenizer, body, envelope, gens, texts)
            return _sse(chunks)

    if "chat" in endpoints:

        @app.post("/v1/chat/completions")
        async def chat(body: ChatRequest, request: Request, caller: Any = Depends(authorize)):
            refuse_unsupported(body)
            route = resolve(caller, body.model)
            check_recordable(route, body)
            tokenizer = route.engine.tokenizer
            messages = [m.as_dict() for m in body.messages]
            plan = plan_tools(
                body.tools, body.tool_choice, body.parallel_tool_calls, parser_of(route)
            )
            try:
                text = await off_loop(
                    render_chat, tokenizer, messages, tools=plan.tools, add_generation_prompt=True
                )
            except Exception as exc:  # noqa: BLE001 - template errors are the client's
                raise HTTPException(
                    400, f"cannot render messages with the chat template: {exc}"
                ) from exc
            prompt_ids = await off_loop(tokenizer.encode, text, add_special_tokens=False)
            if route.recorder is not None:
                prompt_ids = recorded(
                    route.recorder.chat_prompt, body.model, messages, prompt_ids, plan.tools
                )
            if plan.prefill:  # a forced tool_choice: the call's opening is given, not generated
                prompt_ids = prompt_ids + tokenizer.encode(plan.prefill, add_special_tokens=False)
            params = _params(body, route, body.max_completion_tokens or body.max_tokens)
            if route.defaults is None and not (body.max_completion_tokens or body.max_tokens):
                params = replace(params, max_tokens=256)
            check_prompt(route, prompt_ids, params)
            with client_share(request, params.n):
                gens = await generate(route, body.model, prompt_ids, params)
            choices = []
            for i, gen in enumerate(gens):
                if plan.active:
                    text = plan.prefill + turn_text(tokenizer, gen.token_ids, plan.parser)
                else:
                    text = _text(tokenizer, gen, params.stop)
                message, turn = read_reply(plan, text)
                finish = "tool_calls" if message.get("tool_calls") else gen.finish_reason
                if route.recorder is not None and not gen.meta.get("context_full"):
                    recorded(
                        route.recorder.record, body.model, prompt_ids, gen, text, messages,
                        message, turn,
                    )  # fmt: skip
                choice: dict[str, Any] = {
                    "index": i,
                    "message": message,
                    "finish_reason": finish,
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
                    choice["prompt_token_ids"] = prompt_ids
                choices.append(choice)
            envelope = _envelope("chat.completion", body.model, choices, prompt_ids, gens)
            if not body.stream:
                return envelope
            return _sse(await off_loop(_chat_chunks, tokenizer, body, envelope, gens))

    return app


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def _vocab_size(tokenizer: Any) -> int | None:
    """Token ids the tokenizer knows (added tokens included), or None when it does not say."""
    try:
        return int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return int(size) if isinstance(size, int) else None


class _BodyLimit:
    """413 for a request body over ``max_bytes``, in OpenAI's error shape, before it is read:
    from ``Content-Length`` at once, and for a body without one (chunked) as soon as what
    arrived passes the limit. A pure ASGI middleware, so nothing buffers a body first."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> Any:
        from fastapi.responses import JSONResponse

        message = (
            f"request body of {size} exceeds the limit of {self.max_bytes} bytes "
            "(`serve policy --max-body-mb`)"
        )
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": 413}
        return JSONResponse({"error": error}, status_code=413)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > self.max_bytes:
                await self._too_large(f"{n} bytes")(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # no Content-Length: read the body here, up to the limit, then hand it on
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._too_large(f"more than {self.max_bytes} bytes")(scope, receive, send)
                return
            if not message.get("more_body"):
                break
        body, sent = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _openai_errors(app: FastAPI) -> None:
    """Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``): the SDKs
    read the message from there, so a client sees what was wrong, not just a status code."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    def body(status: int, message: str, param: str | None = None) -> JSONResponse:
        kind = _ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        error = {"message": message, "type": kind, "param": param, "code": status}
        return JSONResponse({"error": error}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reply = body(exc.status_code, str(exc.detail))
        reply.headers.update(exc.headers or {})  # a 429's retry-after
        return reply

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in exc.errors()
        ]
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        param = ".".join(str(p) for p in first if p != "body") or None
        return body(422, "invalid request: " + "; ".join(problems), param)


def _chunk_base(envelope: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "id": envelope["id"],
        "object": kind,
        "created": envelope["created"],
        "model": envelope["model"],
        "system_fingerprint": envelope["system_fingerprint"],
    }


def _usage_chunk(body: _Body, envelope: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    if not (body.stream_options or {}).get("include_usage"):
        return []
    return [{**_chunk_base(envelope, kind), "choices": [], "usage": envelope["usage"]}]


def _chat_chunks(
    tokenizer: Any, body: ChatRequest, envelope: dict, gens: list[Generation]
) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` events: the role, the content token by token (or at once next
    to tool calls), the calls as ``delta.tool_calls``, the finish reason."""
    kind = "chat.completion.chunk"
    out = []
    for choice, gen in zip(envelope["choices"], gens, strict=True):
        i, message = choice["index"], choice["message"]
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        out.append({**_chunk_base(envelope, kind), "choices": [first]})
        text = message.get("content") or ""
        if message.get("tool_calls") or "reasoning_content" in message:
            pieces = [text] if text else []
        else:
            pieces = _pieces(tokenizer, gen, text)
        if message.get("reasoning_content"):
            delta = {"index": i, "delta": {"reasoning_content": message["reasoning_content"]}}
            out.append(
                {**_chunk_base(envelope, kind), "choices": [{**delta, "finish_reason": None}]}
            )
        for piece in pieces:
            delta = {"index": i, "delta": {"content": piece}, "finish_reason": None}
            out.append({**_chunk_base(envelope, kind), "choices": [delta]})
        for delta in tool_call_deltas(i, message):
            out.append({**_chunk_base(envelope, kind), "choices": [delta]})
        last = {"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}
        out.append({**_chunk_base(envelope, kind), "choices": [last]})
    return out + _usage_chunk(body, envelope, kind)


def _completion_chunks(
    tokenizer: Any,
    body: CompletionRequest,
    envelope: dict,
    gens: list[Generation],
    texts: list[str],
) -> list[dict[str, Any]]:
    """``text_completion`` events: the text token by token, then the finish reason."""
    kind = "text_completion"
    out = []
    for i, (gen, text) in enumerate(zip(gens, texts, strict=True)):
        for piece in _pieces(tokenizer, gen, text):
            choice = {"index": i, "text": piece, "finish_reason": None, "logprobs": None}
            out.append({**_chunk_base(envelope, kind), "choices": [choice]})
        last = {"index": i, "text": "", "finish_reason": gen.finish_reason, "logprobs": None}
        out.append({**_chunk_base(envelope, kind), "choices": [last]})
    return out + _usage_chunk(body, envelope, kind)


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
