"""Client side of the OpenAI-compatible ``/v1/completions`` API with token-id prompts.

Shared by the vLLM engine and the OpenAI engine. A prompt goes out as a list of token ids (no
re-tokenization); the answer's token ids come back through ``return_token_ids`` (vLLM and our own
:mod:`.openai_server`) and the per-token log-probs through ``logprobs``. Servers that reject the
extra fields are the OpenAI engine's business (it falls back); this module only speaks the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from astraflow.errors import AstraFlowError
from astraflow.rollout.engines.base import SamplingParams


class CompletionsAPIError(AstraFlowError, RuntimeError):
    """The server answered with an error or with a body this client cannot use."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


@dataclass
class Choice:
    token_ids: list[int] | None
    logprobs: list[float] | None
    text: str
    finish_reason: str
    stop_reason: int | str | None


def completions_body(
    model: str, prompt: list[int] | str, params: SamplingParams, token_ids: bool = True
) -> dict[str, Any]:
    """The JSON body for ``params``; ``token_ids`` asks for vLLM's ``return_token_ids``."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "logprobs": 1,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    if token_ids:
        body["return_token_ids"] = True
        body["skip_special_tokens"] = False
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.ignore_eos:
            body["ignore_eos"] = True
    return body


async def post_json(
    client: httpx.AsyncClient, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """POST ``body``; return the JSON answer or raise :class:`CompletionsAPIError` with its text."""
    try:
        response = await client.post(path, json=body if body is not None else {})
    except httpx.HTTPError as exc:
        raise CompletionsAPIError(f"POST {client.base_url}{path} failed: {exc!r}") from exc
    if response.status_code >= 400:
        raise CompletionsAPIError(
            f"POST {client.base_url}{path} answered {response.status_code}: {response.text[:500]}",
            status_code=response.status_code,
        )
    if not response.content:
        return {}
    try:
        return response.json()
    except ValueError as exc:
        raise CompletionsAPIError(
            f"POST {client.base_url}{path} answered non-JSON: {response.text[:200]!r}"
        ) from exc


async def post_text(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    """POST ``body`` to a route that answers plain text (vLLM's adapter routes); return it or
    raise :class:`CompletionsAPIError` with the server's answer."""
    try:
        response = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise CompletionsAPIError(f"POST {client.base_url}{path} failed: {exc!r}") from exc
    if response.status_code >= 400:
        raise CompletionsAPIError(
            f"POST {client.base_url}{path} answered {response.status_code}: {response.text[:500]}",
            status_code=response.status_code,
        )
    return response.text


def parse_choices(payload: dict[str, Any], n: int) -> list[Choice]:
    """The ``n`` choices of a completions answer, in index order."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        raise CompletionsAPIError(
            f"expected {n} choices in the completions answer, got "
            f"{len(choices) if isinstance(choices, list) else type(choices).__name__}"
        )
    parsed = []
    for choice in sorted(choices, key=lambda c: c.get("index", 0)):
        logprobs_obj = choice.get("logprobs") or {}
        token_logprobs = logprobs_obj.get("token_logprobs")
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = _ids_from_token_strings(logprobs_obj.get("tokens"))
        parsed.append(
            Choice(
                token_ids=[int(t) for t in token_ids] if token_ids is not None else None,
                logprobs=[_as_float(x) for x in token_logprobs]
                if token_logprobs is not None
                else None,
                text=choice.get("text") or "",
                finish_reason=choice.get("finish_reason") or "length",
                stop_reason=choice.get("stop_reason"),
            )
        )
    return parsed


def _ids_from_token_strings(tokens: list[str] | None) -> list[int] | None:
    """vLLM's ``return_tokens_as_token_ids`` spells tokens as ``token_id:123``."""
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    return [int(t.split(":", 1)[1]) for t in tokens]


def _as_float(x: Any) -> float:
    return float("nan") if x is None else float(x) if not isinstance(x, float) else x


def finish_reason_of(choice: Choice) -> str:
    """Map a server's finish reason onto the engine's ``stop`` / ``length``."""
    if choice.finish_reason == "length":
        return "length"
    if choice.finish_reason in ("stop", "eos", "stop_sequence"):
        return "stop"
    raise CompletionsAPIError(f"the server ended a completion with {choice.finish_reason!r}")
