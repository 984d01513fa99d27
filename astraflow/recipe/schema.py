"""Pydantic schema of a TOML recipe.

A recipe is the whole description of a run: which policies exist and how they are served and trained,
which tasks feed which workflow, which dataflow policies shape the data, how many rollout nodes run,
how evaluation and logging work. Every section has defaults so a quickstart recipe stays short;
unknown keys are errors (see :mod:`astraflow.recipe.loader` for the messages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from astraflow.engine_kinds import ADAPTER_ENGINE_KINDS, EngineKind

#: ``dataflow.max_nodes`` by default: active nodes at once (``protocol.bounds.MAX_NODES``).
MAX_NODES_DEFAULT = 1024
#: The highest ``dataflow.max_nodes`` a recipe may set (one service measured to 4,096 nodes on
#: two cores, see docs/architecture.md "How many nodes one service serves").
MAX_NODES_CEILING = 65_536


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    name: str = Field(
        default="run", min_length=1, description="Run name; the run directory is output_dir/name"
    )
    output_dir: Path = Field(
        default=Path("runs"), description="Parent directory of run directories"
    )
    seed: int = Field(default=0, ge=0)
    max_steps: int = Field(default=100, ge=1, description="Optimizer steps per trainable policy")
    launcher: Literal["local", "ray"] = "local"
    ray_address: str = Field(
        default="",
        description='launcher "ray": the cluster to run on: "auto" (the one this machine belongs '
        'to), "HOST:PORT" (its GCS), "ray://HOST:PORT" (Ray Client) or "" (start a local one)',
    )
    mode: Literal["async", "sync"] = Field(
        default="async",
        description="async: independent services (default); sync: lock-step baseline for comparison",
    )
    torch_threads: int = Field(default=1, ge=1, description="torch threads per process")
    max_restarts: int = Field(
        default=3,
        ge=0,
        description=(
            "Times the launcher restarts each crashed service (the dataflow from its store, a "
            "trainer from its newest checkpoint, a rollout node fresh) before the run fails"
        ),
    )
    restart_backoff_s: float = Field(
        default=1.0,
        ge=0.0,
        le=300.0,
        description="Wait before a service's first restart; doubles with each one (max 60 s)",
    )
    stall_s: float = Field(
        default=120.0,
        ge=0.0,
        description=(
            "Stop the run with the cause named when no optimizer step lands for this long while "
            "every episode fails or every group is dropped (0: never)"
        ),
    )
    device_memory_gib: float | None = Field(
        default=None,
        gt=0.0,
        description="Memory of one GPU for the launch plan's fit check (`train --dry-run`); "
        "default: the smallest visible GPU's, else 80 GiB",
    )

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.name


class SamplingConfig(Section):
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=32, ge=1, description="Max new tokens per turn")
    stop: list[str] = Field(default_factory=list)


class LoraConfig(Section):
    """LoRA adapters (peft) instead of full fine-tuning: only the adapters train; nodes still get
    merged weights (or the adapter, where an engine can load one)."""

    r: int = Field(default=8, ge=1, description="Adapter rank")
    alpha: float = Field(default=16.0, gt=0.0, description="Scaling numerator (scale = alpha / r)")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description='Module names to adapt, e.g. ["q_proj", "v_proj"], or "all-linear"',
    )

    @field_validator("target_modules")
    @classmethod
    def _not_empty(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError(
                'must name at least one module (e.g. ["q_proj", "v_proj"]) or be "all-linear"'
            )
        return value


class AdapterConfig(LoraConfig):
    """``policies.NAME.lora`` of a policy with a ``base``: the policy *is* this LoRA adapter of the
    base. Nodes serve every adapter of a base from one engine (the base weights once, requests of
    different adapters in one batch); the adapter's weights alone are its versions (snapshots,
    deltas and digests cover the adapter only)."""

    shared_trainer: bool = Field(
        default=True,
        description=(
            "Train this adapter in the one trainer process of its base, beside the base's other "
            "shared adapters (the base loaded once; each adapter keeps its own optimizer, "
            "version stream and checkpoints); false: a trainer process of its own"
        ),
    )


class TrainerConfig(Section):
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = (
        "dapo"
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        default="token",
        description="PPO ratio per token, or one per sequence (GSPO: 'sequence' with grpo/dr_grpo)",
    )
    off_policy: Literal["truncate", "m2po"] = Field(
        default="truncate",
        description="Correction of stale samples with their behaviour log-probs: TRL's truncated "
        "importance ratio (capped at importance_sampling_cap), or M2PO's second-moment mask",
    )
    m2po_threshold: float = Field(
        default=0.04, gt=0.0, description="M2PO: bound on mean (log ratio)^2 of the tokens kept"
    )
    learning_rate: float = Field(default=1e-5, gt=0.0)
    groups_per_step: int = Field(default=8, ge=1, description="Groups per optimizer step")
    beta: float = Field(
        default=0.0, ge=0.0, description="KL coefficient (0 disables the reference model)"
    )
    epsilon: float = Field(default=0.2, gt=0.0, description="PPO clip range (low)")
    epsilon_high: float | None = Field(
        default=None, description="Upper clip range (DAPO clip-higher)"
    )
    scale_rewards: Literal["group", "batch", "none"] = "group"
    turn_discount: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Turn-level credit: each generated turn's tokens get the group-normalised "
        "discounted return from that turn on (sum over later turns k of turn_discount^(k-t) "
        "r_k, per-turn rewards from the workflow); unset: one advantage per sample from its "
        "total reward",
    )
    importance_sampling_cap: float = Field(
        default=2.0, gt=0.0, description="Truncation of the behaviour/current importance ratio"
    )
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    publish_every: int = Field(
        default=1, ge=1, description="Publish a weight version every k steps"
    )
    checkpoint_every: int = Field(
        default=20,
        ge=1,
        description=(
            "Steps between trainer checkpoints. A restarted trainer resumes from the newest and "
            "retrains the steps after it on the same batches (the dataflow keeps their samples "
            "until a checkpoint covers them): more often costs save time, less often costs "
            "retraining after a crash"
        ),
    )
    keep_versions: int = Field(default=8, ge=1, description="Weight versions kept in the store")
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description=(
            "Compute precision. Weights and AdamW state stay float32 (master weights) in every "
            "case; bfloat16/float16 run the forward and backward under autocast and publish "
            "weights to the nodes in that dtype. auto: bfloat16 on a GPU that supports it, else "
            "float32; on CPU float32 (bfloat16 is allowed there too, float16 is not)"
        ),
    )
    gradient_checkpointing: bool = False
    micro_batch_tokens: int = Field(
        default=8192,
        gt=0,
        description=(
            "Token budget of one forward+backward: each batch (one optimizer step) is split into "
            "micro-batches of at most this many padded tokens (rows x longest row), whose "
            "gradients are accumulated with the whole batch's loss normalisation; a row longer "
            "than the budget is a micro-batch of its own. Bounds the activations' memory "
            "(log-probabilities are computed in tiles, never as a rows x length x vocabulary "
            "tensor)"
        ),
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Passed to trl.GRPOConfig as is (except the keys the trainer refuses: "
        "generation, num_iterations, gradient_accumulation_steps)",
    )
    processes: int = Field(
        default=1,
        ge=1,
        le=1024,
        description=(
            "Trainer processes (one per device), launched with torchrun, or accelerate when "
            "accelerate_config is set; rank 0 alone pulls batches, acknowledges and publishes"
        ),
    )
    accelerate_config: Path | None = Field(
        default=None,
        description=(
            "An accelerate config file (DDP, FSDP or DeepSpeed) passed to `accelerate launch "
            "--config_file`; processes overrides its num_processes"
        ),
    )
    lora: LoraConfig | None = Field(
        default=None, description="Train LoRA adapters (peft) instead of the full model"
    )


class PolicyConfig(Section):
    model: str | None = Field(
        default=None,
        description="builtin:NAME, a Hugging Face model id or a local path (or give base)",
        min_length=1,
    )
    base: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "This policy is a LoRA adapter (see lora) of a base: a frozen policy of this recipe "
            "or a model (builtin:NAME, hub id, path). Adapters of one base share one engine on "
            "each node and, by default, one trainer process"
        ),
    )
    lora: AdapterConfig | None = Field(
        default=None,
        description="With base: the adapter (r, alpha, dropout, target_modules, shared_trainer); "
        "default: r 8, alpha 16, all-linear",
    )
    engine: EngineKind = "transformers"
    trainable: bool = True
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the engine kind (docs/recipes.md, 'Engine arguments'), "
        "checked against the kind's declared arguments (astraflow.rollout.engines.args)",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    max_lag: int | None = Field(
        default=None, ge=0, description="Per-policy admission bound; defaults to dataflow.max_lag"
    )
    tool_parser: str = Field(
        default="auto",
        description="How this policy writes tool calls: hermes, llama3_json, mistral, pythonic "
        "(or a plugin's parser), or 'auto' (read from the model's chat template)",
    )

    @model_validator(mode="after")
    def _model_or_base(self) -> PolicyConfig:
        if self.model is None and self.base is None:
            raise ValueError(
                'needs model = "builtin:NAME" (a hub id or a path), or base = "POLICY_OR_MODEL" '
                "for a LoRA adapter of that base"
            )
        if self.model is not None and self.base is not None:
            raise ValueError(
                f"gives both model ({self.model!r}) and base ({self.base!r}): a full policy has a "
                "model, a LoRA adapter a base; keep one"
            )
        if self.base is None:
            if self.lora is not None:
                raise ValueError(
                    "lora is set but base is not: an adapter policy names its base "
                    '(base = "POLICY_OR_MODEL"); to train a full policy through LoRA with '
                    "merged weights use trainer.lora"
                )
            return self
        if self.trainer.lora is not None:
            raise ValueError(
                "an adapter policy (base set) is already LoRA: configure it in lora, not "
                "trainer.lora (which trains a full policy's adapters and ships merged weights)"
            )
        if self.engine not in ADAPTER_ENGINE_KINDS:
            raise ValueError(
                f"engine = {self.engine!r} cannot serve a LoRA adapter of a base; use one of "
                f"{', '.join(ADAPTER_ENGINE_KINDS)}"
            )
        if not self.trainable:
            raise ValueError(
                "an adapter policy with trainable = false never leaves its initial weights (the "
                "base's own outputs); serve the base itself as a frozen policy instead "
                "(model = ..., trainable = false)"
            )
        if self.lora is None:
            self.lora = AdapterConfig()
        return self

    @model_validator(mode="after")
    def _declared_engine_args(self) -> PolicyConfig:
        """Each key must be an argument the engine kind declares, of its type, and the kind's
        required ones must be there: a misspelt or unknown key used to pass here and crash every
        rollout node at start. Errors are raised per key (``policies.NAME.engine_args.KEY``),
        naming the engine and the accepted keys. A model validator (not a field validator) so
        that it sees an omitted ``engine_args`` too and runs after the model/base checks."""
        from pydantic_core import ValidationError as CoreValidationError

        from astraflow.rollout.engines.args import EngineArgsError, checked_engine_args

        try:
            checked = checked_engine_args(self.engine, self.engine_args)
        except EngineArgsError as exc:
            raise CoreValidationError.from_exception_data(
                "engine_args",
                [
                    {
                        "type": "value_error",
                        "loc": ("engine_args", *key.split(".")) if key else ("engine_args",),
                        "input": value,
                        "ctx": {"error": ValueError(message)},
                    }
                    for key, message, value in exc.problems
                ],
            ) from None
        # the coerced values, set past validate_assignment (which would run this check again)
        self.__dict__["engine_args"] = checked
        return self

    @field_validator("tool_parser")
    @classmethod
    def _known_tool_parser(cls, name: str) -> str:
        from astraflow.tools.parsers import AUTO, tool_parsers

        if name != AUTO:
            registry = tool_parsers()
            if name not in registry:
                raise ValueError(registry.unknown_message(name) + " (or 'auto')")
        return name


class TaskSetConfig(Section):
    name: str = Field(min_length=1, description="Task set name, e.g. arith, gsm8k, math500, mbpp")
    split: str = "train"
    weight: float = Field(default=1.0, gt=0.0, description="Mixing ratio relative to other sets")
    limit: int | None = Field(default=None, ge=1)
    deadline_s: float | None = Field(
        default=None,
        gt=0.0,
        description="Deadline of this set's tasks, seconds after enqueue (the edf policy orders "
        "by it; a task payload's own deadline_s wins)",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict)


_LATENCY_PARAMS = {
    "lognormal": ("mu", "sigma"),
    "fixed": ("value_s",),
    "uniform": ("low_s", "high_s"),
    "pareto": ("scale_s", "alpha"),
}


class LatencyPhase(Section):
    """One phase of a ``[tasks.env_latency]`` schedule: from trainer step ``from_step`` on (the
    newest weight version the node has heard of), every delay is ``scale`` times its draw."""

    from_step: int = Field(ge=0, description="First optimizer step of the phase")
    scale: float = Field(gt=0.0, description="Factor on every delay drawn in the phase")


class EnvLatencyConfig(Section):
    """``[tasks.env_latency]``: a per-call delay in front of every env (``astraflow.envs.wrappers.latency``),
    e.g. to give a fast env the I/O-bound, long-tailed tool latency of real agentic tasks.

    Each distribution takes ``p50_s`` and ``p99_s`` (median and 99th percentile) or its own
    parameters: lognormal ``mu``, ``sigma``; fixed ``value_s`` (or ``p50_s``); uniform ``low_s``,
    ``high_s``; pareto ``scale_s``, ``alpha``. Nothing given: lognormal, p50 0.3 s, p99 5 s."""

    distribution: Literal["lognormal", "fixed", "uniform", "pareto"] = "lognormal"
    p50_s: float | None = Field(default=None, gt=0.0, description="Median delay (seconds)")
    p99_s: float | None = Field(default=None, gt=0.0, description="99th percentile (seconds)")
    mu: float | None = Field(default=None, description="lognormal: mean of ln(delay)")
    sigma: float | None = Field(default=None, gt=0.0, description="lognormal: std of ln(delay)")
    value_s: float | None = Field(default=None, ge=0.0, description="fixed: the delay")
    low_s: float | None = Field(default=None, ge=0.0, description="uniform: lower bound")
    high_s: float | None = Field(default=None, ge=0.0, description="uniform: upper bound")
    scale_s: float | None = Field(default=None, gt=0.0, description="pareto: minimum delay")
    alpha: float | None = Field(default=None, gt=0.0, description="pareto: tail index")
    max_s: float | None = Field(default=None, gt=0.0, description="Cap on every delay (a timeout)")
    seed: int | None = Field(
        default=None, ge=0, description="Seed of the delay streams; default run.seed"
    )
    on: list[Literal["step", "reset", "tool_calls"]] = Field(
        default_factory=lambda: ["step"],
        description="Which env calls are delayed: every step, resets, or only the steps whose "
        "action is tool calls (function-calling envs: the tools, not the final answer's grading)",
    )
    inner: Literal["thread", "inline"] = Field(
        default="thread",
        description="After an async delay, run a sync env in a thread pool or on the event loop "
        "(inline: only for envs whose calls take microseconds)",
    )
    phases: list[LatencyPhase] = Field(
        default_factory=list,
        description="A load that changes during the run: from each phase's from_step on, delays "
        "are scaled by its scale (1 before the first phase)",
    )

    @field_validator("phases")
    @classmethod
    def _phases_in_order(cls, v: list[LatencyPhase]) -> list[LatencyPhase]:
        steps = [ph.from_step for ph in v]
        if steps != sorted(set(steps)):
            raise ValueError(f"phases must have increasing from_step values, got {steps}")
        return v

    @model_validator(mode="after")
    def _params_fit_distribution(self) -> EnvLatencyConfig:
        name = self.distribution
        own = _LATENCY_PARAMS[name]
        foreign = [
            k
            for params in _LATENCY_PARAMS.values()
            for k in params
            if k not in own and getattr(self, k) is not None
        ]
        if foreign:
            raise ValueError(
                f"{name} latency does not take {sorted(set(foreign))}; its parameters are "
                f"{', '.join(own)} (or {'p50_s' if name == 'fixed' else 'p50_s and p99_s'})"
            )
        given = [k for k in own if getattr(self, k) is not None]
        quantiles = [k for k in ("p50_s", "p99_s") if getattr(self, k) is not None]
        if given and quantiles:
            raise ValueError(
                f"{name} latency: give either {' and '.join(own)} or p50_s and p99_s, not both"
            )
        if given and len(given) != len(own):
            raise ValueError(f"{name} latency needs all of {', '.join(own)}; got only {given}")
        if name == "fixed":
            if self.p99_s is not None:
                raise ValueError("fixed latency takes value_s (or p50_s), not p99_s")
            if not given and self.p50_s is None:
                raise ValueError("fixed latency needs value_s (or p50_s)")
            return self
        if len(quantiles) == 1:
            raise ValueError(f"{name} latency: give both p50_s and p99_s, or neither")
        if quantiles and not self.p50_s < self.p99_s:
            raise ValueError(
                f"latency p99_s ({self.p99_s}) must be greater than p50_s ({self.p50_s})"
            )
        if not given and not quantiles and name != "lognormal":
            raise ValueError(f"{name} latency needs {' and '.join(own)}, or p50_s and p99_s")
        if name == "uniform" and given and self.low_s > self.high_s:
            raise ValueError(
                f"uniform latency needs low_s <= high_s, got {self.low_s} > {self.high_s}"
            )
        if name == "uniform" and quantiles and self.p50_s - (self.p99_s - self.p50_s) / 0.98 < 0:
            raise ValueError(
                f"uniform latency with p50_s={self.p50_s}, p99_s={self.p99_s} would reach below "
                "0 s; give low_s and high_s instead"
            )
        return self


class TasksConfig(Section):
    env: str = Field(default="astraflow/Math-v0", description="Env id the tasks run in")
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    env_latency: EnvLatencyConfig | None = Field(
        default=None, description="Per-call delay added to every env (none by default)"
    )
    sets: list[TaskSetConfig] = Field(
        default_factory=lambda: [TaskSetConfig(name="arith")], min_length=1
    )
    group_size: int = Field(default=8, ge=1, le=1024)
    epochs: int | None = Field(
        default=None, ge=1, description="Passes over the sets; None = unbounded"
    )


class WorkflowConfig(Section):
    name: str = Field(default="single_agent", min_length=1)
    roles: dict[str, str] = Field(
        default_factory=lambda: {"agent": "policy"}, description="role -> policy name"
    )
    max_turns: int = Field(default=1, ge=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    agent: str | None = Field(
        default=None,
        description="openai_agent workflow: the agent function, 'package.module:function' or "
        "'path/to/file.py:function'",
    )

    @model_validator(mode="after")
    def _agent_named(self) -> WorkflowConfig:
        if self.agent is not None:
            where, sep, fn = self.agent.partition(":")
            if not sep or not where.strip() or not fn.strip() or ":" in fn:
                raise ValueError(
                    f"workflow.agent must be 'package.module:function' or "
                    f"'path/to/file.py:function', got {self.agent!r}"
                )
            if self.name != "openai_agent":
                raise ValueError(
                    f"workflow.agent is set but workflow.name is {self.name!r}; the agent runs "
                    "only with workflow.name = 'openai_agent'"
                )
        elif self.name == "openai_agent":
            raise ValueError(
                "workflow.name = 'openai_agent' needs workflow.agent = 'package.module:function' "
                "(an async function taking an openai.AsyncOpenAI client and the task payload)"
            )
        return self


class DataflowPolicyConfig(Section):
    name: str = Field(min_length=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class DataflowConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    store: Path | None = Field(default=None, description="SQLite file; default run_dir/dataflow.db")
    max_lag: int = Field(default=4, ge=0, description="Admission control: max versions behind")
    buffer_steps: int = Field(
        default=2,
        ge=0,
        description="Async backpressure: lease no training task while a trainable policy has "
        "this many optimizer steps of groups buffered or in flight (0 = unbounded: no "
        "admission bound at all)",
    )
    admission: Literal["pace", "buffer"] = Field(
        default="pace",
        description="Async admission of training work. 'pace': keep groups in flight plus "
        "buffered within the optimizer steps the trainer needs to stay busy, ceil(group time / "
        "step time) (measured: lease to complete group, batch served to acked), and never "
        "more than buffer_steps or max_lag steps of groups, so samples are trained about as "
        "fresh as the pipeline allows (one step at the start, before anything is measured). "
        "'buffer': buffer_steps steps of groups, whatever the pace",
    )
    lease_timeout_s: float = Field(default=120.0, gt=0.0)
    lease_progress_s: float | None = Field(
        default=None,
        gt=0.0,
        description="Longest a lease may go without progress (a push or an accepted save of "
        "its episodes): heartbeats renew a lease only up to this long after its last progress, "
        "then it expires, its task goes back to the queue and its node gets no new training "
        "lease for this long (throttled). None: 5 * lease_timeout_s (600 s by default). Raise "
        "it for groups that run longer than that without rollout.checkpoint_after_s saves",
    )
    max_leases_per_node: int | None = Field(
        default=None,
        ge=1,
        description="Most active training leases one node may hold at once (a node asking for "
        "more gets what fits). None: 2 * ceil(rollout.concurrency / tasks.group_size), twice "
        "what a node of the recipe's own concurrency can run, and at least 64",
    )
    heartbeat_interval_s: float = Field(
        default=2.0,
        gt=0.0,
        description="Each node's heartbeat interval, while the pool stays within "
        "max_heartbeats_per_s; a larger pool is asked to heartbeat less often",
    )
    max_heartbeats_per_s: float = Field(
        default=512.0,
        gt=0.0,
        description="Heartbeats a second the service asks of the whole pool: with more than "
        "heartbeat_interval_s * max_heartbeats_per_s nodes (1,024 by default) each node is told "
        "(at registration and in every heartbeat reply) to heartbeat every nodes / "
        "max_heartbeats_per_s seconds instead, at most lease_timeout_s / 4",
    )
    max_nodes: int = Field(
        default=MAX_NODES_DEFAULT,
        ge=1,
        le=MAX_NODES_CEILING,
        description="Most rollout nodes registered (active) at once; 429 beyond. The node token "
        "is shared by every node of a run, so this bounds the registrations one token can make",
    )
    max_body_mb: float = Field(default=64.0, gt=0.0)
    policies: list[DataflowPolicyConfig] = Field(default_factory=list)


class RolloutConfig(Section):
    nodes: int = Field(default=1, ge=0, description="Rollout nodes started by the local launcher")
    concurrency: int = Field(default=16, ge=1, description="Episodes in flight per node")
    region: str = "local"
    device: str = Field(
        default="auto",
        description="auto | cpu | cuda | cuda:N: every node's device, unless devices is set",
    )
    devices: list[list[int]] | None = Field(
        default=None,
        description="The GPUs of each node, in node order (node-0 first): a device or a list of "
        "adjacent devices (a tensor-parallel vLLM engine uses the first tensor_parallel_size), "
        "e.g. [2, 3] or [[0, 1], [2, 3]]; the launcher sets them as the node's "
        "CUDA_VISIBLE_DEVICES, shared by its engines. Unset: rollout.device for every node",
    )
    env_workers: int = Field(
        default=32,
        ge=1,
        description="Threads per node running sync env calls (reset/step/close, env construction) "
        "off the node's event loop; envs with async areset/astep need none",
    )
    env_timeout_s: float = Field(
        default=120.0,
        gt=0.0,
        description="Limit of one env call; past it the env is closed (its sandbox killed) and "
        "the episode is recorded with finish_reason 'env_timeout'",
    )
    checkpoint_after_s: float | None = Field(
        default=None,
        ge=0.0,
        description="Save an episode in flight to the dataflow service once it has run this "
        "long, then after a finished turn at most once per this many seconds, so that if its "
        "node dies another node resumes it from the saved turn instead of playing it again "
        "(resumable workflows such as single_agent over envs with state_dict, e.g. the math and "
        "code envs); None: never saved",
    )

    @field_validator("devices", mode="before")
    @classmethod
    def _devices_per_node(cls, v: Any) -> Any:
        """``[2, 3]`` (a device per node) or ``[[0, 1], [2, 3]]`` (devices per node)."""
        if not isinstance(v, list):
            return v
        out = [d if isinstance(d, list) else [d] for d in v]
        for entry in out:
            if not entry or any(
                not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in entry
            ):
                raise ValueError(
                    f"rollout.devices entry {entry!r}: expected a device number >= 0 or a "
                    "non-empty list of them, e.g. [2, 3] or [[0, 1], [2, 3]]"
                )
            if len(set(entry)) != len(entry):
                raise ValueError(f"rollout.devices entry {entry!r} names a device twice")
        return out


class AutoscaleConfig(Section):
    """``[autoscale]``: the launcher grows and shrinks its rollout pool between ``min_nodes`` and
    ``max_nodes`` from what ``GET /status`` says (:mod:`astraflow.launch.autoscale`).

    It grows, to the nodes the load needs (the fed trainer's pace times a group's time, over a
    node's slots), while every node's slots are taken and the trainer waits for data (idle above
    ``target_trainer_idle``, or the groups buffered and in flight below ``target_buffer_fill`` of
    the admission cap) or the load already needs more nodes; it shrinks one node when the trainer
    is fed and the groups in flight and the load (with 20 % to spare) fit on one node fewer for
    ``cooldown_s``. A decision must hold ``sustain`` intervals in a row and waits ``cooldown_s``
    after the previous change; a node leaves by draining (SIGTERM: it finishes or hands back its
    groups)."""

    enabled: bool = Field(default=False, description="Run the control loop")
    min_nodes: int = Field(default=1, ge=0, description="Fewest launcher nodes")
    max_nodes: int = Field(default=4, ge=1, description="Most launcher nodes")
    target_trainer_idle: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description="Grow while the trainer waits for batches more than this fraction of the time "
        "(shrink only below half of it), e.g. 0.2; unset: not a target",
    )
    target_buffer_fill: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Grow while buffered + in-flight groups fill less than this fraction of the "
        "admission cap (async mode), e.g. 0.9; unset: not a target",
    )
    cooldown_s: float = Field(
        default=30.0,
        ge=0.0,
        description="Seconds between two changes, and that a surplus must last before a shrink",
    )
    interval_s: float = Field(default=5.0, gt=0.0, description="Seconds between two decisions")
    sustain: int = Field(
        default=2, ge=1, description="Intervals in a row a grow or shrink must be called for"
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleConfig:
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"autoscale.min_nodes ({self.min_nodes}) is above autoscale.max_nodes "
                f"({self.max_nodes})"
            )
        if self.enabled and self.target_trainer_idle is None and self.target_buffer_fill is None:
            raise ValueError(
                "autoscale is enabled with no target: set target_trainer_idle (e.g. 0.2) or "
                "target_buffer_fill (e.g. 0.8)"
            )
        return self


class EvaluationConfig(Section):
    every_steps: int = Field(default=10, ge=0, description="0 disables periodic evaluation")
    task_set: str | None = Field(default=None, description="Defaults to the first training set")
    split: str = "test"
    num_tasks: int = Field(default=200, ge=1)
    max_tokens: int | None = None
    at_start: bool = True


class LoggingConfig(Section):
    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        # An old recipe's key that never had an effect: a clear error, not a silent no-op.
        if isinstance(data, dict) and "log_every" in data:
            raise ValueError(
                "logging.log_every was removed: it never changed anything (every step is logged "
                "to metrics.jsonl); delete the key from the recipe"
            )
        return data

    level: Literal["debug", "info", "warning", "error"] = "info"
    live: bool = Field(default=True, description="Live rich view in `astraflow train`")
    report: bool = Field(default=True, description="Write plots and summary at the end")
    dashboard: bool = Field(
        default=True, description="`astraflow train` serves the web dashboard (address printed)"
    )
    dashboard_port: int = Field(
        default=0, ge=0, le=65535, description="Port of the dashboard (0: a free one)"
    )
    transcripts_per_step: int = Field(
        default=4,
        ge=0,
        le=256,
        description="Finished episodes the dataflow keeps per weight version (and as many failed "
        "ones) for `astraflow transcripts` and the dashboard (0: none)",
    )
    backends: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description="Experiment trackers fed from metrics.jsonl by the launcher: tensorboard "
        "(run_dir/tensorboard; extra astraflow[tensorboard]) and wandb (extra astraflow[wandb])",
    )
    wandb_project: str = Field(default="astraflow", min_length=1, description="W&B project")
    wandb_entity: str | None = Field(default=None, description="W&B entity (team or user)")
    wandb_mode: Literal["offline", "online"] = Field(
        default="offline",
        description="offline: write run_dir/wandb, no network (upload later with `wandb sync`); "
        "online: stream to the W&B server",
    )

    @field_validator("backends")
    @classmethod
    def _backends_once(cls, v: list[str]) -> list[str]:
        dupes = sorted({b for b in v if v.count(b) > 1})
        if dupes:
            raise ValueError(f"logging.backends lists {', '.join(dupes)} more than once")
        return v


class SecurityConfig(Section):
    """``[security]``: HTTPS between the run's services (bearer tokens are always role-scoped:
    the local launcher gives nodes node tokens and trainers trainer tokens)."""

    tls: bool = Field(
        default=False,
        description="Serve the dataflow service and the trainers' weight servers over HTTPS; "
        "without cert_file/key_file the local launcher creates a CA and a certificate in "
        "run_dir/tls",
    )
    cert_file: Path | None = Field(default=None, description="Server certificate chain (PEM)")
    key_file: Path | None = Field(default=None, description="Private key of cert_file (PEM)")
    ca_file: Path | None = Field(
        default=None,
        description="CA that clients verify the services against (default: the generated CA, "
        "or the system trust store when cert_file is given)",
    )
    cert_hosts: list[str] = Field(
        default_factory=list,
        description="Extra host names/IPs for the generated certificate (loopback, this "
        "machine's hostname and dataflow.host are always in it)",
    )

    @model_validator(mode="after")
    def _files_need_tls(self) -> SecurityConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("security.cert_file and security.key_file go together: give both")
        given = [k for k in ("cert_file", "key_file", "ca_file") if getattr(self, k) is not None]
        if given and not self.tls:
            raise ValueError(f"security.{given[0]} is set but security.tls is false")
        return self


class RayPlacement(Section):
    """Where and with what one Ray actor of a run is placed (``[ray.dataflow]``,
    ``[ray.trainer]``, ``[ray.trainers.NAME]``, ``[ray.rollout]``, each ``ray.rollout_pools``
    entry). Unset values are Ray's defaults (an actor needs 1 CPU to be placed, 0 to run)."""

    num_cpus: float | None = Field(default=None, ge=0.0, description="CPUs the actor reserves")
    num_gpus: float | None = Field(default=None, ge=0.0, description="GPUs the actor reserves")
    memory_gb: float | None = Field(default=None, gt=0.0, description="Memory it reserves (GiB)")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom resources it needs, e.g. { trainer_host = 1 } for hosts started "
        "with `ray start --resources '{\"trainer_host\": 8}'`",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description='Node labels it must run on, e.g. { region = "us-west" } for hosts started '
        "with `ray start --labels region=us-west`",
    )

    @field_validator("resources")
    @classmethod
    def _non_negative(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if x < 0}
        if bad:
            raise ValueError(f"resource amounts must be >= 0, got {bad}")
        return v


class RolloutPoolConfig(RayPlacement):
    nodes: int = Field(ge=1, description="Rollout nodes placed this way")


class RayConfig(Section):
    """``[ray]``: placement of each service for ``run.launcher = "ray"`` (ignored otherwise)."""

    namespace: str = Field(default="astraflow", min_length=1, description="Ray namespace")
    dataflow: RayPlacement = Field(default_factory=RayPlacement)
    trainer: RayPlacement = Field(
        default_factory=RayPlacement, description="Every trainer without a [ray.trainers.NAME]"
    )
    trainers: dict[str, RayPlacement] = Field(
        default_factory=dict, description="Per trainable policy: its trainer's placement"
    )
    rollout: RayPlacement = Field(
        default_factory=RayPlacement, description="Every rollout node not in a pool"
    )
    rollout_pools: list[RolloutPoolConfig] = Field(
        default_factory=list,
        description="Rollout nodes by pool, in order (node-0.. to the first pool, and so on); "
        "nodes beyond the pools use [ray.rollout]",
    )
    startup_timeout_s: float = Field(
        default=120.0, gt=0.0, description="Wait for each actor to be placed and started"
    )

    def trainer_for(self, policy: str) -> RayPlacement:
        return self.trainers.get(policy, self.trainer)

    def node_for(self, index: int) -> RayPlacement:
        first = 0
        for pool in self.rollout_pools:
            if index < first + pool.nodes:
                return pool
            first += pool.nodes
        return self.rollout


class Recipe(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    policies: dict[str, PolicyConfig] = Field(
        min_length=1,
        description='at least one [policies.NAME] table with a model, e.g. model = "builtin:tiny-arith"',
    )
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig)
    dataflow: DataflowConfig = Field(default_factory=DataflowConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    autoscale: AutoscaleConfig = Field(default_factory=AutoscaleConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("policies")
    @classmethod
    def _policy_names(cls, v: dict[str, PolicyConfig]) -> dict[str, PolicyConfig]:
        for name in v:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"policy name {name!r} must be letters, digits, '-' or '_'")
        return v

    @model_validator(mode="after")
    def _roles_map_to_policies(self) -> Recipe:
        for role, policy in self.workflow.roles.items():
            if policy not in self.policies:
                known = ", ".join(sorted(self.policies))
                raise ValueError(
                    f"workflow.roles.{role} names policy {policy!r}, which is not defined; "
                    f"defined policies: {known}"
                )
        return self

    @model_validator(mode="after")
    def _ray_placement_fits(self) -> Recipe:
        unknown = sorted(set(self.ray.trainers) - set(self.trainable_policies()))
        if unknown:
            raise ValueError(
                f"ray.trainers names {unknown}, which are not trainable policies; trainable: "
                f"{', '.join(self.trainable_policies()) or 'none'}"
            )
        for group in self.trainer_processes():
            inner = sorted(set(group[1:]) & set(self.ray.trainers))
            if inner:
                raise ValueError(
                    f"ray.trainers names {inner}, adapters trained in the trainer process of "
                    f"{group[0]!r} (with {', '.join(group[1:])}); place that process with "
                    f"[ray.trainers.{group[0]}]"
                )
        pooled = sum(p.nodes for p in self.ray.rollout_pools)
        if pooled > self.rollout.nodes:
            raise ValueError(
                f"ray.rollout_pools place {pooled} nodes but rollout.nodes is "
                f"{self.rollout.nodes}; raise rollout.nodes or shrink the pools"
            )
        return self

    @model_validator(mode="after")
    def _lock_step_rounds_fit_every_policy(self) -> Recipe:
        """A lock-step round is one task per group of the largest ``groups_per_step`` and every
        policy trains one step on all of the round's groups; a policy asking for fewer would
        silently train more samples per step than its recipe says (and than async trains)."""
        if self.run.mode != "sync":
            return self
        sizes = {p: self.policies[p].trainer.groups_per_step for p in self.trainable_policies()}
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{p} {n}" for p, n in sizes.items())
            raise ValueError(
                'run.mode = "sync" trains every policy one step per round on all of the '
                "round's groups, so trainable policies need the same trainer.groups_per_step "
                f'(here {listed}); set them equal, or use run.mode = "async" (each policy steps '
                "at its own groups_per_step)"
            )
        return self

    @model_validator(mode="after")
    def _autoscale_fits(self) -> Recipe:
        a = self.autoscale
        if not a.enabled:
            return self
        if not a.min_nodes <= self.rollout.nodes <= a.max_nodes:
            raise ValueError(
                f"rollout.nodes ({self.rollout.nodes}) is the autoscaled pool's first size and "
                f"must lie within autoscale.min_nodes..max_nodes ({a.min_nodes}..{a.max_nodes})"
            )
        if a.target_buffer_fill is not None and self.run.mode == "sync":
            raise ValueError(
                'autoscale.target_buffer_fill needs run.mode = "async" (lock-step rounds have '
                "no admission cap to fill); use target_trainer_idle"
            )
        return self

    @model_validator(mode="after")
    def _adapters_fit_their_base(self) -> Recipe:
        for name, p in self.policies.items():
            if p.base is None or p.base not in self.policies:
                continue
            base = self.policies[p.base]
            if base.base is not None:
                raise ValueError(
                    f"policies.{name}.base names policy {p.base!r}, itself an adapter of "
                    f"{base.base!r}; adapters stack on a full model: set base = {base.base!r}"
                )
            if base.trainable:
                raise ValueError(
                    f"policies.{name}.base names policy {p.base!r}, which is trainable: its "
                    "weights would move under its adapters; set "
                    f"policies.{p.base}.trainable = false, or base = {base.model!r} (the model)"
                )
        for key, names in self.adapter_groups().items():
            served = [key, *names] if key in self.policies else names
            first = served[0]
            for other in served[1:]:
                for field in ("engine", "engine_args"):
                    a = getattr(self.policies[first], field)
                    b = getattr(self.policies[other], field)
                    if a != b:
                        raise ValueError(
                            f"policies.{other}.{field} = {b!r} but policies.{first}.{field} = "
                            f"{a!r}: the adapters of base {key!r} share one engine on each "
                            "node, so they must agree"
                        )
        for group in self.trainer_processes():
            if len(group) < 2:
                continue
            for name in group:
                t = self.policies[name].trainer
                if t.processes != 1 or t.accelerate_config is not None:
                    raise ValueError(
                        f"policies.{name}.trainer: processes = {t.processes} / accelerate_config "
                        "needs a trainer process of its own, but the adapter shares one with "
                        f"{', '.join(n for n in group if n != name)}; set "
                        f"policies.{name}.lora.shared_trainer = false"
                    )
            for field in ("device", "dtype"):
                values = {getattr(self.policies[n].trainer, field) for n in group}
                if len(values) > 1:
                    raise ValueError(
                        f"trainer.{field} differs between {', '.join(group)} ({sorted(values)}), "
                        "which share one trainer process (one base in memory); make them agree "
                        "or set lora.shared_trainer = false on one"
                    )
        return self

    def trainable_policies(self) -> list[str]:
        return [n for n, p in self.policies.items() if p.trainable]

    def model_of(self, policy: str) -> str:
        """The model ``policy`` runs: its own, or its base's (an adapter's base policy or model)."""
        p = self.policies[policy]
        if p.model is not None:
            return p.model
        assert p.base is not None
        base = self.policies.get(p.base)
        return base.model if base is not None and base.model is not None else p.base

    def adapter_groups(self) -> dict[str, list[str]]:
        """Base key -> the adapter policies of that base, in recipe order."""
        groups: dict[str, list[str]] = {}
        for name, p in self.policies.items():
            if p.base is not None:
                groups.setdefault(p.base, []).append(name)
        return groups

    def trainer_processes(self) -> list[tuple[str, ...]]:
        """The trainer processes of the run, each the trainable policies it trains (in recipe
        order): one per full policy and per adapter with ``lora.shared_trainer = false``, one per
        base for its shared adapters."""
        groups: list[list[str]] = []
        shared: dict[str, list[str]] = {}  # base key -> its shared group (a list in groups)
        for name in self.trainable_policies():
            p = self.policies[name]
            if p.base is None or p.lora is None or not p.lora.shared_trainer:
                groups.append([name])
            elif p.base in shared:
                shared[p.base].append(name)
            else:
                shared[p.base] = [name]
                groups.append(shared[p.base])
        return [tuple(g) for g in groups]

    def trainer_process_of(self, policy: str) -> tuple[str, ...]:
        """The policies trained in the same process as ``policy`` (itself included)."""
        for group in self.trainer_processes():
            if policy in group:
                return group
        raise ValueError(f"policy {policy!r} is not trainable; it has no trainer")

    def max_lag_for(self, policy: str) -> int:
        p = self.policies[policy]
        return self.dataflow.max_lag if p.max_lag is None else p.max_lag

    def max_completion_length(self, policy: str) -> int:
        """The most tokens ``policy`` generates in one episode (``sampling.max_tokens`` per turn,
        ``workflow.max_turns`` turns): TRL's ``max_completion_length``, the ``dr_grpo`` loss's
        normaliser. One definition, so the trainer and a TRL baseline normalise alike."""
        return self.policies[policy].sampling.max_tokens * self.workflow.max_turns
