"""Scale-out under the Ray launcher: episodes/s with 1, 2 and 4 rollout nodes.

Workload: the agentic I/O-latency task of ``recipes/agentic_math.toml`` (multi-turn arithmetic,
every answer checked by a tool that waits first), with a *fixed* tool latency and a small
concurrency per node, so one node is bound by its episodes in flight waiting on the tool (Little's
law: concurrency / episode time), not by this machine's 2 cores: adding nodes adds episodes in
flight, which is what scaling out buys for agentic RL. Each configuration is one `astraflow train`
run with ``run.launcher = "ray"`` on a local Ray cluster of 2 Ray nodes (two ``ray start``
processes on this machine, the second with the custom resource ``rollout_host``): half the rollout
nodes (rounded up) are placed by default, the rest on the second Ray node through that resource.
Every configuration is measured over the same window, in the same bench run, one after the
other.

Episodes/s: training episodes stored by the dataflow service (``episodes.created_at``) in a window
of ``--duration-s`` that starts ``--warmup-s`` after the first one (start-up excluded); the run is
then stopped with Ctrl-C. The figure of merit is
``scaling_efficiency_4`` = rate(4 nodes) / (4 x rate(1 node)); target >= 0.8.

    python bench/scale_out.py --quick --json /tmp/scale_out.json     # ~5 min
    python bench/scale_out.py --json /tmp/scale_out.json             # longer windows
    ASTRAFLOW_RAY_ADDRESS=127.0.0.1:6379 python bench/scale_out.py   # an existing cluster
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _stamp
from _ray_cluster import SECOND_NODE_LABEL, SECOND_NODE_RESOURCE, LocalRayCluster
from _status import read_status, window_rate

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "agentic_math.toml"
NODE_COUNTS = (1, 2, 4)


def overrides(nodes: int, address: str, out: Path, args: argparse.Namespace) -> list[str]:
    pooled = nodes // 2  # on the second Ray node; the others wherever Ray puts them
    sets = [
        "run.launcher=ray",
        f"run.ray_address={json.dumps(address)}",
        f"run.output_dir={json.dumps(str(out))}",
        f"run.name={json.dumps(f'scale-{nodes}')}",
        "run.max_steps=100000",
        f"rollout.nodes={nodes}",
        f"rollout.concurrency={args.concurrency}",
        "rollout.env_workers=4",
        f'tasks.env_latency={{distribution="fixed", value_s={args.latency_s}, on=["step"], '
        'inner="inline"}',
        "evaluation.every_steps=0",
        "evaluation.at_start=false",
        "logging.report=false",
        # the trainer keeps up and never holds the nodes back: backpressure and lag generous
        "dataflow.buffer_steps=0",
        "dataflow.max_lag=1000",
        'dataflow.policies=[{name="staleness", kwargs={max_staleness=1000, action="drop"}}]',
        "ray.rollout.num_cpus=0",
        f"workflow.max_turns={args.max_turns}",
        # the other half off the second Ray node (a label it does not have)
        f'ray.rollout.labels={{{SECOND_NODE_LABEL[0]}="!{SECOND_NODE_LABEL[1]}"}}',
        "ray.startup_timeout_s=90",
    ]
    if pooled:
        sets.append(
            f"ray.rollout_pools=[{{nodes={pooled}, num_cpus=0, "
            f"resources={{{SECOND_NODE_RESOURCE}=1}}}}]"
        )
    return sets


def run_one(nodes: int, address: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run: started, measured over the window after the first episode plus the warm-up,
    then stopped with Ctrl-C (SIGINT), as a user would."""
    argv = [sys.executable, "-m", "astraflow.cli.main", "train", str(RECIPE), "--no-live"]
    for s in overrides(nodes, address, work, args):
        argv += ["--set", s]
    log = work / f"scale-{nodes}.out"
    run_dir = work / f"scale-{nodes}"
    t0 = time.time()
    first: float | None = None
    # (time, episodes stored) from the run's /status: evaluation is off, so all are training
    samples: list[tuple[float, int]] = []
    with open(log, "w") as f:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        try:
            deadline = t0 + args.startup_timeout_s
            while proc.poll() is None:
                status = read_status(run_dir)
                if status is not None:
                    samples.append((time.time(), int(status["episodes"])))
                    if first is None and samples[-1][1] > 0:
                        first = samples[-1][0]
                        deadline = first + args.warmup_s + args.duration_s
                if time.time() >= deadline:
                    break
                time.sleep(1.0)  # a bench's sampling period, not a hot path
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    rate, counted = None, 0
    if first is not None:
        start = first + args.warmup_s
        rate, counted = window_rate(samples, start, start + args.duration_s)
    actors = {}
    if (run_dir / "actors.json").exists():
        actors = json.loads((run_dir / "actors.json").read_text())
    per_ray_node: dict[str, int] = {}
    for name, info in actors.items():
        if name.startswith("node-"):
            key = info.get("node_id", "?")[:8]
            per_ray_node[key] = per_ray_node.get(key, 0) + 1
    return {
        "nodes": nodes,
        "episodes_per_s": rate,
        "episodes_counted": counted,
        "exit_code": proc.returncode,
        "wall_s": round(time.time() - t0, 1),
        "rollout_nodes_per_ray_node": per_ray_node,
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short windows (~3 min in all)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--duration-s", type=float, default=None, help="wall time of each run")
    ap.add_argument("--warmup-s", type=float, default=None, help="not counted after the first")
    ap.add_argument("--latency-s", type=float, default=3.0, help="fixed tool latency per step")
    # 128 episodes (16 groups of 8) per node: the load of the README's scale-out table
    ap.add_argument("--concurrency", type=int, default=128, help="episodes in flight per node")
    ap.add_argument("--startup-timeout-s", type=float, default=300.0)
    ap.add_argument(
        "--max-turns", type=int, default=3,
        help="tries per problem (the recipe's 3; 1 makes episode time independent of how much "
        "the policy learned during the run, which more nodes speed up)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    args.duration_s = args.duration_s or (40.0 if args.quick else 120.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (10.0 if args.quick else 20.0)

    address = os.environ.get("ASTRAFLOW_RAY_ADDRESS", "")
    cluster = None
    if not address:
        print("starting a local 2-node Ray cluster…", flush=True)
        cluster = LocalRayCluster.start()
        address = cluster.address
        os.environ["RAY_AUTH_MODE"] = "disabled"  # as the cluster runs (see _ray_cluster.py)
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="scale_out") as tmp:
            for n in NODE_COUNTS:
                print(f"{n} rollout node(s): {args.duration_s:.0f} s run…", flush=True)
                results.append(run_one(n, address, Path(tmp), args))
                r = results[-1]
                print(f"  episodes/s {r['episodes_per_s']}, exit {r['exit_code']}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()

    rates = {str(r["nodes"]): r["episodes_per_s"] for r in results}
    one, four = rates.get("1"), rates.get("4")
    eff = four / (4 * one) if one and four else None
    print()
    print(f"{'nodes':>5}  {'episodes/s':>10}  {'vs 1 node':>9}  {'counted':>7}  per Ray node")
    for r in results:
        rate = r["episodes_per_s"]
        rel = f"{rate / one:.2f}x" if rate and one else "-"
        shown = f"{rate:.2f}" if rate else "-"
        print(f"{r['nodes']:>5}  {shown:>10}  {rel:>9}  {r['episodes_counted']:>7}  "
              f"{r['rollout_nodes_per_ray_node']}")  # fmt: skip
    print(f"scaling_efficiency_4 = {eff:.2f} (target >= 0.8)" if eff else "scaling_efficiency_4: -")
    print(
        f"workload: agentic_math ({args.max_turns} turn(s) max), fixed tool latency "
        f"{args.latency_s} s per step, "
        f"{args.concurrency} episodes in flight per node, {args.duration_s:.0f} s per run "
        f"({args.warmup_s:.0f} s warm-up not counted); timings on a shared machine are noisy"
    )
    if args.json:
        _stamp.write_json(
            args.json,
            {
                "episodes_per_s": rates,
                "scaling_efficiency_4": eff,
                "runs": results,
                "settings": {
                    "latency_s": args.latency_s,
                    "concurrency_per_node": args.concurrency,
                    "max_turns": args.max_turns,
                    "duration_s": args.duration_s,
                    "warmup_s": args.warmup_s,
                    "quick": args.quick,
                },
            },
        )
        print(f"wrote {args.json}")
    return 0 if eff is not None else 1


if __name__ == "__main__":
    sys.exit(main())
