"""The launch plan: every process a recipe's run would start, with its devices and memory.

Why a plan computed before anything starts: a GPU run that does not fit fails minutes later
(models loaded, vLLM servers warming up) with an out-of-memory error in one service's log, and a
device a recipe names (``trainer.device = "cuda:1"``) only means something if the launcher turns
it into the process's ``CUDA_VISIBLE_DEVICES``. :func:`build_plan` reads the recipe and the
machine (device count and memory; nothing is started, no weights are loaded) and returns a
:class:`LaunchPlan`: the dataflow service, each trainer (and its torchrun ranks), each rollout node
and each vLLM server a node starts, with its command line, its environment, its engine arguments
and its memory on each device. ``astraflow train --dry-run`` prints it; the local and Ray launchers
start their processes from it (:meth:`LaunchPlan.env_for`, :func:`dataflow_argv`,
:func:`node_argv`), and :meth:`LaunchPlan.check` refuses an over-subscribed device before anything
starts.

Devices (logical indices into the GPUs the launcher sees: its own ``CUDA_VISIBLE_DEVICES`` when
set, else every GPU of the machine):

* a trainer: ``trainer.device`` -- ``"cuda:N"`` is device N, ``"cuda"`` device 0, ``"auto"`` device 0
  when the machine has GPUs (else CPU); ``processes = P`` takes P adjacent devices from there;
* a rollout node: ``rollout.devices`` (one entry per node: a device or a list of devices), else
  ``rollout.device`` as for a trainer (every node on that device); a node's engines share its
  devices, and a tensor-parallel vLLM engine (``engine_args.tensor_parallel_size = k``) uses the
  node's first k devices, which must be k (derived devices are adjacent: N..N+k-1);
* under Ray, a service's devices are those Ray reserves for its actor (``num_gpus`` of its
  ``[ray.*]`` placement); the actor sets them as ``CUDA_VISIBLE_DEVICES`` (:data:`RAY_GPUS`).

Memory: :func:`trainer_memory` (one documented formula) for trainers; ``gpu_memory_utilization``
x device memory for each vLLM server on each of its devices; the weights at the engine's dtype for
a transformers engine on a GPU.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from astraflow.errors import AstraFlowError
from astraflow.launch.processes import astraflow_argv
from astraflow.launch.ray_actor import RAY_GPUS
from astraflow.launch.trainer_command import trainer_argv, trainer_service_name
from astraflow.recipe import Recipe

GIB = 2**30
#: Device memory assumed when neither the recipe (``run.device_memory_gib``), the command line
#: (``--device-memory-gib``) nor a visible GPU says (an 80 GiB A100/H100).
DEFAULT_DEVICE_MEMORY_GIB = 80.0
#: vLLM's own default ``gpu_memory_utilization`` (what a server takes when the recipe sets none).
VLLM_DEFAULT_UTILIZATION = 0.9
#: Prompt tokens assumed on top of a policy's completion budget when its engine sets no
#: ``max_model_len`` (the recipe bounds completions, not prompts).
DEFAULT_PROMPT_TOKENS = 1024
#: Bytes per logit: the trainer's log-probabilities are taken in float32.
LOGIT_BYTES = 4
#: The dataflow URL in a plan made before the service runs (the launcher fills in the real one).
DATAFLOW_URL = "<dataflow-url>"

Kind = Literal["dataflow", "trainer", "rank", "node", "engine"]


class PlanError(AstraFlowError, ValueError):
    """A plan that cannot run: a device over-subscribed, a device that does not exist, a model
    whose size cannot be known. The message names the processes, keys and numbers."""


# ---------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model, read from its config (no weights loaded)."""

    parameters: int
    hidden_size: int
    layers: int
    vocab_size: int
    max_positions: int | None
    source: str  # where the config came from


@functools.lru_cache(maxsize=32)
def model_shape(model: str) -> ModelShape:
    """The shape of ``model`` (``builtin:NAME``, a local checkpoint directory or a Hugging Face id
    in the local cache), from its config alone: the parameters are counted on a model built on
    torch's ``meta`` device, so nothing is downloaded or allocated. Raises :class:`PlanError`
    saying what to do when no config can be found."""
    from astraflow.models import resolve_model

    try:
        path = resolve_model(model)
    except (ValueError, FileNotFoundError) as exc:
        raise PlanError(str(exc)) from exc
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    local = Path(path).expanduser()
    try:
        if local.is_dir():
            config = AutoConfig.from_pretrained(str(local))
            source = str(local)
        else:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            source = f"{path} (local Hugging Face cache)"
    except (OSError, ValueError) as exc:
        raise PlanError(
            f"model {model!r} is absent: it is neither a local checkpoint directory nor in the "
            f"local Hugging Face cache ({_hf_cache()}), so its size is unknown. Download it "
            f"first (`hf download {model}`, or `huggingface-cli download {model}`), or set the "
            "policy's model to a local checkpoint directory"
        ) from exc
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in built.parameters())
    return ModelShape(
        parameters=parameters,
        hidden_size=int(text.hidden_size),
        layers=int(text.num_hidden_layers),
        vocab_size=int(text.vocab_size),
        max_positions=getattr(text, "max_position_embeddings", None),
        source=source,
    )


def _hf_cache() -> str:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        return HF_HUB_CACHE
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return "~/.cache/huggingface/hub"


# ---------------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class TrainerMemory:
    """One trainer process's memory on its device, in bytes, by part."""

    master_weights: int
    gradients: int
    optimizer: int
    compute_copy: int
    reference: int
    activations: int
    logits: int
    micro_batch_rows: int
    sequence_length: int

    @property
    def total(self) -> int:
        return (
            self.master_weights
            + self.gradients
            + self.optimizer
            + self.compute_copy
            + self.reference
            + self.activations
            + self.logits
        )

    def describe(self) -> str:
        parts = [
            ("weights", self.master_weights + self.compute_copy),
            ("grads", self.gradients),
            ("adam", self.optimizer),
            ("ref", self.reference),
            ("activations", self.activations),
            ("logits", self.logits),
        ]
        shown = " + ".join(f"{name} {b / GIB:.1f}" for name, b in parts if b)
        return f"{shown} GiB ({self.micro_batch_rows} x {self.sequence_length} tokens/micro-batch)"


def trainer_memory(
    shape: ModelShape,
    *,
    dtype: str,
    rows: int,
    length: int,
    gradient_checkpointing: bool,
    shards: int = 1,
    reference: bool = False,
) -> TrainerMemory:
    """Memory of one trainer process (one rank) for a model of ``shape``.

    The trainer keeps fp32 master weights and AdamW state and computes in ``dtype`` by autocast:
    per parameter 4 B master weight + 4 B gradient + 8 B Adam moments (exp_avg, exp_avg_sq), plus
    a 2 B compute copy when ``dtype`` is bfloat16/float16 (16 or 18 B per parameter); ``shards``
    ranks of FSDP divide all of that. A reference model (``beta > 0``) adds the weights once more
    at the compute dtype. On top comes the largest micro-batch (``rows`` x ``length`` tokens):
    its logits, rows x length x vocabulary x 4 B (log-probabilities in float32; an upper bound
    where the trainer takes them in tiles, so a plan errs towards refusing), and its
    activations, after Korthikanti et al. (2022) 34 x hidden bytes per token and layer at 16-bit
    (attention scores are not stored: SDPA/flash attention), twice that at float32; with
    gradient checkpointing only each layer's input (2 x hidden bytes per token and layer at
    16-bit) is kept, plus one layer's full activations while it is recomputed.
    """
    half = dtype in ("bfloat16", "float16")
    unit = 2 if half else 4  # bytes per activation element
    n = shape.parameters
    tokens = rows * length
    per_layer = 17 * shape.hidden_size * unit * tokens  # 34 h bytes at 16-bit
    if gradient_checkpointing:
        activations = shape.layers * shape.hidden_size * unit * tokens + per_layer
    else:
        activations = shape.layers * per_layer
    return TrainerMemory(
        master_weights=4 * n // shards,
        gradients=4 * n // shards,
        optimizer=8 * n // shards,
        compute_copy=(2 * n // shards) if half else 0,
        reference=(unit * n) if reference else 0,
        activations=activations,
        logits=tokens * shape.vocab_size * LOGIT_BYTES,
        micro_batch_rows=rows,
        sequence_length=length,
    )


def sequence_length(recipe: Recipe, policy: str, shape: ModelShape | None) -> int:
    """The longest sample ``policy`` trains on: its engine's ``max_model_len`` (a sample never
    outgrows the engine's context), else :data:`DEFAULT_PROMPT_TOKENS` plus the completion
    budget (``sampling.max_tokens`` x ``workflow.max_turns``), capped by the model's positions."""
    max_len = recipe.policies[policy].engine_args.get("max_model_len")
    if max_len:
        return int(max_len)
    length = DEFAULT_PROMPT_TOKENS + recipe.max_completion_length(policy)
    if shape is not None and shape.max_positions:
        length = min(length, int(shape.max_positions))
    return length


def micro_batch_rows(recipe: Recipe, policy: str, length: int, ranks: int) -> int:
    """Rows of the largest micro-batch one rank of ``policy``'s trainer holds: as many
    ``length``-token rows as ``trainer.micro_batch_tokens`` allows (at least one), else the whole
    batch (``groups_per_step`` x ``group_size`` rows, split over the ranks)."""
    spec = recipe.policies[policy].trainer
    rows = -(-spec.groups_per_step * recipe.tasks.group_size // ranks)
    budget = getattr(spec, "micro_batch_tokens", None)
    if budget:
        rows = min(rows, max(1, int(budget) // length))
    return max(1, rows)


# ---------------------------------------------------------------------------------------- devices
@dataclass(frozen=True)
class Machine:
    """The GPUs the launcher sees: their ids as ``CUDA_VISIBLE_DEVICES`` entries (None: unknown,
    e.g. planning on a machine without GPUs) and the memory of one."""

    devices: tuple[str, ...] | None
    memory_gib: float
    memory_source: str

    def physical(self, logical: tuple[int, ...]) -> str:
        """``CUDA_VISIBLE_DEVICES`` for logical devices (indices into the devices seen; one
        beyond them keeps its number, and the plan names it as missing)."""
        seen = self.devices or ()
        return ",".join(seen[i] if i < len(seen) else str(i) for i in logical)


def visible_devices(environ: dict[str, str] | None = None) -> tuple[str, ...] | None:
    """The GPUs this process may use, without importing torch: its ``CUDA_VISIBLE_DEVICES``
    when set, else the GPUs the NVIDIA driver lists (``/proc/driver/nvidia/gpus``); None when
    neither says (no NVIDIA driver: planning for another machine)."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        return tuple(d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip())
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        return tuple(str(i) for i in range(len(list(gpus.iterdir()))))
    return None


def machine(
    recipe: Recipe,
    memory_gib: float | None = None,
    environ: dict[str, str] | None = None,
) -> Machine:
    """The machine a plan is for: ``memory_gib`` (the command line's ``--device-memory-gib``),
    else ``run.device_memory_gib``, else the smallest visible GPU's memory (torch.cuda), else
    :data:`DEFAULT_DEVICE_MEMORY_GIB`; the source is named in the plan's output."""
    devices = visible_devices(environ)
    if memory_gib is not None:
        return Machine(devices, memory_gib, "--device-memory-gib")
    configured = getattr(recipe.run, "device_memory_gib", None)
    if configured is not None:
        return Machine(devices, float(configured), "run.device_memory_gib")
    if devices:
        try:
            import torch

            if torch.cuda.is_available():
                sizes = [
                    torch.cuda.get_device_properties(i).total_memory
                    for i in range(torch.cuda.device_count())
                ]
                if sizes:
                    return Machine(devices, min(sizes) / GIB, "torch.cuda")
        except Exception:  # a driver problem: fall back to the default, said in the output
            pass
    return Machine(devices, DEFAULT_DEVICE_MEMORY_GIB, "default; set --device-memory-gib")


_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def _first_device(value: str, key: str, has_gpus: bool) -> int | None:
    """The logical device a ``device`` setting names (None: CPU)."""
    if value == "cpu":
        return None
    if value == "auto":
        return 0 if has_gpus else None
    match = _CUDA.match(value)
    if match is None:
        raise PlanError(f"{key} = {value!r}; expected auto, cpu, cuda or cuda:N")
    return int(match.group(1) or 0)


def node_devices(recipe: Recipe, index: int, has_gpus: bool) -> tuple[int, ...]:
    """The logical devices of rollout node ``index`` (empty: CPU): its ``rollout.devices``
    entry, else ``rollout.device``'s device, widened to the adjacent devices its largest
    tensor-parallel engine needs."""
    explicit = getattr(recipe.rollout, "devices", None)
    if explicit:
        if index >= len(explicit):
            raise PlanError(
                f"rollout.devices lists {len(explicit)} nodes' devices but node-{index} is "
                f"started (rollout.nodes = {recipe.rollout.nodes}"
                + (f", autoscale.max_nodes = {recipe.autoscale.max_nodes}" if recipe.autoscale.enabled else "")
                + "); give one entry per node"
            )  # fmt: skip
        return tuple(explicit[index])
    first = _first_device(recipe.rollout.device, "rollout.device", has_gpus)
    if first is None:
        return ()
    width = max((_tensor_parallel(recipe.policies[p].engine_args) for p in _served(recipe)),
                default=1)  # fmt: skip
    return tuple(range(first, first + width))


def _served(recipe: Recipe) -> list[str]:
    """The policies a node serves: those the workflow's roles name (a node's ``--policies``
    aside), in recipe order."""
    wanted = set(recipe.workflow.roles.values())
    return [p for p in recipe.policies if p in wanted]


def _tensor_parallel(engine_args: dict[str, Any]) -> int:
    """An engine's tensor-parallel size: ``tensor_parallel_size``, or ``--tensor-parallel-size``
    / ``-tp`` among its further server flags (``extra_server_args``, ``extra_args``); else 1."""
    if engine_args.get("tensor_parallel_size"):
        return int(engine_args["tensor_parallel_size"])
    extra = [
        str(a) for key in ("extra_server_args", "extra_args") for a in (engine_args.get(key) or ())
    ]
    for i, arg in enumerate(extra):
        for flag in ("--tensor-parallel-size", "-tp"):
            if arg == flag and i + 1 < len(extra):
                return int(extra[i + 1])
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
    return 1


def _engines(recipe: Recipe) -> list[tuple[str, list[str]]]:
    """The engines one node runs: (policy whose settings it uses, policies it serves). The
    adapters of one base (and the base policy, when served) share one engine."""
    served = _served(recipe)
    engines: list[tuple[str, list[str]]] = []
    for key, adapters in recipe.adapter_groups().items():
        mine = [a for a in adapters if a in served]
        if mine:
            with_base = [key] if key in recipe.policies and key in served else []
            engines.append((mine[0], with_base + mine))
    grouped = {p for _, ps in engines for p in ps}
    engines += [(p, [p]) for p in served if p not in grouped]
    return engines


# ---------------------------------------------------------------------------------------- argv
def dataflow_argv(recipe: Recipe, run_dir: Path, port: int) -> list[str]:
    """The dataflow service's command line (the local and Ray launchers start it so)."""
    return astraflow_argv(
        "serve", "dataflow", "--recipe", str(run_dir / "recipe.toml"),
        "--store", str(run_dir / "dataflow.db"), "--host", recipe.dataflow.host,
        "--port", str(port), "--port-file", str(run_dir / "dataflow.url"),
    )  # fmt: skip


def node_argv(
    recipe: Recipe, run_dir: Path, url: str, index: int, *, on_gpu: bool, replace: bool = False
) -> list[str]:
    """Rollout node ``index``'s command line. A node on GPUs gets ``--device cuda``: its devices
    are its ``CUDA_VISIBLE_DEVICES``, so ``rollout.device = "cuda:N"`` is device 0 inside it."""
    argv = astraflow_argv(
        "serve", "rollout", "--join", url, "--recipe", str(run_dir / "recipe.toml"),
        "--name", f"node-{index}", "--drain-timeout", "10",
    )  # fmt: skip
    if on_gpu and recipe.rollout.device != "auto":
        argv += ["--device", "cuda"]
    if replace:
        argv.append("--replace")
    return argv


# ---------------------------------------------------------------------------------------- plan
@dataclass
class PlannedProcess:
    """One process of the plan.

    ``devices`` are logical device indices (into the GPUs the launcher sees); ``env`` is what the
    launcher sets on top of the service's environment (``CUDA_VISIBLE_DEVICES``); ``memory_gib``
    its estimate on each device it uses; ``parent`` the process that starts it (a node starts
    its vLLM servers, torchrun its ranks), None for the launcher's own children."""

    name: str
    kind: Kind
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    devices: tuple[int, ...] = ()
    memory_gib: dict[int, float] = field(default_factory=dict)
    detail: str = ""
    engine_args: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    #: GPUs its Ray actor reserves (Ray launcher; None: not a Ray plan or none asked)
    ray_gpus: float | None = None

    @property
    def visible(self) -> str | None:
        """Its ``CUDA_VISIBLE_DEVICES`` (None: inherited from the launcher)."""
        return self.env.get("CUDA_VISIBLE_DEVICES")


@dataclass
class LaunchPlan:
    """Every process a run would start, as :func:`build_plan` computed it."""

    recipe_name: str
    launcher: Literal["local", "ray"]
    machine: Machine
    processes: list[PlannedProcess]
    #: what the plan could not do (a model absent, a device missing): the run would fail
    problems: list[str] = field(default_factory=list)

    def process(self, name: str) -> PlannedProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(
            f"no process {name!r} in the plan; it has {[p.name for p in self.processes]}"
        )

    def env_for(self, name: str) -> dict[str, str]:
        """What the launcher adds to service ``name``'s environment (its devices). Nodes the
        autoscaler adds past the planned ones get their devices the same way."""
        try:
            return dict(self.process(name).env)
        except KeyError:
            return {}

    def device_use(self) -> dict[int, list[tuple[PlannedProcess, float]]]:
        """Local plans: each device's processes and their GiB on it."""
        use: dict[int, list[tuple[PlannedProcess, float]]] = {}
        for p in self.processes:
            for d, gib in p.memory_gib.items():
                use.setdefault(d, []).append((p, gib))
        return dict(sorted(use.items()))

    def device_totals(self) -> list[tuple[str, list[tuple[PlannedProcess, float]], float, float]]:
        """(device, its processes and their GiB, total, limit) per device. Locally a device is
        shared by every process planned on it and holds the device's memory; under Ray each
        actor's devices are its own, each holding its reserved share (``num_gpus`` over its
        devices, at most one device)."""
        limit = self.machine.memory_gib
        if self.launcher != "ray":
            return [
                (_device_label(self, d), users, sum(g for _, g in users), limit)
                for d, users in self.device_use().items()
            ]
        out = []
        for actor in (p for p in self.processes if p.parent is None):
            mine = [actor, *(p for p in self.processes if p.parent == actor.name)]
            use: dict[int, list[tuple[PlannedProcess, float]]] = {}
            for p in mine:
                for d, gib in p.memory_gib.items():
                    use.setdefault(d, []).append((p, gib))
            n = max(1, len(actor.devices))
            share = min(1.0, (actor.ray_gpus or 0.0) / n) * limit
            for d, users in sorted(use.items()):
                label = f"{actor.name} (Ray: {_num(actor.ray_gpus or 0)} GPU) cuda:{d}"
                out.append((label, users, sum(g for _, g in users), share))
        return out

    def oversubscribed(self) -> list[str]:
        """One line per device asked more memory than it has, naming the processes and numbers
        (a Ray actor's device: more than its reserved share)."""
        return [
            f"{label}: {_terms(users)} = {total:.1f} GiB > {_num(limit)} GiB"
            for label, users, total, limit in self.device_totals()
            if total > limit + 1e-9
        ]

    def check(self) -> None:
        """Raise :class:`PlanError` when the plan cannot run (its problems, an over-subscribed
        device), with every reason."""
        reasons = self.problems + self.oversubscribed()
        if reasons:
            raise PlanError(
                "the launch plan does not fit:\n  " + "\n  ".join(reasons)
                + "\n(lower engine_args.gpu_memory_utilization or trainer.micro_batch_tokens, "
                "put the processes on other devices with trainer.device / rollout.devices, or "
                "give the real device size with --device-memory-gib)"
            )  # fmt: skip

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(process, command, devices, memory per device) for a table."""
        out = []
        for p in self.processes:
            if p.kind == "engine":
                shown = " ".join(p.argv) if p.argv else _engine_line(p.engine_args)
                command = f"(started by {p.parent}) {shown}"
            else:
                command = _command_text(p.argv)
            devices = p.visible if p.visible is not None else "-"
            if p.ray_gpus:
                devices = f"Ray: {_num(p.ray_gpus)} GPU"
            memory = ", ".join(
                f"{_device_label(self, d)} {_term(p, g)}" for d, g in p.memory_gib.items()
            )
            if p.detail and memory:
                memory += f" [{p.detail}]"
            out.append((p.name, command, devices, memory or "-"))
        return out

    def device_lines(self) -> list[str]:
        """One line per device: its processes and its total against its size."""
        return [
            f"{label}: {_terms(users)} = {total:.1f} GiB of {_num(limit)} GiB "
            + ("(ok)" if total <= limit + 1e-9 else "(OVER)")
            for label, users, total, limit in self.device_totals()
        ]


def _terms(users: list[tuple[PlannedProcess, float]]) -> str:
    return " + ".join(f"{p.name} {_term(p, g)}" for p, g in users)


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


def _term(p: PlannedProcess, gib: float) -> str:
    util = p.engine_args.get("gpu_memory_utilization") if p.kind == "engine" else None
    if p.kind == "engine" and p.detail.startswith("gpu_memory_utilization"):
        util = util if util is not None else VLLM_DEFAULT_UTILIZATION
        return f"{util:g} x {_num(gib / util)} GiB"
    return f"{gib:.1f} GiB"


def _device_label(plan: LaunchPlan, logical: int) -> str:
    if plan.machine.devices is not None and logical < len(plan.machine.devices):
        physical = plan.machine.devices[logical]
        if physical != str(logical):
            return f"cuda:{logical} (GPU {physical})"
    return f"cuda:{logical}"


def _short(arg: str) -> str:
    return "python" if arg == sys.executable else arg


def _command_text(argv: list[str]) -> str:
    """A command line as a person reads it: ``python -m astraflow.cli.main`` is ``astraflow``."""
    if argv[1:3] == ["-m", "astraflow.cli.main"]:
        argv = ["astraflow", *argv[3:]]
    return " ".join(_short(a) for a in argv)


def _engine_line(args: dict[str, Any]) -> str:
    shown = " ".join(f"{k}={v}" for k, v in args.items() if k not in ("python", "env"))
    return f"vllm server {shown}".rstrip()


def build_plan(
    recipe: Recipe,
    run_dir: Path | None = None,
    *,
    device_memory_gib: float | None = None,
    environ: dict[str, str] | None = None,
) -> LaunchPlan:
    """The plan of ``recipe``'s run (its ``run.launcher``) in ``run_dir`` (default: the
    recipe's run directory), started from an environment ``environ`` (default: this process's).
    Nothing is started; a model's config is read only for processes on GPUs."""
    rd = recipe.run.run_dir if run_dir is None else run_dir
    mach = machine(recipe, device_memory_gib, environ)
    plan = LaunchPlan(recipe.run.name, recipe.run.launcher, mach, [])
    ray = recipe.run.launcher == "ray"
    has_gpus = bool(mach.devices) if mach.devices is not None else False
    plan.processes.append(
        PlannedProcess("dataflow", "dataflow", dataflow_argv(recipe, rd, recipe.dataflow.port))
    )
    for group in recipe.trainer_processes():
        _plan_trainer(plan, recipe, rd, group[0], has_gpus, ray)
    nodes = recipe.rollout.nodes
    if recipe.autoscale.enabled:
        nodes = max(nodes, recipe.autoscale.max_nodes)
    for i in range(nodes):
        _plan_node(plan, recipe, rd, i, has_gpus, ray)
    if not ray:
        _check_devices_exist(plan)
    return plan


def _ray_gpus(recipe: Recipe, name: str, processes: int = 1) -> float | None:
    if name.startswith("trainer-"):
        place = recipe.ray.trainer_for(name.removeprefix("trainer-").split("+", 1)[0])
    else:
        place = recipe.ray.node_for(int(name.removeprefix("node-")))
    return place.num_gpus * processes if place.num_gpus else None


def _device_env(plan: LaunchPlan, devices: tuple[int, ...], ray: bool) -> dict[str, str]:
    if not devices:
        return {}
    value = RAY_GPUS if ray else plan.machine.physical(devices)
    return {"CUDA_VISIBLE_DEVICES": value}


def _shape_or_problem(plan: LaunchPlan, recipe: Recipe, policy: str) -> ModelShape | None:
    try:
        return model_shape(recipe.model_of(policy))
    except PlanError as exc:
        message = f"policies.{policy}: {exc}"
        if message not in plan.problems:
            plan.problems.append(message)
        return None


def _plan_trainer(
    plan: LaunchPlan, recipe: Recipe, rd: Path, policy: str, has_gpus: bool, ray: bool
) -> None:
    spec = recipe.policies[policy].trainer
    name = trainer_service_name(recipe, policy)
    argv = trainer_argv(recipe, rd / "recipe.toml", policy, DATAFLOW_URL, rd)
    first = _first_device(spec.device, f"policies.{policy}.trainer.device", has_gpus)
    if first is not None and ray:
        first = 0  # Ray's reserved devices, seen from inside the actor
    ranks = spec.processes
    devices = () if first is None else tuple(range(first, first + ranks))
    proc = PlannedProcess(name, "trainer", argv, _device_env(plan, devices, ray), devices)
    if ray:
        proc.ray_gpus = _ray_gpus(recipe, name, ranks)
        if devices and not proc.ray_gpus:
            plan.problems.append(
                f"{name}: policies.{policy}.trainer.device = {spec.device!r} but its Ray "
                f"placement ([ray.trainers.{policy}] or [ray.trainer]) reserves no GPU; set "
                "num_gpus (Ray hides the GPUs from actors that reserve none)"
            )
    plan.processes.append(proc)
    if not devices:
        return
    shape = _shape_or_problem(plan, recipe, policy)
    memory = None
    if shape is not None:
        length = sequence_length(recipe, policy, shape)
        dtype = spec.dtype if spec.dtype != "auto" else "bfloat16"
        fsdp = getattr(spec, "strategy", None) == "fsdp"
        memory = trainer_memory(
            shape,
            dtype=dtype,
            rows=micro_batch_rows(recipe, policy, length, ranks),
            length=length,
            gradient_checkpointing=spec.gradient_checkpointing,
            shards=ranks if fsdp else 1,
            reference=spec.beta > 0,
        )
    if ranks == 1:
        if memory is not None:
            proc.memory_gib = {devices[0]: memory.total / GIB}
            proc.detail = memory.describe()
        return
    for r, d in enumerate(devices):
        rank = PlannedProcess(
            f"{name}/rank-{r}", "rank", ["(torchrun rank)"], proc.env, (d,), parent=name
        )
        if memory is not None:
            rank.memory_gib = {d: memory.total / GIB}
            rank.detail = memory.describe()
        rank.ray_gpus = (proc.ray_gpus / ranks) if proc.ray_gpus else None
        plan.processes.append(rank)


def _plan_node(
    plan: LaunchPlan, recipe: Recipe, rd: Path, i: int, has_gpus: bool, ray: bool
) -> None:
    name = f"node-{i}"
    try:
        devices = node_devices(recipe, i, has_gpus)
    except PlanError as exc:
        plan.problems.append(str(exc))
        devices = ()
    if ray and devices:
        devices = tuple(range(len(devices)))  # Ray's reserved devices, seen from the actor
    argv = node_argv(recipe, rd, DATAFLOW_URL, i, on_gpu=bool(devices))
    node = PlannedProcess(name, "node", argv, _device_env(plan, devices, ray), devices)
    if ray:
        node.ray_gpus = _ray_gpus(recipe, name)
        if devices and not node.ray_gpus:
            plan.problems.append(
                f"{name} runs on GPUs (rollout.device / rollout.devices) but its Ray placement "
                "([ray.rollout] or its ray.rollout_pools entry) reserves no GPU; set num_gpus"
            )
    plan.processes.append(node)
    if not devices:
        return
    mem = plan.machine.memory_gib
    for settings, served in _engines(recipe):
        cfg = recipe.policies[settings]
        if cfg.engine == "openai":
            continue  # a remote endpoint: nothing on this node's devices
        if cfg.engine == "transformers":  # inside the node process itself
            shape = _shape_or_problem(plan, recipe, settings)
            if shape is not None:
                gib = 2 * shape.parameters / GIB
                node.memory_gib[devices[0]] = node.memory_gib.get(devices[0], 0.0) + gib
                node.detail = (node.detail + "; " if node.detail else "") + (
                    f"transformers {'+'.join(served)}: weights {gib:.1f} GiB (16-bit)"
                )
            continue
        tp = _tensor_parallel(cfg.engine_args)
        if tp > len(devices):
            plan.problems.append(
                f"{name}: the vLLM engine of {'+'.join(served)} has tensor_parallel_size = {tp} "
                f"but the node has {len(devices)} device(s) ({plan.machine.physical(devices)}); "
                f"give it {tp} adjacent devices in rollout.devices"
            )
        used = devices[:tp]
        util = float(cfg.engine_args.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION))
        engine = PlannedProcess(
            f"{name}/vllm-{'+'.join(served)}",
            "engine",
            _vllm_argv(recipe.model_of(settings), cfg.engine_args),
            dict(node.env),  # the server inherits the node's environment
            used,
            {d: util * mem for d in used},
            detail=f"gpu_memory_utilization {util:g}",
            engine_args=dict(cfg.engine_args),
            parent=name,
            ray_gpus=node.ray_gpus,
        )
        plan.processes.append(engine)


def _vllm_argv(model: str, engine_args: dict[str, Any]) -> list[str]:
    """The vLLM server's command line as the node's engine builds it
    (:func:`~astraflow.rollout.engines.vllm_engine.vllm_server_command`), with the model the
    recipe names (the engine serves a copy of it) and its port to be picked at start."""
    import inspect

    try:
        from astraflow.rollout.engines.vllm_engine import vllm_server_command
    except ImportError:  # an engine module without it: the arguments alone are shown
        return []
    accepted = set(inspect.signature(vllm_server_command).parameters)
    kwargs = {k: v for k, v in engine_args.items() if k in accepted and k not in ("python",)}
    kwargs.setdefault("host", engine_args.get("host", "127.0.0.1"))
    kwargs["port"] = 0
    python = engine_args.get("python") or os.environ.get("ASTRAFLOW_VLLM_PYTHON") or "python"
    argv = vllm_server_command(python, model, **kwargs)
    at = argv.index("--port") + 1 if "--port" in argv else None
    if at is not None:
        argv[at] = "<free port>"
    return [str(a) for a in argv]


def _check_devices_exist(plan: LaunchPlan) -> None:
    """A device the recipe names that this machine does not have (known devices only)."""
    seen = plan.machine.devices
    if not seen:  # no GPU here: a plan for another machine
        return
    for p in plan.processes:
        if p.parent is not None:
            continue
        missing = [d for d in p.devices if d >= len(seen)]
        if missing:
            plan.problems.append(
                f"{p.name} is planned on cuda:{missing[0]} but the launcher sees "
                f"{len(seen)} GPU(s) (CUDA_VISIBLE_DEVICES={','.join(seen) or '(empty)'}); "
                "name devices below that in trainer.device / rollout.devices"
            )
