"""Agents as LoRA adapters of one base vs as full models: memory, episodes/s and learning.

Two parts, each measured side by side in one invocation:

1. **Resources and speed**, for 2 and 4 agents. An episode asks every agent (a workflow role, each
   its own trainable policy) the same arithmetic question and rewards each for its own answer
   (``_committee_agent.py``, run by the ``openai_agent`` workflow). The agents are either full
   models (``model = "builtin:tiny-arith"`` each: one engine and one trainer process per agent)
   or LoRA adapters of that one base (``base = "builtin:tiny-arith"``: one engine on the node,
   one trainer process for all). Same steps, batch sizes, sampling and learning rates. Measured
   per run: the node's peak RSS, the trainers' peak RSS and PSS summed over their processes,
   the parameter bytes an engine holds (base + adapters vs one model per agent, counted from the
   engines' tensors in this process), and training episodes per second (episodes stored while
   training / training wall time). Ratios are adapters / full, per repeat (the two systems run
   back to back, their order alternating), median over repeats: ``node_rss_ratio``,
   ``trainer_rss_ratio``, ``trainer_pss_ratio``, ``param_bytes_ratio``, ``episodes_per_s_ratio``.

2. **Learning**: ``recipes/multi_policy_math.toml`` (solver and verifier as full models) against
   ``recipes/multi_policy_lora.toml`` (the same two as adapters of one base), same seeds (paired),
   steps and evaluation. Target fixed in advance: for each policy, the 95 % t-interval of the
   paired difference adapters - full in final held-out accuracy contains 0 or lies above it.

The built-in model has 1.1M parameters (4.6 MB in float32), so every process's RSS is dominated by
the Python/torch runtime (~0.3-0.5 GB), not the weights: the RSS ratios here say what agents cost on
a tiny model, the parameter bytes what they cost where weights dominate (a Llama-7B base: ~13 GB per
full copy in bf16 vs ~80 MB per rank-16 adapter on every linear layer).

    python bench/multi_lora.py --quick --json /tmp/multi_lora.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _cli
import _records
import _report
import _results
import _runs
import _stats

AGENT_FILE = Path(__file__).with_name("_committee_agent.py")
LEARNING = {
    "full": _runs.REPO_ROOT / "recipes" / "multi_policy_math.toml",
    "adapters": _runs.REPO_ROOT / "recipes" / "multi_policy_lora.toml",
}
SYSTEMS = ("full", "adapters")
AGENTS = (2, 4)
BASE = "builtin:tiny-arith"
LORA = {"r": 16, "alpha": 32.0, "target_modules": "all-linear"}
LEARNING_RATE = 1e-3  # the resources part measures cost, not learning: one rate for both

NOTES = [
    "RSS is dominated by the Python/torch runtime on the 1.1M-parameter built-in model; the "
    "parameter bytes per node show the weights' share (what dominates with a real base model).",
    "Trainer PSS splits shared pages (the torch libraries) between processes: N full-model "
    "trainers are N runtimes, N optimizers and N copies of the weights; one adapter trainer is "
    "one of each, with N adapters and their optimizers.",
    "Episodes/s: training episodes stored / training wall time (first lease or version to the "
    "last optimizer step), every agent of an episode answering once. The machine is shared: "
    "timings are noisy.",
]


# ----------------------------------------------------------------------------- part 1: resources


def committee_recipe(n: int, system: str, steps: int, seed: int, out: Path) -> Path:
    """The N-agent recipe of ``system`` (TOML written under ``out``)."""
    roles = [f"a{i}" for i in range(n)]
    lines = [
        "[run]",
        f'name = "committee{n}-{system}"',
        f"seed = {seed}",
        f"max_steps = {steps}",
        "",
    ]
    for role in roles:
        lines.append(f"[policies.{role}]")
        if system == "full":
            lines.append(f'model = "{BASE}"')
        else:
            lines.append(f'base = "{BASE}"')
            lines.append(
                f"lora = {{ r = {LORA['r']}, alpha = {LORA['alpha']}, "
                f'target_modules = "{LORA["target_modules"]}" }}'
            )
        lines += [
            "sampling = { temperature = 1.0, max_tokens = 8 }",
            f'trainer = {{ loss_type = "dapo", learning_rate = {LEARNING_RATE}, '
            "groups_per_step = 4 }",
            "",
        ]
    agent = f"{AGENT_FILE}:committee{n}"
    lines += [
        "[tasks]",
        'env = "astraflow/Math-v0"',
        "group_size = 8",
        'sets = [{ name = "arith", split = "train" }]',
        "",
        "[workflow]",
        'name = "openai_agent"',
        f"agent = {json.dumps(agent)}",
        "roles = { " + ", ".join(f'{r} = "{r}"' for r in roles) + " }",
        "",
        "[dataflow]",
        "max_lag = 2",
        "",
        "[rollout]",
        "nodes = 1",
        "concurrency = 64",
        "",
        "[evaluation]",
        "every_steps = 0",
        "at_start = false",
        "",
        "[logging]",
        "report = false",
        "dashboard = false",
    ]
    path = out / f"committee{n}-{system}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class MemorySampler:
    """Peak RSS (the kernel's high-water mark, ``VmHWM``) and peak PSS of the run's node and
    trainer processes, read from ``/proc`` whenever the bench polls the run."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.hwm: dict[str, int] = {}
        self.pss: dict[str, int] = {}

    def sample(self) -> None:
        import psutil

        try:
            pids = json.loads((self.run_dir / "pids.json").read_text())
        except (OSError, ValueError):
            return
        for name, pid in pids.items():
            if not (name.startswith("node-") or name.startswith("trainer-")):
                continue
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                pss = psutil.Process(pid).memory_full_info().pss
            except (OSError, psutil.Error):
                continue
            hwm = next(
                int(line.split()[1]) * 1024
                for line in status.splitlines()
                if line.startswith("VmHWM")
            )
            self.hwm[name] = max(self.hwm.get(name, 0), hwm)
            self.pss[name] = max(self.pss.get(name, 0), pss)

    def figures(self) -> dict[str, Any]:
        nodes = [v for k, v in self.hwm.items() if k.startswith("node-")]
        trainers = {k: v for k, v in self.hwm.items() if k.startswith("trainer-")}
        trainer_pss = {k: v for k, v in self.pss.items() if k.startswith("trainer-")}
        return {
            "node_rss_mb": max(nodes) / 2**20 if nodes else None,
            "node_pss_mb": max((v for k, v in self.pss.items() if k.startswith("node-")), default=0)
            / 2**20
            or None,
            "trainer_processes": len(trainers),
            "trainer_rss_mb": sum(trainers.values()) / 2**20 if trainers else None,
            "trainer_pss_mb": sum(trainer_pss.values()) / 2**20 if trainer_pss else None,
            "trainer_rss_mb_each": {k: v / 2**20 for k, v in sorted(trainers.items())},
        }


def run_resources(
    n: int, system: str, steps: int, seed: int, workdir: Path, timeout_s: float
) -> dict[str, Any]:
    """One N-agent run of ``system``: memory and episodes/s."""
    out = workdir / f"res-n{n}-{system}-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    recipe = committee_recipe(n, system, steps, seed, out)
    run_dir = out / f"committee{n}-{system}"
    sampler = MemorySampler(run_dir)
    policies = [f"a{i}" for i in range(n)]

    def finished() -> bool:
        sampler.sample()
        records = _records.read_jsonl(run_dir / "metrics.jsonl")
        done = [
            max((r["step"] for r in _records.step_records(records, p)), default=0) for p in policies
        ]
        return min(done) >= steps

    argv = [sys.executable, "-m", "astraflow.cli.main", "train", str(recipe), "--no-live"]
    argv += ["--timeout", str(int(timeout_s)), "--set", f"run.output_dir={json.dumps(str(out))}"]
    outcome = _runs.run_subprocess(
        argv, out / "train.log", timeout_s + 120.0, finished=finished, poll_s=0.5
    )
    records = _records.read_jsonl(run_dir / "metrics.jsonl")
    times = _records.dataflow_times(records)
    last = [
        float(r["time"]) for p in policies for r in _records.step_records(records, p) if "time" in r
    ]
    train_s = (max(last) - times.training_start) if last and times.training_start else None
    steps_done = {p: len(_records.step_records(records, p)) for p in policies}
    step_times = [
        t
        for p in policies
        for r in _records.step_records(records, p)
        if (t := (r.get("metrics") or {}).get("step_time")) is not None
    ]
    ok = outcome.stopped_when_finished and all(v >= steps for v in steps_done.values())
    return {
        "agents": n,
        "system": system,
        "seed": seed,
        "ok": ok,
        "wall_s": outcome.wall_s,
        "train_s": train_s,
        "train_episodes": times.train_episodes,
        "episodes_per_s": _stats.ratio(times.train_episodes, train_s),
        "steps": steps_done,
        # seconds of one optimizer step (TRL's step_time: forward, backward, update), mean
        "trainer_step_s": statistics.fmean(step_times) if step_times else None,
        **sampler.figures(),
        "run_dir": str(run_dir),
        "error": None if ok else f"run did not finish ({outcome}); log {out / 'train.log'}",
    }


def param_bytes(n: int) -> dict[str, int]:
    """Bytes of the tensors one node's engines hold for ``n`` agents: ``n`` plain engines (one
    per full model) vs one engine serving ``n`` adapters (storages counted once)."""
    import asyncio

    from astraflow.models import resolve_model
    from astraflow.models.lora import AdapterSpec
    from astraflow.recipe.schema import AdapterConfig
    from astraflow.rollout.engines.transformers_engine import TransformersEngine

    def held(engine: TransformersEngine) -> int:
        seen: dict[int, int] = {}
        for t in [*engine.model.parameters(), *engine.model.buffers()]:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(seen.values())

    path = resolve_model(BASE)
    plain = TransformersEngine(path, device="cpu")
    specs = [AdapterSpec(f"a{i}", AdapterConfig(**LORA), i) for i in range(n)]
    shared = TransformersEngine(path, device="cpu", adapters=specs)
    out = {"full": n * held(plain), "adapters": held(shared)}
    for engine in (plain, shared):
        asyncio.run(engine.close())
    return out


def engine_speed(n: int, rounds: int = 3) -> dict[str, float]:
    """Decode speed of a node's engines alone (no dataflow, no trainer), same requests: ``n``
    plain engines (one per full model, each with its own decode thread), one engine serving
    ``n`` adapters (one decode thread, mixed-adapter batches), and one plain engine given all
    the requests (one model, the floor of what batching them can cost). Tokens per second,
    best of ``rounds``."""
    import asyncio

    from astraflow.models import resolve_model
    from astraflow.models.lora import AdapterSpec
    from astraflow.recipe.schema import AdapterConfig
    from astraflow.rollout.engines import SamplingParams
    from astraflow.rollout.engines.adapters import adapter_engines
    from astraflow.rollout.engines.transformers_engine import TransformersEngine

    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)

    async def tokens_per_s(engines: list, prompts: list[list[int]]) -> float:
        best = 0.0
        for _ in range(rounds):
            started = time.perf_counter()
            await asyncio.gather(*(e.generate(p, params) for e in engines for p in prompts))
            best = max(best, len(engines) * len(prompts) * 8 / (time.perf_counter() - started))
        return best

    async def main() -> dict[str, float]:
        path = resolve_model(BASE)
        plain = [TransformersEngine(path, device="cpu") for _ in range(n)]
        specs = [AdapterSpec(f"a{i}", AdapterConfig(**LORA), i) for i in range(n)]
        shared = TransformersEngine(path, device="cpu", adapters=specs)
        faces = list(adapter_engines(shared, {s.policy: s.policy for s in specs}).values())
        tok = plain[0].tokenizer
        prompts = [tok(f"{i}+{3 * i}=")["input_ids"] for i in range(32)]
        try:
            return {
                "full_engines": await tokens_per_s(plain, prompts),
                "adapter_engine": await tokens_per_s(faces, prompts),
                "one_plain_engine": await tokens_per_s([plain[0]] * n, prompts),
            }
        finally:
            for e in [*plain, shared]:
                await e.close()

    return asyncio.run(main())


def runtime_rss_mb() -> float | None:
    """Peak RSS of a bare Python that imports what a service imports (torch, transformers, peft)
    and loads no model: the floor under every process's figure."""
    import subprocess

    code = (
        "import torch, transformers, peft, trl\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    try:
        return int(proc.stdout.strip().splitlines()[-1]) / 1024
    except (ValueError, IndexError):
        return None


# ----------------------------------------------------------------------------- part 2: learning


def run_learning(
    system: str, seed: int, steps: int, eval_tasks: int, workdir: Path, timeout_s: float
) -> _results.RunResult:
    overrides = [
        f"run.max_steps={steps}",
        f"evaluation.every_steps={steps}",
        f"evaluation.num_tasks={eval_tasks}",
        "logging.report=false",
        "logging.dashboard=false",
    ]
    return _runs.run_recipe(
        LEARNING[system], overrides, system=f"learn-{system}", seed=seed, workdir=workdir,
        timeout_s=timeout_s,
    )  # fmt: skip


# ----------------------------------------------------------------------------- analysis


RATIO_KEYS = {
    "node_rss_ratio": "node_rss_mb",
    "node_pss_ratio": "node_pss_mb",
    "trainer_rss_ratio": "trainer_rss_mb",
    "trainer_pss_ratio": "trainer_pss_mb",
    "episodes_per_s_ratio": "episodes_per_s",
}


def ratio_of_medians(
    by_system: dict[str, list[dict[str, Any]]],
    pairs: list[tuple[dict[str, Any], dict[str, Any]]],
    field: str,
) -> tuple[float | None, dict[str, Any]]:
    """adapters / full for one figure: the ratio of the two systems' medians over repeats (the
    figure reported), with the spread of the per-repeat ratios beside it (median, min, max: how
    much one repeat's pair can differ). A median of per-repeat ratios is not the headline: it
    pairs repeats that share nothing but their index."""
    med = {s: _stats.spread(r[field] for r in rows).median for s, rows in by_system.items()}
    value = _stats.ratio(med.get("adapters"), med.get("full"))
    per_repeat = _stats.spread(_stats.ratio(a[field], f[field]) for f, a in pairs)
    return value, {"ratio_of_medians": value, **_stats.spread_json(per_repeat)}


def reanalyse(path: Path) -> dict[str, Any]:
    """Recompute a stored ``--json`` file's adapters / full ratios from its ``resource_runs``
    (nothing is run): ratios of medians with the per-repeat spread (:func:`ratio_of_medians`);
    the earlier figures (medians of per-repeat ratios) kept under ``*_median_of_repeat_ratios``."""
    import _stamp

    data = json.loads(Path(path).read_text())
    runs = data.get("resource_runs") or []
    res = data.setdefault("resources", {})
    for n in sorted({r["agents"] for r in runs}):
        mine = [r for r in runs if r["agents"] == n and r["ok"]]
        by_system = {s: [r for r in mine if r["system"] == s] for s in SYSTEMS}
        pairs = list(zip(by_system["full"], by_system["adapters"], strict=False))
        for key, field in RATIO_KEYS.items():
            value, spread = ratio_of_medians(by_system, pairs, field)
            # the earlier figure, recomputed (not copied): the median of per-repeat ratios
            data.setdefault(f"{key}_median_of_repeat_ratios", {})[str(n)] = spread["median"]
            for target in (data, res):
                target.setdefault(key, {})[str(n)] = value
            res.setdefault("by_agents", {}).setdefault(str(n), {})[key] = spread
    stamp = _stamp.stamp(["multi_lora.py", "--reanalyse", str(path)])
    data["reanalysis"] = {k: stamp[k] for k in ("command", "commit", "dirty", "date")}
    _report.write_json(path, data)
    return data


def analyse_resources(
    runs: list[dict[str, Any]],
    params: dict[int, dict[str, int]],
    runtime_mb: float | None,
    speeds: dict[int, dict[str, float]],
) -> dict[str, Any]:
    out: dict[str, Any] = {key: {} for key in RATIO_KEYS}
    out["param_bytes_ratio"] = {}
    per_agents: dict[str, Any] = {}
    for n in sorted({r["agents"] for r in runs}):
        mine = [r for r in runs if r["agents"] == n and r["ok"]]
        by_system = {s: [r for r in mine if r["system"] == s] for s in SYSTEMS}
        pairs = list(zip(by_system["full"], by_system["adapters"], strict=False))
        row: dict[str, Any] = {}
        for key, field in RATIO_KEYS.items():
            out[key][str(n)], row[key] = ratio_of_medians(by_system, pairs, field)
        for system, rows in by_system.items():
            row[system] = {
                field: _stats.spread_json(_stats.spread(r[field] for r in rows))
                for field in (
                    "node_rss_mb", "node_pss_mb", "trainer_rss_mb", "trainer_pss_mb",
                    "episodes_per_s", "train_s", "trainer_step_s",
                )
            }  # fmt: skip
            row[system]["trainer_processes"] = rows[0]["trainer_processes"] if rows else None
            row[system]["param_bytes_per_node"] = params[n][system]
        out["param_bytes_ratio"][str(n)] = params[n]["adapters"] / params[n]["full"]
        row["engine_tokens_per_s"] = speeds.get(n)
        per_agents[str(n)] = row
    out["by_agents"] = per_agents
    out["runtime_rss_mb"] = runtime_mb
    return out


def analyse_learning(runs: dict[str, list[_results.RunResult]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = sorted({p for rs in runs.values() for r in rs if r.ok for p in r.policies})
    for policy in names:
        finals = {
            s: {
                r.seed: r.policies[policy].accuracy_final
                for r in runs[s]
                if r.ok and policy in r.policies
            }
            for s in SYSTEMS
        }
        befores = {
            s: [
                r.policies[policy].accuracy_before for r in runs[s] if r.ok and policy in r.policies
            ]
            for s in SYSTEMS
        }
        seeds = sorted(set(finals["full"]) & set(finals["adapters"]))
        diffs = [
            finals["adapters"][s] - finals["full"][s]
            for s in seeds
            if finals["adapters"][s] is not None and finals["full"][s] is not None
        ]
        paired = _stats.paired(diffs)
        ci = paired["ci95"]
        out[policy] = {
            "accuracy_before": {s: _stats.spread_json(_stats.spread(befores[s])) for s in SYSTEMS},
            "accuracy_final": {
                s: _stats.spread_json(_stats.spread(finals[s].values())) for s in SYSTEMS
            },
            "accuracy_final_per_seed": {s: finals[s] for s in SYSTEMS},
            "adapters_minus_full": paired,
            "within_noise_or_better": None if ci is None else ci[1] >= 0.0,
        }
    return out


def print_report(summary: dict[str, Any]) -> None:
    res = summary.get("resources")
    if res:
        rows = []
        for n, row in res["by_agents"].items():
            for system in SYSTEMS:
                s = row[system]
                rows.append([
                    f"{n} agents / {system}",
                    str(s["trainer_processes"]),
                    _report.fmt(s["param_bytes_per_node"] / 2**20, "{:.1f}", " MB"),
                    _report.spread_text(s["node_rss_mb"], "{:.0f}", " MB"),
                    _report.spread_text(s["trainer_rss_mb"], "{:.0f}", " MB"),
                    _report.spread_text(s["trainer_pss_mb"], "{:.0f}", " MB"),
                    _report.spread_text(s["episodes_per_s"], "{:.1f}"),
                    _report.spread_text(s["trainer_step_s"], "{:.2f}", " s"),
                ])  # fmt: skip
        _report.console.print(
            _report.table(
                "Agents as full models vs as LoRA adapters of one base (median [min-max])",
                [
                    "agents / system",
                    "trainer procs",
                    "params per node",
                    "node RSS",
                    "trainers RSS",
                    "trainers PSS",
                    "episodes/s",
                    "step time",
                ],
                rows,
            )  # fmt: skip
        )
        for n in res["by_agents"]:
            _report.console.print(
                f"{n} agents, adapters / full: node RSS {_report.fmt(res['node_rss_ratio'][n])}, "
                f"trainers RSS {_report.fmt(res['trainer_rss_ratio'][n])} "
                f"(PSS {_report.fmt(res['trainer_pss_ratio'][n])}), params per node "
                f"{_report.fmt(res['param_bytes_ratio'][n], '{:.3f}')}, episodes/s "
                f"[bold]{_report.fmt(res['episodes_per_s_ratio'][n])}[/]"
            )
        for n, row in res["by_agents"].items():
            speed = row.get("engine_tokens_per_s")
            if speed:
                _report.console.print(
                    f"{n} agents, node engines alone (tokens/s): {n} full-model engines "
                    f"{speed['full_engines']:.0f}, one engine with {n} adapters "
                    f"{speed['adapter_engine']:.0f}, one plain engine with all the requests "
                    f"{speed['one_plain_engine']:.0f}"
                )
        _report.console.print(
            f"runtime floor (python + torch + transformers + peft + trl, no model): "
            f"{_report.fmt(res['runtime_rss_mb'], '{:.0f}', ' MB')} RSS per process"
        )
    learn = summary.get("learning")
    if learn:
        rows = []
        for policy, p in learn.items():
            d = p["adapters_minus_full"]
            ci = d["ci95"]
            rows.append([
                policy,
                _report.spread_text(p["accuracy_before"]["full"], "{:.3f}"),
                _report.spread_text(p["accuracy_final"]["full"], "{:.3f}"),
                _report.spread_text(p["accuracy_final"]["adapters"], "{:.3f}"),
                f"{_report.fmt(d['mean'], '{:+.3f}')}"
                + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " (one seed: no interval)"),
                {True: "yes", False: "no", None: "-"}[p["within_noise_or_better"]],
            ])  # fmt: skip
        _report.console.print(
            _report.table(
                "Learning in the multi-policy recipe: full models vs adapters (paired seeds)",
                [
                    "policy",
                    "held-out acc at start",
                    "final, full",
                    "final, adapters",
                    "adapters - full (95% CI)",
                    "within noise or better",
                ],
                rows,
            )  # fmt: skip
        )
    for note in NOTES:
        _report.console.print(f"[dim]- {note}[/]")


def main(argv: list[str] | None = None) -> int:
    ap = _cli.bench_parser(__doc__)
    _cli.add_output_flags(
        ap,
        quick="resources only: one repeat of 3 steps per size (add learning with --parts)",
        plot=False,
    )
    _cli.add_run_flags(ap, seeds_default=5)
    ap.add_argument("--repeats", type=int, default=None, help="resource runs per size and system")
    ap.add_argument("--resource-steps", type=int, default=None, help="steps of a resource run")
    ap.add_argument(
        "--parts", default=None, help="resources,learning (default: both; --quick: resources)"
    )
    ap.add_argument(
        "--reanalyse",
        type=Path,
        default=None,
        metavar="JSON",
        help="recompute a stored --json file's ratios as ratios of medians (with the per-repeat "
        "spread) from its resource runs, without running, and write them into it",
    )
    ap.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write --json from a tree with uncommitted changes (marked allow_dirty in the "
        "JSON; without it docs/results.md refuses the figures as headlines)",
    )
    ns = ap.parse_args(argv)
    if ns.reanalyse:
        data = reanalyse(ns.reanalyse)
        _report.console.print(f"re-analysed {ns.reanalyse}: {data['episodes_per_s_ratio']}")
        return 0
    if ns.json and not ns.quick and not ns.allow_dirty:
        import _stamp

        if _stamp.stamp().get("dirty"):
            ap.error(
                "the tree has uncommitted changes: a headline is measured on a clean tree "
                "(commit first, or pass --allow-dirty, which marks the JSON)"
            )
    parts = set((ns.parts or ("resources" if ns.quick else "resources,learning")).split(","))
    repeats = ns.repeats or (1 if ns.quick else 3)
    res_steps = ns.resource_steps or (3 if ns.quick else 12)
    seeds = ns.seeds or (1 if ns.quick else 5)
    steps = ns.steps or (8 if ns.quick else 40)
    eval_tasks = ns.eval_tasks or (50 if ns.quick else 200)
    timeout = ns.timeout or (300.0 if ns.quick else 900.0)
    started = time.time()
    summary: dict[str, Any] = {}
    resource_runs: list[dict[str, Any]] = []
    learning_runs: dict[str, list[_results.RunResult]] = {s: [] for s in SYSTEMS}
    with _runs.bench_workdir(ns.workdir, "multi-lora-") as workdir:
        if "resources" in parts:
            params = {n: param_bytes(n) for n in AGENTS}
            speeds = {n: engine_speed(n) for n in AGENTS}
            runtime = runtime_rss_mb()
            for rep in range(repeats):
                for n in AGENTS:
                    order = SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS))
                    for system in order:
                        label = f"{n} agents as {system}, repeat {rep + 1}/{repeats}"
                        with _report.console.status(f"running {label}…"):
                            r = run_resources(n, system, res_steps, rep, workdir, timeout)
                        status = "[green]ok[/]" if r["ok"] else "[red]failed[/]"
                        _report.console.print(
                            f"{status} {label}: {r['wall_s']:.0f}s, node "
                            f"{_report.fmt(r['node_rss_mb'], '{:.0f}', ' MB')}, trainers "
                            f"{_report.fmt(r['trainer_rss_mb'], '{:.0f}', ' MB')}, "
                            f"{_report.fmt(r['episodes_per_s'], '{:.1f}')} episodes/s"
                        )
                        resource_runs.append(r)
            summary["resources"] = analyse_resources(resource_runs, params, runtime, speeds)
        if "learning" in parts:
            for seed in range(seeds):
                order = SYSTEMS if seed % 2 == 0 else tuple(reversed(SYSTEMS))
                for system in order:
                    label = f"multi-policy recipe as {system}, seed {seed}, {steps} steps"
                    learning_runs[system].append(
                        _runs.run_logged(
                            label,
                            lambda s=system, sd=seed: run_learning(
                                s, sd, steps, eval_tasks, workdir, timeout
                            ),
                            None,
                        )  # fmt: skip
                    )
            summary["learning"] = analyse_learning(learning_runs)
    print_report(summary)
    failures = [r for r in resource_runs if not r["ok"]]
    failures += [r for rs in learning_runs.values() for r in rs if not r.ok]
    for r in failures:
        error = r["error"] if isinstance(r, dict) else r.error
        _report.console.print(f"[red]failed:[/] {error}")
    res = summary.get("resources", {})
    if ns.json:
        payload = {
            "benchmark": "multi_lora",
            "quick": ns.quick,
            "settings": {
                "base": BASE,
                "lora": LORA,
                "agents": list(AGENTS),
                "repeats": repeats,
                "resource_steps": res_steps,
                "learning_seeds": list(range(seeds)),
                "learning_steps": steps,
                "eval_tasks": eval_tasks,
                "learning_recipes": {
                    s: str(p.relative_to(_runs.REPO_ROOT)) for s, p in LEARNING.items()
                },
            },
            "node_rss_ratio": res.get("node_rss_ratio"),
            "episodes_per_s_ratio": res.get("episodes_per_s_ratio"),
            "trainer_rss_ratio": res.get("trainer_rss_ratio"),
            "trainer_pss_ratio": res.get("trainer_pss_ratio"),
            "param_bytes_ratio": res.get("param_bytes_ratio"),
            **summary,
            "allow_dirty": bool(ns.allow_dirty),
            "bench_wall_s": time.time() - started,
            "notes": NOTES,
            "resource_runs": resource_runs,
            "learning_runs": {s: [r.to_json() for r in rs] for s, rs in learning_runs.items()},
        }
        _report.write_json(ns.json, payload)
        _report.console.print(f"wrote {ns.json}")
    _report.console.print(f"bench wall time {time.time() - started:.0f}s")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
