"""The arguments each engine kind accepts: one typed model per kind, the one place they are declared.

Why: ``policies.NAME.engine_args`` used to be a free-form dict handed to the engine's constructor
unchanged, so a recipe whose vLLM policy set ``gpu_memory_utilization`` (a ``vllm serve`` flag the
engine did not know) passed ``astraflow recipe check`` and crashed every rollout node at start.
Now each kind declares what it takes here; the recipe schema, :func:`~astraflow.rollout.engines.
make_engine` (so ``astraflow serve policy`` / ``astraflow eval`` ``--engine-arg`` too) and the
preflight all validate against these models, and a misspelt or ill-typed key is refused with the
key, the engine and the accepted keys.

Every declared argument acts: each field is a constructor argument of its engine (a test checks
the names against the constructors), and each vLLM server flag reaches the server's command line
(:func:`~astraflow.rollout.engines.vllm_engine.vllm_server_command`). A server flag on an engine
that attaches to a running server (``base_url``) would do nothing, so it is refused too.

Engine kinds are the closed list of :mod:`astraflow.engine_kinds`: there are no plugin engine
kinds, so no engine's arguments pass unchecked. The one pass-through is vLLM's
``extra_server_args``, a list of further ``vllm serve`` flags.

Imports pydantic only (no torch, no HTTP client): the recipe loader reads this module.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from astraflow.engine_kinds import ENGINE_KINDS
from astraflow.errors import AstraFlowError


class EngineArgsError(AstraFlowError, ValueError):
    """``engine_args`` that an engine kind does not accept: one ``(key, message, value)`` per
    problem (``key`` empty for a problem of the whole table, e.g. two keys that contradict)."""

    def __init__(self, kind: str, problems: list[tuple[str, str, Any]]):
        self.kind = kind
        self.problems = problems
        lines = [
            f"engine_args.{key} = {value!r}: {message}" if key else f"engine_args: {message}"
            for key, message, value in problems
        ]
        super().__init__("; ".join(lines))


class EngineArgs(BaseModel):
    """Base of the per-kind models: unknown keys are errors, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TransformersEngineArgs(EngineArgs):
    """:class:`~astraflow.rollout.engines.transformers_engine.TransformersEngine` (in process)."""

    device: str = Field(
        default="auto",
        min_length=1,
        description="auto (CUDA when available), cpu, cuda, cuda:1, ...; a rollout node defaults "
        "it to rollout.device",
    )
    dtype: Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"] = Field(
        default="auto",
        description="auto: the checkpoint's dtype (float32 on CPU for half-precision checkpoints)",
    )
    max_batch_size: int = Field(default=128, ge=1, description="Decode rows batched together")
    num_threads: int | None = Field(
        default=1, ge=1, description="torch CPU threads (None: torch's default)"
    )
    seed: int | None = Field(default=None, description="Sampling seed (None: not seeded)")
    attn_implementation: str | None = Field(
        default="sdpa", description="transformers attention implementation (sdpa, eager, ...)"
    )


#: The declared vLLM arguments that become ``vllm serve`` flags: field name -> flag.
VLLM_SERVER_FLAGS: dict[str, str] = {
    "dtype": "--dtype",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "tensor_parallel_size": "--tensor-parallel-size",
    "enable_prefix_caching": "--enable-prefix-caching",
    "max_num_seqs": "--max-num-seqs",
    "quantization": "--quantization",
    "enforce_eager": "--enforce-eager",
}

#: Flags the engine itself sets on every server it starts: a pass-through copy would contradict it.
VLLM_ENGINE_OWNED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--api-key",
    "--logprobs-mode",
)

#: Arguments that act only on a server the engine starts (refused with ``base_url``).
VLLM_STARTED_SERVER_ONLY = (
    *VLLM_SERVER_FLAGS,
    "extra_server_args",
    "python",
    "host",
    "port",
    "env",
    "startup_timeout",
)


class VllmEngineArgs(EngineArgs):
    """:class:`~astraflow.rollout.engines.vllm_engine.VllmEngine`: a vLLM server it starts
    (``python``) or attaches to (``base_url``)."""

    python: str | None = Field(
        default=None,
        min_length=1,
        description="Interpreter of the virtualenv with vLLM (default: $ASTRAFLOW_VLLM_PYTHON)",
    )
    base_url: str | None = Field(
        default=None,
        min_length=1,
        description="Attach to a running vLLM server instead of starting one",
    )
    served_model_name: str = Field(default="policy", min_length=1)
    host: str = Field(default="127.0.0.1", min_length=1, description="Address the server binds")
    port: int | None = Field(default=None, ge=1, le=65535, description="None: a free port")
    api_key: str | None = Field(default=None, description="The server's --api-key")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of the server process"
    )
    workdir: str | None = Field(
        default=None, description="Served copy of the checkpoint and the server log (a temp dir)"
    )
    startup_timeout: float = Field(default=900.0, gt=0, description="Seconds to wait for /health")
    request_timeout: float = Field(default=600.0, gt=0)
    max_connections: int = Field(default=256, ge=1)
    priority_scheduling: bool | None = Field(
        default=None,
        description="Send request priorities (oldest group first); default: on for a server the "
        "engine starts, off when attached",
    )
    # -- vllm serve flags (VLLM_SERVER_FLAGS) ---------------------------------------------------
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="auto", description="--dtype"
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="--max-model-len: context length (prompt + completion)"
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="--gpu-memory-utilization: fraction of each GPU's memory vLLM may take",
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, description="--tensor-parallel-size: GPUs one server shards over"
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="--enable-prefix-caching / --no-enable-prefix-caching (None: vLLM's default)",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="--max-num-seqs: sequences decoded together"
    )
    quantization: str | None = Field(
        default=None, min_length=1, description="--quantization (awq, gptq, fp8, ...)"
    )
    enforce_eager: bool = Field(
        default=False, description="--enforce-eager: no CUDA graphs (less memory, slower)"
    )
    extra_server_args: list[str] = Field(
        default_factory=list,
        description="Further `vllm serve` flags, passed through as written, e.g. "
        '["--swap-space", "8"]',
    )

    @model_validator(mode="after")
    def _acts(self) -> VllmEngineArgs:
        """Refuse what would do nothing or contradict a declared key: server flags on an attached
        server, and pass-through copies of declared or engine-owned flags."""
        if self.base_url is not None:
            idle = [k for k in VLLM_STARTED_SERVER_ONLY if k in self.model_fields_set]
            if idle:
                raise ValueError(
                    f"{', '.join(idle)} act only on a server the engine starts, but base_url "
                    "attaches to a running one: set them on that server, or drop base_url"
                )
        for arg in self.extra_server_args:
            flag = arg.split("=", 1)[0]
            declared = [k for k, f in VLLM_SERVER_FLAGS.items() if flag in (f, _negated(f))]
            if declared:
                raise ValueError(
                    f"extra_server_args has {flag}: set engine_args.{declared[0]} instead (a "
                    "declared argument, checked and shown in the launch plan)"
                )
            if flag in VLLM_ENGINE_OWNED_FLAGS:
                raise ValueError(
                    f"extra_server_args has {flag}, which the engine sets itself; drop it"
                    + (" (use engine_args.api_key)" if flag == "--api-key" else "")
                )
        return self


def _negated(flag: str) -> str:
    return "--no-" + flag.removeprefix("--")


class OpenAIEngineArgs(EngineArgs):
    """:class:`~astraflow.rollout.engines.openai_engine.OpenAIEngine`: a model served elsewhere
    behind an OpenAI-compatible API (frozen policies only: it takes no weight updates)."""

    base_url: str = Field(min_length=1, description="The API's address, e.g. http://host:8000/v1")
    api_key: str | None = Field(default=None, description="Sent as a Bearer token")
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer path or hub id (token-id completions); default: the model when it "
        "is a local directory",
    )
    mode: Literal["auto", "completions", "completions-text", "chat"] = "auto"
    timeout: float = Field(default=600.0, gt=0, description="Seconds per request")
    max_connections: int = Field(default=64, ge=1)


#: Engine kind -> the model of the arguments it accepts: every kind of
#: :data:`astraflow.engine_kinds.ENGINE_KINDS` (a test holds the two together).
ENGINE_ARGS: dict[str, type[EngineArgs]] = {
    "transformers": TransformersEngineArgs,
    "vllm": VllmEngineArgs,
    "openai": OpenAIEngineArgs,
}


def engine_args_model(kind: str) -> type[EngineArgs]:
    """The arguments model of engine ``kind``; a ValueError naming the kinds for any other."""
    try:
        return ENGINE_ARGS[kind]
    except KeyError:
        raise ValueError(
            f"unknown engine kind {kind!r}; expected one of {', '.join(ENGINE_KINDS)}"
        ) from None


def accepted_args(kind: str) -> list[str]:
    """The keys engine ``kind`` accepts, sorted (as error messages list them)."""
    return sorted(engine_args_model(kind).model_fields)


def _expected(err: Mapping[str, Any]) -> str:
    msg = str(err["msg"])
    for prefix in ("Input should be ", "Value should be "):
        if msg.startswith(prefix):
            return "expected " + msg[len(prefix) :]
    return msg.removeprefix("Value error, ")


def parse_engine_args(kind: str, args: Mapping[str, Any]) -> EngineArgs:
    """``args`` validated as engine ``kind``'s arguments; an :class:`EngineArgsError` naming each
    bad key, the engine and (for an unknown key) every accepted key.

    Other components read a recipe's settings through this, e.g. the launch plan:
    ``parse_engine_args("vllm", policy.engine_args).gpu_memory_utilization``.
    """
    model = engine_args_model(kind)
    if not isinstance(args, Mapping):
        raise EngineArgsError(kind, [("", "expected a table of arguments", args)])
    try:
        return model.model_validate(dict(args))
    except ValidationError as exc:
        problems: list[tuple[str, str, Any]] = []
        accepted = accepted_args(kind)
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.75)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(
                    (
                        key,
                        f"not an argument of the {kind} engine{hint}; accepted: "
                        + ", ".join(accepted),
                        err["input"],
                    )
                )
            elif err["type"] == "missing":
                info = model.model_fields[key]
                what = f" ({info.description})" if info.description else ""
                problems.append((key, f"missing; required by the {kind} engine{what}", None))
            elif not key:  # a cross-key check (the model's validator)
                problems.append(("", f"{kind} engine: {_expected(err)}", dict(args)))
            else:
                problems.append((key, f"{_expected(err)} ({kind} engine)", err["input"]))
        raise EngineArgsError(kind, problems) from None


def checked_engine_args(kind: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` validated and coerced, keeping only the keys given (defaults stay unset, so a
    recipe renders back as it was written and a rollout node can still fill in its own)."""
    return parse_engine_args(kind, args).model_dump(exclude_unset=True)
