"""One engine, several policies: the LoRA adapters of a base (and the base itself) as engines.

A node serves every adapter policy of one base from a single engine (the base's weights held once,
requests of different adapters decoded in one batch). Workflows and the node loop, though, see
one :class:`~astraflow.rollout.engines.base.Engine` per policy, with that policy's version and
weight updates. :class:`AdapterEngine` is that per-policy face: it forwards ``generate`` and
``load_weights`` to the shared engine with the adapter named, and reports the adapter's own
version. The shared engine closes when the last of its faces does.

An engine that serves adapters implements ``generate(prompt, params, adapter=POLICY)``,
``load_weights(update, adapter=POLICY)`` and ``adapter_version(POLICY)`` (the transformers
engine, the vLLM engine).
"""

from __future__ import annotations

from typing import Any

from astraflow.rollout.engines.base import Generation, SamplingParams, WeightUpdate


class _Owners:
    """How many faces of one shared engine are still open."""

    def __init__(self, engine: Any, count: int):
        self.engine = engine
        self.open = count

    async def release(self) -> None:
        self.open -= 1
        if self.open == 0:
            await self.engine.close()


class AdapterEngine:
    """The :class:`Engine` of one adapter policy (``adapter``) of a shared engine, or, with
    ``adapter=None``, of the frozen base policy served from it."""

    def __init__(self, engine: Any, adapter: str | None, owners: _Owners):
        self.engine = engine
        self.adapter = adapter
        self._owners = owners
        self._closed = False

    @property
    def version(self) -> int:
        if self.adapter is None:
            return int(self.engine.version)
        return int(self.engine.adapter_version(self.adapter))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_context(self) -> int | None:
        return getattr(self.engine, "max_context", None)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        return await self.engine.generate(prompt_ids, params, adapter=self.adapter)

    async def load_weights(self, update: WeightUpdate) -> None:
        if self.adapter is None:
            raise ValueError(
                "the base of LoRA adapters is frozen: its policy (trainable = false) takes no "
                "weight updates"
            )
        await self.engine.load_weights(update, adapter=self.adapter)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._owners.release()

    def __repr__(self) -> str:
        served = self.adapter or "base"
        return f"AdapterEngine({type(self.engine).__name__}, {served})"


def adapter_engines(engine: Any, policies: dict[str, str | None]) -> dict[str, AdapterEngine]:
    """One :class:`AdapterEngine` per policy of ``policies`` (policy -> the adapter it runs,
    None for the base), all over ``engine``, which the last of them to close closes."""
    owners = _Owners(engine, len(policies))
    return {name: AdapterEngine(engine, adapter, owners) for name, adapter in policies.items()}
