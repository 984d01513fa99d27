"""Cross-region rollout: a remote region behind a slow, lossy link, partitioned and healed.

A real training run (``recipes/agentic_math.toml``: multi-turn arithmetic whose every answer waits
on a log-normal tool delay; the built-in tiny policy) is started by the local launcher
(``LocalLauncher``: dataflow service, trainer and one local rollout node in the home namespace, the
dataflow bound to the home end of the link). A remote region is made of network namespaces
(``bench/_netns.py``): the region namespace sits behind an emulated WAN link (100 ms RTT,
50 Mbit/s, 1 % packet loss each way; TUN devices bridged by a user-space packet forwarder for delay
and loss, ``tbf`` for the rate, so the kernel's own TCP runs over it), and a NAT-like namespace
inside the region has no inbound route at all: its node reaches the home services only through a
TCP gateway in the region. The region runs a weight cache (``astraflow serve weight-cache``) that
fetches each file once over the link from the trainer's weight server; its nodes use it
(``--weight-cache``). The scenario:

1. the run starts at home; once it is training, ``probe`` measures one version's update over the
   link from inside the empty region, by delta and by full snapshot, for a few versions
   (``remote_delta_sync_s`` / ``remote_full_sync_s``: fetch, verify, parse and apply/load, as a
   node does; the link carries nothing else then);
2. node ``r0`` joins the region mid-run (phase "1 node") and, some versions later, ``r1-nat`` (in
   the NAT-like namespace) and ``r2`` join (phase "3 nodes"): bytes crossing the link per published
   version are measured in each phase (weights and dataflow traffic apart, from the forwarder's
   per-port counters);
3. the link is cut for ``--partition-s`` (30 s; 12 s with ``--quick``) with leases timing out
   meanwhile (``dataflow.lease_timeout_s`` = 10 s), so the region's tasks go back to the queue and
   the home node redoes them, and heals; ``partition_recovery_s`` is the time from the heal to the
   first group the region delivers again;
4. ``r0`` leaves (SIGTERM: it finishes or releases its groups and deregisters);
5. the run trains to ``max_steps``; then ``tasks_lost`` and ``tasks_duplicated`` are computed from
   the dataflow's own audit (``bench/_store_checks.py``; both must be 0) with episodes/s per region.

Needs root, iproute2 and /dev/net/tun; skips with the reason otherwise (the JSON then says
``skipped``). Everything it creates (namespaces, devices, routes, processes) is removed on exit.

Measured on the emulated link: TCP connect RTT 101-103 ms, a 4.6 MB transfer ~1 s. A plain file
cache in the region let ~1.5 copies of each version cross the link with 3 nodes (hence snapshots
rebuilt from deltas), and in an early run a 12 s partition filled asyncio's default thread pool with
stuck relays so the region never synced again (hence async relays with bounded timeouts).

    python bench/cross_region.py --quick --json out.json     # ~2-3 min, 12 s partition
    python bench/cross_region.py --json out.json              # 30 s partition, longer run
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import _netns as N
import _records
import _report
import _runs
import _store_checks as C

sys.path.insert(0, str(_runs.REPO_ROOT))

RECIPE = _runs.REPO_ROOT / "recipes" / "agentic_math.toml"
POLICY = "policy"
REGION = "remote"


@dataclass
class Plan:
    max_steps: int
    partition_s: float
    #: versions published in each bytes-per-version phase
    phase_versions: int
    #: versions the probe measures
    probe_versions: int
    #: seconds between the heal and r0 leaving
    leave_after_s: float
    concurrency: int = 64
    lease_timeout_s: float = 10.0
    timeout_s: float = 1200.0
    cache: bool = True


QUICK = Plan(max_steps=55, partition_s=12.0, phase_versions=6, probe_versions=2, leave_after_s=6.0)
FULL = Plan(max_steps=160, partition_s=30.0, phase_versions=10, probe_versions=5,
            leave_after_s=20.0, timeout_s=2400.0)  # fmt: skip

NOTES = [
    "Link: TUN devices bridged by a user-space packet forwarder (one-way delay RTT/2; each packet "
    "dropped with probability `loss`, independently per direction) and a tbf qdisc of `rate` on "
    "each direction. Kernel TCP runs end to end over it, so loss costs what it costs a real "
    "connection (retransmits, congestion control). The forwarder shares the machine's CPUs.",
    "NAT-like node: its namespace has no route beyond the region's veth subnet, the region does "
    "not forward, and the home namespace has an explicit unreachable route for it; it reaches the "
    "dataflow service through a TCP gateway in the region (what NAT gives at the TCP level).",
    "Bytes per version: IP bytes (headers included, both directions) the forwarder carried to or "
    "from the trainer's weight server and the dataflow service, divided by the versions published "
    "in the phase; 'copies' = weight bytes per version / the snapshot size.",
]


# ----------------------------------------------------------------------------- the probe


def probe_main(args: argparse.Namespace) -> None:
    """Run inside the region: time version updates over the link, as a node would do them."""
    import socket

    from astraflow.weights import WeightClient, state_digest

    host, port = args.url.split("//", 1)[1].rsplit(":", 1)
    rtts = []
    for _ in range(5):
        t0 = time.perf_counter()
        with socket.create_connection((host, int(port)), timeout=10):
            rtts.append(time.perf_counter() - t0)
    versions = [int(v) for v in args.versions.split(",")]
    out: dict[str, Any] = {"connect_rtt_ms": [round(r * 1000, 1) for r in rtts], "versions": []}
    with WeightClient(args.url, args.token, timeout=120.0, retries=8) as client:
        state = client.fetch_full(args.policy, versions[0] - 1)  # untimed: the starting point
        digest = state_digest(state)
        for v in versions:
            meta = client.meta(args.policy, v)
            t0 = time.perf_counter()
            upd = client.fetch_update(args.policy, v - 1, digest, want_version=v)
            if upd.delta is not None:
                upd.delta.apply_(state, parent_digest=digest)
            delta_s = time.perf_counter() - t0
            kind = "delta" if upd.delta is not None else "full"
            t0 = time.perf_counter()
            full = client.fetch_full(args.policy, v, meta)
            full_s = time.perf_counter() - t0
            state, digest = full, meta["digest"]
            out["versions"].append({
                "version": v, "delta_s": delta_s, "delta_kind": kind, "full_s": full_s,
                "delta_bytes": meta.get("delta_bytes"), "full_bytes": meta["full_bytes"],
            })  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=2))


# ----------------------------------------------------------------------------- the scenario


class Run:
    """The launcher in a thread plus the helpers the scenario needs."""

    def __init__(self, launcher):
        self.launcher = launcher
        self.outcome: str | None = None
        self.thread: threading.Thread | None = None

    def start(self, timeout_s: float):
        handle = self.launcher.start()
        self.started = time.time()

        def wait():
            self.outcome = self.launcher.wait(timeout_s=timeout_s)

        self.thread = threading.Thread(target=wait, name="launcher-wait", daemon=True)
        self.thread.start()
        return handle

    def status(self) -> dict | None:
        return self.launcher.status()

    def version(self) -> int:
        st = self.status() or {}
        return int(((st.get("policies") or {}).get(POLICY) or {}).get("latest_version") or 0)

    def node(self, name: str) -> dict | None:
        st = self.status() or {}
        for n in st.get("nodes", []):
            if n.get("name") == name and n.get("state") == "active":
                return n
        return None

    def until(self, what: str, cond, timeout: float, poll: float = 0.5):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = cond()
            if value:
                return value
            if self.outcome is not None:
                raise RuntimeError(
                    f"the run ended ({self.outcome}) while waiting for {what}: raise "
                    f"--max-steps so the scenario fits in the run"
                )
            time.sleep(poll)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def run_scenario(plan: Plan, wd: Path, link: N.LinkSpec) -> dict[str, Any]:
    from astraflow.launch.local import LocalLauncher
    from astraflow.launch.processes import service_env
    from astraflow.protocol.auth import derive_token
    from astraflow.recipe import load_recipe

    events: dict[str, float] = {}
    marks: dict[str, Any] = {}
    nodes: dict[str, Any] = {}
    with N.RemoteRegion(wd / "net", link=link) as region:
        overrides = [
            f"run.max_steps={plan.max_steps}",
            f"run.output_dir={json.dumps(str(wd))}",
            "policies.policy.trainer.groups_per_step=4",
            "policies.policy.trainer.keep_versions=60",
            "rollout.nodes=1",
            f"rollout.concurrency={plan.concurrency}",
            f"dataflow.host={json.dumps(region.home_ip)}",
            f"dataflow.lease_timeout_s={plan.lease_timeout_s}",
            "evaluation.every_steps=0",
            "evaluation.at_start=false",
        ]
        recipe = load_recipe(RECIPE, overrides)
        run_dir = recipe.run.run_dir
        run = Run(LocalLauncher(recipe, run_dir, eval_grace_s=30.0))
        try:
            handle = run.start(plan.timeout_s)
            events["start"] = time.time()
            # the region gets node tokens only (lease, push, read weights), as a real one would
            node_token = derive_token(handle.token, "node")
            env = service_env(node_token, 1)
            df_port = _port(handle.url)
            location = run.until(
                "the trainer's weight server",
                lambda: (((run.status() or {}).get("policies") or {}).get(POLICY) or {}).get(
                    "weight_location"
                ),
                300,
            )
            wport = _port(location)
            # the relays give the weights and the probe their own ports on the link's home end
            # (the weight server listens where it announced: dataflow.host, or loopback)
            whost = urlsplit(location).hostname or "127.0.0.1"
            w_relay = region.relay("weights-relay", f"{region.home_ip}:0", f"{whost}:{wport}", "")
            p_relay = region.relay("probe-relay", f"{region.home_ip}:0", f"{whost}:{wport}", "")
            gw_port = region.relay(
                "nat-gateway", f"{region.gw_ip}:0", f"{region.home_ip}:{df_port}", region.ns
            )
            weights_url = f"http://{region.home_ip}:{w_relay}"
            if plan.cache:
                cache_file = wd / "cache.url"
                region.start("weight-cache", [
                    sys.executable, "-m", "astraflow.cli.main", "serve", "weight-cache",
                    "--upstream", weights_url, "--host", "0.0.0.0", "--port", "0",
                    "--port-file", str(cache_file), "--dir", str(wd / "weight-cache"),
                ], env=env)  # fmt: skip
                cache_port = _port(
                    run.until("the weight cache", lambda: _read(cache_file), 120, poll=0.2)
                )
                cache_for = {
                    region.ns: f"http://127.0.0.1:{cache_port}",
                    region.nat_ns: f"http://{region.gw_ip}:{cache_port}",
                }
            else:
                gw_w = region.relay(
                    "nat-weights", f"{region.gw_ip}:0", f"{region.home_ip}:{w_relay}", region.ns
                )
                cache_for = {region.ns: weights_url, region.nat_ns: f"http://{region.gw_ip}:{gw_w}"}
            join_for = {
                region.ns: f"http://{region.home_ip}:{df_port}",
                region.nat_ns: f"http://{region.gw_ip}:{gw_port}",
            }

            def start_node(name: str, ns: str):
                argv = [
                    sys.executable, "-m", "astraflow.cli.main", "serve", "rollout",
                    "--join", join_for[ns], "--weight-cache", cache_for[ns],
                    "--name", name, "--region", REGION, "--concurrency", str(plan.concurrency),
                    "--drain-timeout", "10",
                ]  # fmt: skip
                nodes[name] = region.start(name, argv, ns=ns, env=env)
                events[f"{name}_started"] = time.time()

            def synced(name: str, at_least: int):
                """The node caught up: it holds ``at_least`` (the version when it joined), so a
                phase's bytes do not include its initial full download. Not "within a version of
                the latest": a trainer that publishes faster than the link delivers a version
                keeps every remote node a few versions behind, and the phase would never start."""
                n = run.node(name)
                held = int((n or {}).get("versions", {}).get(POLICY, -1))
                return n is not None and held >= at_least

            # 1. the probe, over the otherwise idle link
            first = run.until("a few trained versions", lambda: run.version() >= 3, 300)
            v = run.version()
            probe_versions = list(range(max(1, v - plan.probe_versions + 1), v + 1))
            probe_out = wd / "probe.json"
            probe = region.start("probe", [
                sys.executable, str(Path(__file__).resolve()), "probe",
                "--url", f"http://{region.home_ip}:{p_relay}", "--token", node_token,
                "--policy", POLICY, "--versions", ",".join(map(str, probe_versions)),
                "--out", str(probe_out),
            ], env=env)  # fmt: skip
            probe.wait(300)
            marks["probe"] = json.loads(probe_out.read_text()) if probe_out.exists() else None
            del first

            # 2. phase "1 node"
            start_node("r0", region.ns)
            v_join = run.version()
            run.until("r0 to catch up", lambda: synced("r0", v_join), 300)
            events["phase1_start"], marks["phase1_v0"] = time.time(), run.version()
            run.until(
                "phase 1 versions",
                lambda: run.version() >= marks["phase1_v0"] + plan.phase_versions,
                600,
            )
            events["phase1_end"] = time.time()
            start_node("r1-nat", region.nat_ns)
            start_node("r2", region.ns)
            v_join = run.version()
            run.until(
                "r1-nat and r2 to catch up",
                lambda: synced("r1-nat", v_join) and synced("r2", v_join),
                300,
            )
            events["phase2_start"], marks["phase2_v0"] = time.time(), run.version()
            run.until(
                "phase 2 versions",
                lambda: run.version() >= marks["phase2_v0"] + plan.phase_versions,
                600,
            )
            events["phase2_end"] = time.time()
            marks["nat_listening"] = _listening(region.nat_ns)
            marks["nat_inbound"] = _inbound_blocked(region.nat_ip)

            # 3. partition and heal
            events["partition"] = region.partition(True)
            time.sleep(plan.partition_s)
            events["heal"] = region.partition(False)

            # 4. r0 leaves
            time.sleep(plan.leave_after_s)
            events["r0_leave"] = time.time()
            N.stop(nodes["r0"], signal.SIGTERM, timeout=60)
            marks["r0_exit"] = nodes["r0"].returncode

            # 5. train to the end
            run.until("the run to finish", lambda: run.outcome is not None, plan.timeout_s, 1.0)
        finally:
            events["end"] = time.time()
            for name in ("r1-nat", "r2", "r0"):
                N.stop(nodes.get(name), signal.SIGTERM, timeout=30)
            run.launcher.stop()
            if run.thread is not None:
                run.thread.join(30)
            marks["wan"] = region.counters()
            marks["qdisc_drops"] = region.qdisc_drops()
            marks["ports"] = {"dataflow": df_port, "weights": w_relay, "probe": p_relay}
    return analyse(plan, link, run_dir, wd, events, marks, run.outcome)


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() and path.read_text().strip() else None


def _listening(ns: str) -> int:
    """TCP sockets listening in namespace ``ns`` (a node must have none: it only dials out)."""
    out = N.sh("ss", "-Hltn", ns=ns, check=False).stdout
    return len([line for line in out.splitlines() if line.strip()])


def _inbound_blocked(ip: str) -> bool:
    import socket

    try:
        socket.create_connection((ip, 9), timeout=2).close()
    except OSError:
        return True
    return False


# ----------------------------------------------------------------------------- analysis


_SYNC_RE = re.compile(
    r"policy (\S+): v(\d+) -> v(\d+) \((delta|full)\) in ([\d.]+)s \(fetch ([\d.]+)s"
)


def node_syncs(log: Path) -> list[dict[str, Any]]:
    """Weight updates a node logged: from, to, kind, seconds (fetch through the region's cache)."""
    out = []
    if not log.exists():
        return out
    for m in _SYNC_RE.finditer(log.read_text(errors="replace")):
        out.append({"from": int(m[2]), "to": int(m[3]), "kind": m[4], "s": float(m[5]),
                    "fetch_s": float(m[6])})  # fmt: skip
    return out


_CACHE_RE = re.compile(r"(fetched (full|delta) of \S+ v\d+ from upstream|rebuilt the snapshot)")


def cache_activity(log: Path) -> dict[str, int]:
    """What the region's weight cache did: files downloaded over the link, snapshots rebuilt."""
    out = {"fetched_full": 0, "fetched_delta": 0, "rebuilt_full": 0}
    if log.exists():
        for m in _CACHE_RE.finditer(log.read_text(errors="replace")):
            out["rebuilt_full" if m[2] is None else f"fetched_{m[2]}"] += 1
    return out


def _versions_between(summary: dict[str, Any], t0: float, t1: float) -> list[tuple[int, float]]:
    return [(v, at) for v, at, _ in summary["versions"].get(POLICY, []) if t0 < at <= t1]


def _version_at(summary: dict[str, Any], t: float) -> int | None:
    return max((v for v, at, _ in summary["versions"].get(POLICY, []) if at <= t), default=None)


def _recovery(summary: dict[str, Any], heal: float) -> dict[str, float | None]:
    """Seconds from the heal to the region's first lease and first delivered group."""
    after = C.delivered_after(summary, C.node_ids(summary, region=REGION), heal)
    first_ep, first_lease = after["first_push"], after["first_lease"]
    return {
        "push": None if first_ep is None else first_ep - heal,
        "lease": None if first_lease is None else first_lease - heal,
    }


def analyse(plan, link, run_dir: Path, wd: Path, events, marks, outcome) -> dict[str, Any]:
    records = _records.read_jsonl(run_dir / "metrics.jsonl")
    summary = C.summary_of(run_dir)
    checks = C.check_store(summary)
    regions = C.episodes_by_region(summary)
    times = _records.dataflow_times(records)
    acked = [b for bs in times.batches.values() for b in bs]
    t0 = times.training_start or events["start"]
    t1 = max((a for _, a in acked), default=events["end"])
    window = max(t1 - t0, 1e-6)
    eps = {r: d["episodes"] / window for r, d in regions.items()}
    per_node = {}
    for r, d in regions.items():
        for name, n in d["nodes"].items():
            start = n.get("registered_at") or n["first"]
            per_node[name] = {"region": r, "episodes": n["episodes"],
                              "episodes_per_s": n["episodes"] / max(n["last"] - start, 1e-6)}  # fmt: skip

    wan = marks.get("wan") or []
    ports = marks["ports"]
    phases = {}
    announced = summary["versions"].get(POLICY, [])
    full_bytes = announced[-1][2] if announced else None
    for key, label, nodes_in in (("phase1", "1_node", 1), ("phase2", "3_nodes", 3)):
        a, b = events.get(f"{key}_start"), events.get(f"{key}_end")
        if a is None or b is None:
            continue
        versions = _versions_between(summary, a, b)
        n = max(len(versions), 1)
        wb = N.bytes_between(wan, a, b, {ports["weights"]})
        db_ = N.bytes_between(wan, a, b, {ports["dataflow"]})
        phases[label] = {
            "nodes": nodes_in,
            "seconds": b - a,
            "versions": len(versions),
            "weight_bytes_per_version": wb / n,
            "dataflow_bytes_per_version": db_ / n,
            "total_bytes_per_version": N.bytes_between(wan, a, b) / n,
            "weight_copies_per_version": (wb / n / full_bytes) if full_bytes else None,
        }
    probe = marks.get("probe") or {}
    pv = probe.get("versions", [])
    deltas = [p["delta_s"] for p in pv if p["delta_kind"] == "delta"]
    fulls = [p["full_s"] for p in pv]
    rec = _recovery(summary, events["heal"]) if "heal" in events else {"push": None, "lease": None}
    syncs = {
        name: node_syncs(wd / "net" / "logs" / f"{name}.log") for name in ("r0", "r1-nat", "r2")
    }
    drops = (wan[-1].get("drops") if wan else {}) or {}
    packets = (wan[-1].get("packets") if wan else {}) or {}
    return {
        "benchmark": "cross_region",
        "plan": asdict(plan),
        "link": {
            **asdict(link),
            "measured_connect_rtt_ms": probe.get("connect_rtt_ms"),
            "packets": packets,
            "dropped": drops,
            "bottleneck_queue_drops": marks.get("qdisc_drops"),
        },  # fmt: skip
        "outcome": outcome,
        "steps": max((len(v) for v in times.batches.values()), default=0),
        "tasks_lost": checks["tasks_lost"],
        "tasks_duplicated": checks["tasks_duplicated"],
        "store_checks": checks,
        "episodes_per_s": eps,
        "episodes": {r: d["episodes"] for r, d in regions.items()},
        "nodes": per_node,
        "training_window_s": window,
        "remote_delta_sync_s": statistics.median(deltas) if deltas else None,
        "remote_full_sync_s": statistics.median(fulls) if fulls else None,
        "remote_sync_per_version": pv,
        "node_syncs_via_cache": syncs,
        "partition_s": plan.partition_s,
        "partition_recovery_s": rec["push"],
        "partition_lease_recovery_s": rec["lease"],
        "bytes_per_version": phases,
        "weight_cache": cache_activity(wd / "net" / "logs" / "weight-cache.log")
        if plan.cache
        else None,
        "nat_node_listening_sockets": marks.get("nat_listening"),
        "nat_inbound_blocked": marks.get("nat_inbound"),
        "r0_leave_exit_code": marks.get("r0_exit"),
        "events": {
            k: {"t": round(v - events["start"], 2), "version": _version_at(summary, v)}
            for k, v in sorted(events.items(), key=lambda kv: kv[1])
        },
        "run_dir": str(run_dir),
        "notes": NOTES,
    }


# ----------------------------------------------------------------------------- report


def report(res: dict[str, Any]) -> None:
    f = _report.fmt
    link = res["link"]
    _report.console.print(_report.table(
        f"Cross-region run ({'quick' if res['quick'] else 'full'}): link {link['rtt_ms']:.0f} ms "
        f"RTT, {link['rate_mbit']:.0f} Mbit/s, {link['loss'] * 100:.0f} % loss",
        ["figure", "value"],
        [
            ["tasks_lost", str(res["tasks_lost"])],
            ["tasks_duplicated", str(res["tasks_duplicated"])],
            ["run outcome / steps", f"{res['outcome']} / {res['steps']}"],
            ["partition (s)", f(res["partition_s"], "{:.0f}")],
            ["partition_recovery_s (first group delivered)", f(res["partition_recovery_s"])],
            ["  first lease after heal (s)", f(res["partition_lease_recovery_s"])],
            ["expired / superseded / released leases",
             f"{res['store_checks']['expired_leases']} / {res['store_checks']['superseded_leases']}"
             f" / {res['store_checks']['released_leases']}"],
            ["late pushes rejected", json.dumps(res["store_checks"]["pushes_rejected"])],
            ["NAT node: listening sockets / inbound blocked",
             f"{res['nat_node_listening_sockets']} / {res['nat_inbound_blocked']}"],
            ["measured TCP connect RTT (ms)", str(link.get("measured_connect_rtt_ms"))],
            ["link packets dropped (loss / partition)",
             f"{link['dropped'].get('loss', 0)} / {link['dropped'].get('partition', 0)}"],
        ],
    ))  # fmt: skip
    _report.console.print(_report.table(
        f"Episodes per region (training window {res['training_window_s']:.0f} s)",
        ["region / node", "episodes", "episodes/s"],
        [[r, str(res["episodes"][r]), f(res["episodes_per_s"][r])] for r in res["episodes"]]
        + [[f"  {n} ({d['region']})", str(d["episodes"]), f(d["episodes_per_s"])]
           for n, d in res["nodes"].items()],
    ))  # fmt: skip
    _report.console.print(_report.table(
        "One version's update over the slow link (probe in the region, nothing else on the link)",
        ["version", "delta s", "delta kind", "full s", "delta MB", "full MB"],
        [[str(p["version"]), f(p["delta_s"]), p["delta_kind"], f(p["full_s"]),
          f((p["delta_bytes"] or 0) / 1e6), f(p["full_bytes"] / 1e6)]
         for p in res["remote_sync_per_version"]],
    ))  # fmt: skip
    _report.console.print(_report.table(
        "Bytes crossing the slow link per published version"
        + (" (region weight cache)" if res["plan"]["cache"] else " (no cache)"),
        ["phase", "versions", "weights MB", "copies", "dataflow MB", "total MB"],
        [[k, str(p["versions"]), f(p["weight_bytes_per_version"] / 1e6),
          f(p["weight_copies_per_version"]), f(p["dataflow_bytes_per_version"] / 1e6),
          f(p["total_bytes_per_version"] / 1e6)] for k, p in res["bytes_per_version"].items()],
    ))  # fmt: skip
    _report.console.print(
        f"remote_delta_sync_s {f(res['remote_delta_sync_s'])}, remote_full_sync_s "
        f"{f(res['remote_full_sync_s'])} (median per version)"
    )
    if res.get("weight_cache"):
        c = res["weight_cache"]
        _report.console.print(
            f"region weight cache: downloaded {c['fetched_full']} snapshot(s) and "
            f"{c['fetched_delta']} delta(s) over the link, rebuilt {c['rebuilt_full']} snapshot(s)"
        )
    for note in res["notes"]:
        _report.console.print(f"[dim]- {note}[/]")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        for opt in ("--url", "--token", "--policy", "--versions", "--out"):
            ap.add_argument(opt, required=True)
        probe_main(ap.parse_args())
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter run, 12 s partition")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--workdir", type=Path, help="keep the run here (default: a temp dir)")
    ap.add_argument("--partition-s", type=float, help="override the partition length")
    ap.add_argument("--max-steps", type=int, help="override the run's max_steps")
    ap.add_argument("--rtt-ms", type=float, default=100.0)
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-cache", action="store_true", help="region nodes fetch over the link themselves"
    )
    args = ap.parse_args()
    plan = QUICK if args.quick else FULL
    if args.partition_s is not None:
        plan.partition_s = args.partition_s
    if args.max_steps is not None:
        plan.max_steps = args.max_steps
    plan.cache = not args.no_cache
    reason = N.unavailable_reason()
    if reason:
        _report.console.print(f"[yellow]cross_region skipped: {reason}[/]")
        if args.json:
            _report.write_json(args.json, {"benchmark": "cross_region", "skipped": reason})
        return
    # SIGTERM unwinds like Ctrl-C, so namespaces, routes and processes are removed (finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    link = N.LinkSpec(rtt_ms=args.rtt_ms, rate_mbit=args.rate_mbit, loss=args.loss, seed=args.seed)
    with _runs.bench_workdir(args.workdir, "cross-region-") as wd:
        with _report.console.status("running the cross-region scenario…"):
            res = run_scenario(plan, wd, link)
        res["quick"] = args.quick
        report(res)
        if args.json:
            _report.console.print(f"wrote {_report.write_json(args.json, res)}")
        bad = res["tasks_lost"] or res["tasks_duplicated"] or res["outcome"] != "done"
        if bad:
            _report.console.print(
                f"[red]invariants violated or run failed; run dir {res['run_dir']}[/]"
            )
            sys.exit(1)


if __name__ == "__main__":
    main()
