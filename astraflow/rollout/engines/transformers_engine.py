"""The built-in inference engine: a Hugging Face causal LM with continuous batching, CPU or CUDA.

Many episodes ``await generate(...)`` at once. Each call becomes a request on a queue; one worker
thread owns the model and runs the decode loop: at every step boundary it admits waiting requests
(prefilled together, then joined to the running batch, see :mod:`.continuous_batch`), feeds one token
per running row, samples, and hands finished completions back to the caller's event loop. The event
loop never runs torch code, so it stays responsive while the model works.

Weight updates are queued too. While one is pending the worker admits nothing new, lets the running
rows finish, then writes the weights in place; so a completion never mixes two versions, and each
:class:`Generation` carries the version that was loaded when it was admitted.

LoRA adapters (``adapters=``): the engine loads the base once, wraps it in ``peft`` with one adapter
per adapter policy, and serves each through :class:`~.adapters.AdapterEngine` (``generate(...,
adapter=POLICY)``). Rows of every adapter (and of the bare base) decode in the same batch; each
adapter has its own version, and an update of one adapter waits only for that adapter's running
rows (the others keep decoding and being admitted), then writes the adapter's tensors in place.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from astraflow.models.lora import BASE_ADAPTER, AdapterSpec, peft_lora_config
from astraflow.rollout.engines.base import (
    EngineDeadError,
    Generation,
    SamplingParams,
    WeightUpdate,
)
from astraflow.rollout.engines.continuous_batch import CausalLMRunner, DecodeState, SequenceRow
from astraflow.rollout.engines.sampling import RowSampling, sample_next
from astraflow.rollout.engines.weight_apply import apply_update_, check_update

log = logging.getLogger(__name__)


class EngineClosedError(EngineDeadError):
    """The engine was closed while a request was waiting or running."""


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    results: list[Generation | None] = field(default_factory=list)
    version: int = 0
    pending_rows: int = 0
    #: the adapter policy it runs with (None: the model itself, or the bare base of adapters)
    adapter: str | None = None

    def cancelled(self) -> bool:
        return self.future.cancelled()


@dataclass
class _Update:
    update: WeightUpdate
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)
    #: the adapter policy it updates (None: the whole model)
    adapter: str | None = None


@dataclass
class _AdapterSlot:
    """One adapter policy served by the engine: its peft name, live tensors and version."""

    name: str
    state: dict[str, torch.Tensor]
    version: int = 0
    #: digest of ``state`` as the last verified delta left it; None when unknown
    digest: str | None = None


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result=None, error=None):
    """Complete ``future`` from the worker thread (no-op if its caller gave up or the loop closed)."""

    def _set():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(_set)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _checkpoint_dtype(path: Path) -> torch.dtype | None:
    import json

    config = json.loads((path / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) else None


def _pick_dtype(dtype: str | torch.dtype, device: torch.device, path: Path) -> torch.dtype:
    """``auto``: the checkpoint's own dtype, so weight digests from the trainer match bit for bit;
    on CPU half precision is widened to float32 (CPU matmuls in bf16/fp16 are slow)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        stored = _checkpoint_dtype(path) or torch.float32
        if device.type == "cpu" and stored in (torch.float16, torch.bfloat16):
            return torch.float32
        return stored
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16}
    names.update({"bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16})
    if dtype not in names:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


class TransformersEngine:
    """An :class:`~astraflow.rollout.engines.base.Engine` over a local transformers checkpoint.

    Args:
        model: path of a saved causal LM (config, weights, tokenizer).
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"auto"`` (the checkpoint's dtype; fp32 on CPU for half-precision checkpoints) or a
            dtype name. Sparse deltas verify bit-exact digests, so they apply only when the engine
            holds the weights in the trainer's dtype; otherwise the node needs full snapshots.
        max_batch_size: most sequences decoded together (a request with ``n`` completions is ``n``).
        num_threads: torch intra-op threads for this process (``torch.set_num_threads``).
        seed: seeds the shared sampler, so a run is reproducible when requests arrive in order.
        version: the version number of the weights in ``model`` (0 = the initial checkpoint).
        adapters: LoRA adapter policies of ``model`` (:class:`~astraflow.models.lora.
            AdapterSpec`) served beside the base; ``model`` is then frozen and each adapter
            starts at version 0 with :func:`~astraflow.models.lora.init_adapter_`'s weights.
    """

    def __init__(
        self,
        model: str | Path,
        device: str = "auto",
        dtype: str | torch.dtype = "auto",
        max_batch_size: int = 128,
        num_threads: int | None = 1,
        seed: int | None = None,
        version: int = 0,
        attn_implementation: str | None = "sdpa",
        adapters: Sequence[AdapterSpec] = (),
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        path = Path(model)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model {str(model)!r} is not a directory with a config.json (expected a saved "
                f"transformers checkpoint; for built-ins use astraflow.models.resolve_model)"
            )
        self.device = _pick_device(device)
        self.dtype = _pick_dtype(dtype, self.device, path)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        load_kwargs: dict[str, Any] = {"dtype": self.dtype}
        if attn_implementation:
            load_kwargs["attn_implementation"] = attn_implementation
        self.model = AutoModelForCausalLM.from_pretrained(str(path), **load_kwargs)
        #: adapter policy -> its slot (empty: a plain engine)
        self._adapters: dict[str, _AdapterSlot] = {}
        if adapters:
            self.model = self._wrap_adapters(self.model, adapters)
        self.model.to(self.device).eval()
        self.model_path = path
        self.max_batch_size = max_batch_size
        self.version = version
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.eos_token_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (sorted(self.eos_token_ids) or [0])[0])
        self._state = dict(self.model.state_dict())
        #: digest of ``_state`` as the last verified delta left it; None when unknown
        self._state_digest: str | None = None
        self._runner = CausalLMRunner(self.model)
        # Joining a running batch left-pads KV caches; sliding-window caches cannot be padded that
        # way, so such models only start a new batch when the previous one has drained.
        layer_types = getattr(self.model.config, "layer_types", None) or []
        self._can_join = all(t == "full_attention" for t in layer_types) and not getattr(
            self.model.config, "use_sliding_window", False
        )
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()
        #: heap of (priority, arrival number, request): oldest group first, then arrival order
        self._waiting: list[tuple[float, int, _Request]] = []
        self._arrivals = itertools.count()
        self._updates: deque[_Update] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._running: DecodeState | None = None
        self.stats = {"steps": 0, "prefills": 0, "tokens": 0}
        self._worker = threading.Thread(
            target=self._work, name=f"astraflow-engine-{path.name}", daemon=True
        )
        self._worker.start()

    def _wrap_adapters(self, model: Any, adapters: Sequence[AdapterSpec]) -> Any:
        """``model`` in ``peft`` with one adapter per spec, each at its version-0 weights."""
        import peft

        from astraflow.models.lora import adapter_state, engine_adapter_name, init_adapter_

        names = [spec.policy for spec in adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"adapter policies must be distinct, got {names}")
        for param in model.parameters():
            param.requires_grad_(False)
        first, *rest = adapters
        wrapped = peft.get_peft_model(
            model, peft_lora_config(first.lora), adapter_name=engine_adapter_name(first.policy)
        )
        for spec in rest:
            wrapped.add_adapter(engine_adapter_name(spec.policy), peft_lora_config(spec.lora))
        for spec in adapters:
            name = engine_adapter_name(spec.policy)
            state = adapter_state(wrapped, name)
            init_adapter_(state, spec.seed)
            self._adapters[spec.policy] = _AdapterSlot(name, state)
        return wrapped

    @property
    def adapter_policies(self) -> list[str]:
        """The adapter policies this engine serves (empty for a plain engine)."""
        return list(self._adapters)

    def adapter_version(self, policy: str) -> int:
        return self._slot(policy).version

    def adapter_state(self, policy: str) -> dict[str, torch.Tensor]:
        """The live tensors of ``policy``'s adapter (keys as in its weight versions)."""
        return self._slot(policy).state

    def _slot(self, policy: str) -> _AdapterSlot:
        slot = self._adapters.get(policy)
        if slot is None:
            raise ValueError(
                f"this engine serves no adapter {policy!r}; it serves "
                f"{', '.join(self._adapters) or 'no adapters'}"
            )
        return slot

    # -- public API ---------------------------------------------------------------------------
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None
    ) -> list[Generation]:
        """``params.n`` completions of ``prompt_ids``, batched with every other request in flight;
        with ``adapter``, by that adapter policy (None on an adapter engine: the bare base)."""
        prompt = self._validate_prompt(prompt_ids)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if adapter is not None:
            self._slot(adapter)
        loop = asyncio.get_running_loop()
        request = _Request(prompt, params, loop, loop.create_future(), adapter=adapter)
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            heapq.heappush(self._waiting, (params.priority, next(self._arrivals), request))
        # Wake the worker after this loop iteration, not now: requests started together (e.g. by
        # asyncio.gather) are then all queued and share one prefill instead of trickling in.
        loop.call_soon(self._wake)
        return await request.future

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    async def load_weights(self, update: WeightUpdate, adapter: str | None = None) -> None:
        """Install ``update`` once the running generations finish; new ones carry its version.
        With ``adapter``: the update is that adapter policy's state, and only its own running
        generations are waited for."""
        if adapter is not None:
            self._slot(adapter)
        elif self._adapters:
            raise ValueError(
                "this engine serves LoRA adapters of a frozen base: an update names its adapter "
                f"(one of {', '.join(self._adapters)})"
            )
        loop = asyncio.get_running_loop()
        item = _Update(update, loop, loop.create_future(), adapter=adapter)
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            self._updates.append(item)
            self._cond.notify()
        await item.future

    async def close(self) -> None:
        """Stop the worker; requests still waiting or running fail with :class:`EngineClosedError`."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        await asyncio.get_running_loop().run_in_executor(None, self._worker.join)

    # -- validation -----------------------------------------------------------------------------
    def _validate_prompt(self, prompt_ids: list[int]) -> list[int]:
        if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
            raise TypeError(
                f"prompt_ids must be a list of token ids (ints), got {type(prompt_ids).__name__}; "
                "render text with engine.tokenizer first"
            )
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty; a prompt needs at least one token")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        if len(prompt) >= self.max_context:
            raise ValueError(
                f"prompt has {len(prompt)} tokens; the model's context is {self.max_context} "
                "tokens, which leaves no room to generate"
            )
        return prompt

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config):
            eos = getattr(source, "eos_token_id", None)
            if eos is None:
                continue
            ids.update([eos] if isinstance(eos, int) else eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(int(i) for i in ids)

    # -- worker thread ----------------------------------------------------------------------------
    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                admitted, update = self._next_work()
                if admitted is None and update is None:
                    break  # closed
                try:
                    if update is not None:
                        self._apply_update(update)
                    if admitted:
                        self._admit(admitted)
                    if self._running is not None and len(self._running):
                        self._decode_step()
                except Exception as exc:  # noqa: BLE001 - fail the requests, keep serving
                    log.exception("engine step failed")
                    self._fail_running(exc, admitted or [])
        self._fail_everything(EngineClosedError("the engine was closed"))

    def _next_work(self) -> tuple[list[_Request] | None, _Update | None]:
        """Block until there is something to do; return requests to admit and/or an update.

        An update applies once no running row uses what it changes (the whole model: no running
        row; an adapter: none of that adapter's); until then requests for it are not admitted
        (the rows drain), while requests of other adapters are."""
        rows = self._running.rows if self._running is not None else []
        running = len(rows)
        with self._cond:
            while True:
                if self._closed:
                    return None, None
                blocked: set[str | None] = set()
                if self._updates:
                    busy = {row.owner.adapter for row in rows}
                    for i, item in enumerate(self._updates):
                        target = item.adapter
                        free = running == 0 if target is None else target not in busy
                        if free and target not in blocked:
                            del self._updates[i]
                            return [], item
                        blocked.add(target)
                    if None in blocked:
                        return [], None  # drain: finish running rows before the update
                can_admit = running == 0 or (self._can_join and running < self.max_batch_size)
                if self._waiting and can_admit:
                    taken = self._take_waiting(running, blocked)
                    if taken or running:
                        return taken, None
                elif running:
                    return [], None
                self._cond.wait()

    def _take_waiting(self, running: int, blocked: set[str | None]) -> list[_Request]:
        """The oldest waiting requests that fit the batch, passing over those whose adapter has
        an update pending (they wait, in their place, for the update)."""
        taken: list[_Request] = []
        held: list[tuple[float, int, _Request]] = []
        rows = running
        while self._waiting:
            request = self._waiting[0][2]
            if request.cancelled():
                heapq.heappop(self._waiting)
                continue
            if request.adapter in blocked:
                held.append(heapq.heappop(self._waiting))
                continue
            n = request.params.n
            if rows + n > self.max_batch_size and rows > 0:
                break
            taken.append(heapq.heappop(self._waiting)[2])
            rows += n
        for item in held:
            heapq.heappush(self._waiting, item)
        return taken

    def _apply_update(self, item: _Update) -> None:
        started = time.perf_counter()
        if item.adapter is not None:
            self._apply_adapter_update(item)
            return
        try:
            check_update(item.update, self.version)
            digest, self._state_digest = self._state_digest, None  # unknown until it succeeds
            self._state_digest = apply_update_(self._state, item.update, digest)
        except Exception as exc:  # noqa: BLE001 - reported to the caller of load_weights
            _resolve(item.loop, item.future, error=exc)
            return
        self.version = item.update.version
        log.debug(
            "v%d: waited %.3fs for running rows to drain, applied in %.3fs",
            self.version,
            started - item.queued_at,
            time.perf_counter() - started,
        )
        _resolve(item.loop, item.future, None)

    def _apply_adapter_update(self, item: _Update) -> None:
        """Write an adapter policy's version into its tensors (the base is never touched)."""
        slot = self._adapters[item.adapter]  # type: ignore[index]
        try:
            check_update(item.update, slot.version)
            digest, slot.digest = slot.digest, None  # unknown until it succeeds
            slot.digest = apply_update_(slot.state, item.update, digest)
        except Exception as exc:  # noqa: BLE001 - reported to the caller of load_weights
            _resolve(item.loop, item.future, error=exc)
            return
        slot.version = item.update.version
        log.debug("adapter %s: v%d", item.adapter, slot.version)
        _resolve(item.loop, item.future, None)

    def _admit(self, requests: list[_Request]) -> None:
        prompts: list[list[int]] = []
        rows: list[SequenceRow] = []
        temperature: list[float] = []
        top_p: list[float] = []
        generators: list[torch.Generator | None] = []
        base = BASE_ADAPTER if self._adapters else None
        for request in requests:
            params = request.params
            slot = self._adapters.get(request.adapter) if request.adapter is not None else None
            request.version = slot.version if slot is not None else self.version
            adapter = slot.name if slot is not None else base
            request.results = [None] * params.n
            request.pending_rows = params.n
            stop_ids = frozenset(params.stop_token_ids) | (
                frozenset() if params.ignore_eos else self.eos_token_ids
            )
            budget = min(params.max_tokens, self.max_context - len(request.prompt_ids))
            for index in range(params.n):
                prompts.append(request.prompt_ids)
                rows.append(
                    SequenceRow(
                        owner=request,
                        index=index,
                        prompt_len=len(request.prompt_ids),
                        max_tokens=budget,
                        stop_token_ids=stop_ids,
                        stop_strings=tuple(params.stop),
                        adapter=adapter,
                    )
                )
                temperature.append(params.temperature)
                top_p.append(params.top_p)
                if params.seed is not None and not params.greedy:
                    gen = torch.Generator(device=self.device)
                    gen.manual_seed(params.seed + index)
                    generators.append(gen)
                else:
                    generators.append(None)
        sampling = RowSampling.build(temperature, top_p, generators, self.device)
        state, logits = DecodeState.prefill(
            self._runner, prompts, rows, sampling, self.pad_token_id, self.device
        )
        self.stats["prefills"] += 1
        self._after_sampling(state, logits)
        if len(state):
            if self._running is None or not len(self._running):
                self._running = state
            else:
                self._running.merge(state)

    def _decode_step(self) -> None:
        state = self._running
        assert state is not None
        cancelled = [i for i, row in enumerate(state.rows) if row.owner.cancelled()]
        if cancelled:
            gone = set(cancelled)
            state.keep([i for i in range(len(state.rows)) if i not in gone])
            if not len(state):
                return
        logits = state.step(self._runner)
        self.stats["steps"] += 1
        self._after_sampling(state, logits)

    def _after_sampling(self, state: DecodeState, logits: torch.Tensor) -> None:
        tokens, logprobs = sample_next(logits, state.sampling, self._generator)
        finished = state.record(tokens, logprobs)
        self.stats["tokens"] += len(state.rows)
        for i, row in enumerate(state.rows):
            if not finished[i] and row.stop_strings:
                hit = self._find_stop_string(row)
                if hit is not None:
                    row.finish_reason, row.matched_stop = "stop", hit
                    finished[i] = True
        if any(finished):
            keep = []
            for i, row in enumerate(state.rows):
                if finished[i]:
                    self._finish_row(row)
                else:
                    keep.append(i)
            state.keep(keep)

    def _find_stop_string(self, row: SequenceRow) -> str | None:
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=False)
        for stop in row.stop_strings:
            if stop and stop in text:
                return stop
        return None

    def _finish_row(self, row: SequenceRow) -> None:
        request: _Request = row.owner
        meta: dict[str, Any] = {"prompt_tokens": row.prompt_len}
        if row.matched_stop is not None:
            meta["stop"] = row.matched_stop
        request.results[row.index] = Generation(
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            finish_reason=row.finish_reason or "length",
            version=request.version,
            meta=meta,
        )
        request.pending_rows -= 1
        if request.pending_rows == 0:
            _resolve(request.loop, request.future, list(request.results))

    def _fail_running(self, exc: Exception, admitted: list[_Request]) -> None:
        owners = {id(r): r for r in admitted}
        if self._running is not None:
            for row in self._running.rows:
                owners[id(row.owner)] = row.owner
        self._running = None
        for request in owners.values():
            _resolve(request.loop, request.future, error=exc)

    def _fail_everything(self, exc: Exception) -> None:
        self._fail_running(exc, [])
        with self._cond:
            waiting, self._waiting = [item[2] for item in self._waiting], []
            updates, self._updates = list(self._updates), deque()
        for request in waiting:
            _resolve(request.loop, request.future, error=exc)
        for item in updates:
            _resolve(item.loop, item.future, error=exc)
