"""The OpenAI engine: any OpenAI-compatible endpoint as a frozen policy (opponent, judge).

Token-in/token-out where the server allows it: ``/v1/completions`` with the prompt as token ids and
``return_token_ids`` (vLLM, SGLang, :mod:`.openai_server`). Otherwise, in order: completions with
token ids but without vLLM's extra fields (ids then come from re-tokenizing the returned text), and
last ``/v1/chat/completions`` with the prompt decoded to text as one user message (lossy: for
servers that only speak chat). ``mode="auto"`` tries them in that order once and remembers what
worked. Log-probs are kept when the server returns them for exactly the tokens we hold; otherwise
they are NaN and ``meta["logprobs"] == "unavailable"`` (fine for frozen policies: nobody trains on
them). The weights are the server's: :meth:`load_weights` refuses.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import httpx

from astraflow.rollout.engines.base import Generation, SamplingParams, WeightUpdate
from astraflow.rollout.engines.completions_api import (
    Choice,
    CompletionsAPIError,
    completions_body,
    finish_reason_of,
    parse_choices,
    post_json,
)

Mode = Literal["auto", "completions", "completions-text", "chat"]
_MODES = ("completions", "completions-text", "chat")


class OpenAIEngine:
    """An Engine over an OpenAI-compatible HTTP endpoint.

    Args:
        base_url: the server root, e.g. ``http://127.0.0.1:8000`` (``/v1`` is appended if missing).
        model: the served model's name.
        api_key: sent as ``Authorization: Bearer``.
        tokenizer: path of the policy's tokenizer (to decode prompts for chat and re-tokenize
            returned text); default: ``model`` when it is a local directory.
        mode: ``auto`` (probe), ``completions``, ``completions-text`` or ``chat``.
        version: the version number reported for every generation (the policy is frozen).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        tokenizer: Any = None,
        mode: Mode = "auto",
        timeout: float = 600.0,
        max_connections: int = 64,
        version: int = 0,
    ):
        if mode != "auto" and mode not in _MODES:
            raise ValueError(f"mode must be 'auto' or one of {_MODES}, got {mode!r}")
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.mode: Mode = mode
        self.version = version
        self.tokenizer = self._load_tokenizer(tokenizer, model)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_args = {
            "base_url": self.base_url,
            "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=30.0),
            "limits": httpx.Limits(max_connections=max_connections),
        }
        self._client: httpx.AsyncClient | None = None

    @staticmethod
    def _load_tokenizer(tokenizer: Any, model: str) -> Any:
        if tokenizer is not None and not isinstance(tokenizer, str):
            return tokenizer  # already a tokenizer object
        from pathlib import Path

        source = tokenizer or (model if Path(model).is_dir() else None)
        if source is None:
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(source))

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(**self._client_args)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def load_weights(self, update: WeightUpdate) -> None:
        raise NotImplementedError(
            f"the openai engine serves a frozen policy from {self.base_url}; it cannot load "
            f"weights (version {update.version}). Use the transformers or vllm engine for a "
            "trainable policy."
        )

    # -- generation -----------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        if isinstance(prompt_ids, (str, bytes)) or not prompt_ids:
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        prompt = [int(t) for t in prompt_ids]
        if self.mode != "auto":
            return await self._generate(self.mode, prompt, params)
        last: CompletionsAPIError | None = None
        for mode in _MODES:
            if mode != "completions" and self.tokenizer is None:
                break  # the fallbacks need the policy tokenizer
            try:
                result = await self._generate(mode, prompt, params)
            except CompletionsAPIError as exc:
                if exc.status_code not in (400, 404, 405, 422, 501):
                    raise  # a real failure (auth, server error), not an unsupported feature
                last = exc
                continue
            self.mode = mode
            return result
        raise CompletionsAPIError(
            f"{self.base_url} supports none of: completions with token ids, completions with "
            f"text, chat completions (pass tokenizer= to enable the last two); last error: {last}"
        )

    async def generate_chat(
        self, messages: list[dict[str, str]], params: SamplingParams
    ) -> list[Generation]:
        """Completions of a chat, rendered by the server (judges that work in text)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "logprobs": True,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        payload = await post_json(self._http(), "/chat/completions", body)
        return self._from_chat(payload, params.n)

    async def _generate(self, mode: str, prompt: list[int], params: SamplingParams):
        client = self._http()
        if mode == "chat":
            text = self.tokenizer.decode(prompt, skip_special_tokens=True)
            return await self.generate_chat([{"role": "user", "content": text}], params)
        body = completions_body(self.model, prompt, params, token_ids=(mode == "completions"))
        payload = await post_json(client, "/completions", body)
        choices = parse_choices(payload, params.n)
        if mode == "completions" and any(c.token_ids is None for c in choices):
            raise CompletionsAPIError(
                "the server ignored return_token_ids (no token ids in the answer)", status_code=400
            )
        return [self._generation(c, len(prompt)) for c in choices]

    def _generation(self, choice: Choice, prompt_len: int) -> Generation:
        meta: dict[str, Any] = {"prompt_tokens": prompt_len, "text": choice.text}
        token_ids = choice.token_ids
        logprobs = choice.logprobs
        if token_ids is None:
            token_ids = self.tokenizer.encode(choice.text, add_special_tokens=False)
            meta["token_ids"] = "retokenized"
        if logprobs is None or len(logprobs) != len(token_ids):
            logprobs = [math.nan] * len(token_ids)
            meta["logprobs"] = "unavailable"
        if choice.stop_reason is not None:
            meta["stop"] = choice.stop_reason
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish_reason_of(choice),  # type: ignore[arg-type]
            version=self.version,
            meta=meta,
        )

    def _from_chat(self, payload: dict[str, Any], n: int) -> list[Generation]:
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != n:
            raise CompletionsAPIError(f"expected {n} choices in the chat answer, got {choices!r}")
        generations = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0)):
            text = (choice.get("message") or {}).get("content") or ""
            token_ids = choice.get("token_ids")
            content = (choice.get("logprobs") or {}).get("content")
            logprobs = [float(c["logprob"]) for c in content] if content else None
            if token_ids is None and self.tokenizer is not None:
                token_ids = self.tokenizer.encode(text, add_special_tokens=False)
            parsed = Choice(
                token_ids=token_ids if token_ids is not None else [],
                logprobs=logprobs,
                text=text,
                finish_reason=choice.get("finish_reason") or "length",
                stop_reason=None,
            )
            generations.append(self._generation(parsed, 0))
        return generations
