"""A real quickstart-sized run with a hostile node beside its own.

The attacker holds only a node token (the shared one every node of the run gets) and tries every
probe of the hostile-node table (issue 25: probes 1-10; probe 11, reward forging, is the code
env's and lives in ``tests/envs/test_sandbox_hostile.py``) against the live service, then keeps
pushing poison until the run ends. Each probe must be refused with its 4xx and reason (or held to
its documented bound), and the run must still end with version == max_steps and every evaluation
done, the poison counted by reason.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from astraflow.protocol.auth import NODE, TRAINER, derive_token
from astraflow.protocol.bounds import MAX_IN_FLIGHT, MAX_METRIC_KEYS, MAX_NODES

# nightly: every probe is a fast test of its own (tests/security/test_probes.py); this is the
# same probes against one long live run
pytestmark = [pytest.mark.nightly, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 12
EVERY = 2
EVAL_TASKS = 16
SETS = [
    f"run.max_steps={MAX_STEPS}",
    "tasks.group_size=4",
    "policies.policy.trainer.groups_per_step=2",
    "rollout.concurrency=16",
    f"evaluation.every_steps={EVERY}",
    f"evaluation.num_tasks={EVAL_TASKS}",
    "dataflow.lease_timeout_s=8",
]


class Attacker:
    """Raw HTTP with one token: bodies no honest client sends."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=30
        )

    def json(self, method: str, path: str, body: Any = None, text: str | None = None, **kw):
        content = text if text is not None else json.dumps(body)
        headers = {"content-type": "application/json", **kw.pop("headers", {})}
        return self.http.request(
            method, path, content=content.encode("utf-8", "surrogatepass"), headers=headers, **kw
        )

    def close(self) -> None:
        self.http.close()


def _traj(tokens: list[int], mask: list[int] | None = None) -> dict:
    n = len(tokens)
    return {
        "role": "agent",
        "tokens": tokens,
        "loss_mask": mask if mask is not None else [0] * (n // 2) + [1] * (n - n // 2),
        "logprobs": [0.0] * n,
        "versions": [0] * n,
    }


def _push(nid: str, lease: dict, traj: dict, reward: Any = 1.0, **extra) -> dict:
    ep = {"task_id": lease["task"]["id"], "trajectories": [traj], "rewards": {"agent": reward}}
    return {"node_id": nid, "lease_id": lease["id"], "episodes": [ep], **extra}


def _detail(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("detail"))
    except ValueError:
        return resp.text[:200]


class Probes:
    """Runs each probe once against the live service and keeps what came back."""

    def __init__(self, url: str, secret: str, victim: str) -> None:
        self.url, self.victim = url, victim
        self.node = Attacker(url, derive_token(secret, NODE))
        self.trainer = Attacker(url, derive_token(secret, TRAINER))
        self.seen: dict[str, tuple[int, str, list[str]]] = {}
        self.started = time.monotonic()
        self.timeline: list[tuple[str, float]] = []  # (probe, seconds since the first)
        reg = self.node.json("POST", "/nodes/register", {"name": "evil", "policies": {"policy": 0}})
        assert reg.status_code == 200, reg.text
        self.nid, self.key = reg.json()["node_id"], reg.json()["node_key"]

    def keep(self, name: str, resp: httpx.Response) -> httpx.Response:
        try:
            fields = list(resp.json().get("fields") or [])
        except ValueError:
            fields = []
        self.seen[name] = (resp.status_code, _detail(resp), fields)
        self.timeline.append((name, round(time.monotonic() - self.started, 1)))
        return resp

    def lease(self) -> dict:
        """One training lease granted after the trainer's first announcement (from then on the
        service knows the policy's vocabulary and context length)."""
        while True:
            resp = self.node.json(
                "POST",
                "/leases",
                {"node_id": self.nid, "max_tasks": 1, "versions": {"policy": 0}, "wait_s": 1},
            )
            assert resp.status_code == 200, resp.text
            grant = resp.json()
            if grant["leases"] and "policy" in grant["latest_versions"]:
                return grant["leases"][0]

    def run_all(self) -> None:
        n, t = self.node, self.trainer
        lease = self.lease()
        # 1: poisoned token arrays
        for name, traj in (
            ("1 out of vocabulary", _traj([1, 2, 1_000_000, 3])),
            ("1 negative id", _traj([1, -5, 2, 3])),
            ("1 empty", _traj([], [])),
            ("1 first token trained", _traj([1, 2, 3, 4], [1, 1, 1, 1])),
        ):
            self.keep(name, n.json("POST", "/trajectories", _push(self.nid, lease, traj)))
        # 2: unstorable values in a registration; /status (msgpack) keeps answering
        for name, text in (
            ("2 int past uint64", '{"policies": {"policy": 18446744073709551616}}'),
            ("2 int below int64", '{"policies": {"policy": -9223372036854775809}}'),
            ("2 lone surrogate", '{"name": "\\ud800", "policies": {"policy": 0}}'),
        ):
            self.keep(name, n.json("POST", "/nodes/register", text=text))
        self.keep(
            "2 status after",
            t.http.get("/status", headers={"accept": "application/msgpack"}),
        )
        # 3: a node's push under the trainer's old, guessable evaluation key
        for v in range(EVERY, MAX_STEPS + 1, EVERY):
            body = _push(self.nid, lease, _traj([1, 2, 3, 4]), idempotency_key=f"eval-policy-v{v}")
            self.keep(f"3 eval key v{v}", n.json("POST", "/trajectories", body))
        # 4: deregister a node of the run (no key, the attacker's own key, a guess)
        for name, headers in (
            ("4 no key", {}),
            ("4 own key", {"x-node-key": self.key}),
            ("4 guessed key", {"x-node-key": "0" * 32}),
        ):
            self.keep(name, n.http.delete(f"/nodes/{self.victim}", headers=headers))
        # 5 and 6: one key for a (parked) lease request and a push
        parked: dict = {}
        ask = {"node_id": self.nid, "max_tasks": 1, "versions": {"policy": 0}}
        waiter = threading.Thread(
            target=lambda: parked.setdefault(
                "r", n.json("POST", "/leases", {**ask, "idempotency_key": "K" * 8, "wait_s": 1})
            )
        )
        waiter.start()
        body = _push(self.nid, self.lease(), _traj([1, 2, 3, 4]), idempotency_key="K" * 8)
        self.keep("5 push under a lease key", n.json("POST", "/trajectories", body))
        waiter.join(30)
        self.keep("5 the parked request", parked["r"])
        self.keep(
            "6 lease under a push key",
            n.json("POST", "/leases", {**ask, "idempotency_key": "K" * 8}),
        )
        # 7: non-finite reward
        text = json.dumps(_push(self.nid, lease, _traj([1, 2, 3, 4]), reward="R"))
        self.keep("7 NaN reward", n.json("POST", "/trajectories", text=text.replace('"R"', "NaN")))
        # 8: huge heartbeats, unknown metric keys, a heartbeat storm, a registration flood
        hb = f"/nodes/{self.nid}/heartbeat"
        ids = [f"lease-{i}" for i in range(MAX_IN_FLIGHT + 1)]
        self.keep("8 in-flight ids", n.json("POST", hb, {"in_flight": ids}))
        many = {f"k{i}": 1.0 for i in range(MAX_METRIC_KEYS + 1)}
        self.keep("8 metric keys", n.json("POST", hb, {"metrics": many}))
        junk = {"episodes": 3.0, **{f"junk{i}": 1.0 for i in range(200)}}
        self.keep("8 unknown metric keys", n.json("POST", hb, {"metrics": junk}))
        for _ in range(40):
            if self.keep("8 heartbeat storm", n.json("POST", hb, {})).status_code == 429:
                break
        # 9: surrogates in ids, deep nesting, integers past int64 (node and trainer token)
        self.keep(
            "9 surrogate id",
            n.json(
                "POST", "/leases", text='{"node_id": "\\ud800", "max_tasks": 1, "versions": {}}'
            ),
        )
        deep = "[" * 1000 + "]" * 1000
        self.keep(
            "9 nesting",
            n.json("POST", "/nodes/register", text='{"policies": {}, "meta": ' + deep + "}"),
        )
        self.keep(
            "9 version past int64",
            n.json("POST", "/leases", {**ask, "versions": {"policy": 2**63}}),
        )
        self.keep(
            "9 trainer version past int64",
            t.json(
                "POST", "/batches", {"policy": "policy", "num_groups": 1, "trainer_version": 2**63}
            ),
        )
        # 10: one push key, two bodies
        lease = self.lease()
        body = _push(self.nid, lease, _traj([1, 2, 3, 4]), idempotency_key="push-key-10")
        self.keep("10 first body", n.json("POST", "/trajectories", body))
        other = _push(self.nid, lease, _traj([1, 2, 3, 5]), idempotency_key="push-key-10")
        self.keep("10 second body", n.json("POST", "/trajectories", other))
        # 8, last (the longest): registrations until the bound
        for i in range(MAX_NODES + 1):
            flood = n.json("POST", "/nodes/register", {"name": f"f{i}", "policies": {"policy": 0}})
            if flood.status_code != 200:
                break
        self.keep("8 registration flood", flood)

    def poison_until(self, stop: threading.Event, codes: list[int]) -> None:
        """Go on leasing like a node and pushing poison instead of episodes. It claims to hold
        the latest version each reply names (a node's word is all the service has), so the
        staleness-aware admission, which holds work back from a node too many versions behind,
        keeps leasing to it."""
        held = {"policy": 0}
        try:
            while not stop.is_set():
                resp = self.node.json(
                    "POST",
                    "/leases",
                    {"node_id": self.nid, "max_tasks": 2, "versions": held, "wait_s": 1},
                )
                if resp.status_code != 200:
                    time.sleep(0.5)
                    continue
                grant = resp.json()
                held = {"policy": int(grant.get("latest_versions", {}).get("policy", 0))}
                for lease in grant["leases"]:
                    bad = _push(self.nid, lease, _traj([1, 2, 10**6, 3]))
                    codes.append(self.node.json("POST", "/trajectories", bad).status_code)
                time.sleep(0.2)
        except httpx.HTTPError:  # the run ended and its service went away
            pass


#: probe -> (status codes allowed, text the reason must contain, a field it must name)
EXPECTED: dict[str, tuple[set[int], str, str | None]] = {
    "1 out of vocabulary": ({422}, "outside the policy's vocabulary", "episodes.0.trajectories.0"),
    "1 negative id": ({422}, "token ids must be >= 0", "episodes.0.trajectories.0"),
    "1 empty": ({422}, "tokens is empty", "episodes.0.trajectories.0"),
    "1 first token trained": ({422}, "loss_mask[0] must be 0", "episodes.0.trajectories.0"),
    "2 int past uint64": ({422}, "policies", "policies"),
    "2 int below int64": ({422}, "policies", "policies"),
    "2 lone surrogate": ({422}, "unicode string", "name"),
    "2 status after": ({200}, "", None),
    "4 no key": ({403}, "only its own node", None),
    "4 own key": ({403}, "only its own node", None),
    "4 guessed key": ({403}, "only its own node", None),
    "5 push under a lease key": ({200}, "", None),
    "5 the parked request": ({200}, "", None),
    "6 lease under a push key": ({200}, "", None),
    "7 NaN reward": ({422}, "finite", "episodes.0.rewards.agent"),
    "8 in-flight ids": ({422}, str(MAX_IN_FLIGHT), "in_flight"),
    "8 metric keys": ({422}, str(MAX_METRIC_KEYS), "metrics"),
    "8 unknown metric keys": ({200}, "", None),
    "8 heartbeat storm": ({429}, "exceed the limit", None),
    # one caller's registrations are rate-limited long before MAX_NODES (issue 48 #7)
    "8 registration flood": ({429}, "registrations by the node token", None),
    "9 surrogate id": ({422}, "unicode string", "node_id"),
    "9 nesting": ({422}, "", None),
    "9 version past int64": ({422}, "", "versions.policy"),
    "9 trainer version past int64": ({422}, "", "trainer_version"),
    "10 first body": ({200}, "", None),
    "10 second body": ({409}, "'push-key-10'", None),
    # 3: any answer but a server error; what matters is that every evaluation still runs
    **{
        f"3 eval key v{v}": (set(range(200, 500)), "", None)
        for v in range(EVERY, MAX_STEPS + 1, EVERY)
    },
}


def _unmet(seen: dict[str, tuple[int, str, list[str]]]) -> list[str]:
    bad = [f"{name}: never tried" for name in EXPECTED if name not in seen]
    for name, (code, detail, fields) in seen.items():
        codes, text, field = EXPECTED[name]
        if code not in codes or text not in detail:
            bad.append(f"{name}: {code} {detail[:200]!r}")
        elif field is not None and not any(f.startswith(field) for f in fields):
            bad.append(f"{name}: fields {fields} do not name {field}")
    return bad


def test_a_hostile_node_cannot_stop_a_run(tmp_path):
    out = tmp_path / "runs"
    run_dir = out / "quickstart"
    sets = []
    for s in [*SETS, f"run.output_dir={json.dumps(str(out))}"]:
        sets += ["--set", s]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "astraflow.cli.main",
            "train",
            "recipes/quickstart.toml",
            "--no-live",
            *sets,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    stop = threading.Event()
    codes: list[int] = []
    status: dict = {}
    probes = None
    try:
        url_file, secret_file = run_dir / "dataflow.url", run_dir / "run.secret"
        deadline = time.time() + 300
        while not (url_file.exists() and secret_file.exists()):
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.2)
        url, secret = url_file.read_text().strip(), secret_file.read_text().strip()
        trainer = {"authorization": f"Bearer {derive_token(secret, TRAINER)}"}
        victim = None
        while victim is None:  # the run's own node, as only a trainer or admin may see it
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-4000:]
            try:
                nodes = httpx.get(f"{url}/status", headers=trainer, timeout=10).json()["nodes"]
                victim = next((x["id"] for x in nodes if x["name"] != "evil"), None)
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        probes = Probes(url, secret, victim)
        probes.run_all()
        # the probes ran beside the run, not after it: it was still training when they ended
        during = httpx.get(f"{url}/status", headers=trainer, timeout=10).json()
        version_after_probes = during["policies"]["policy"]["latest_version"]
        poisoner = threading.Thread(target=probes.poison_until, args=(stop, codes), daemon=True)
        poisoner.start()
        while proc.poll() is None:  # what the service counted, until it goes away
            try:
                status = msgpack.unpackb(
                    httpx.get(
                        f"{url}/status",
                        headers={**trainer, "accept": "application/msgpack"},
                        timeout=10,
                    ).content
                )
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1.0)
        output = proc.stdout.read()
    finally:
        stop.set()
        if probes is not None:
            probes.node.close()
            probes.trainer.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-4000:]
    assert _unmet(probes.seen) == [], "\n".join(_unmet(probes.seen))
    assert version_after_probes < MAX_STEPS, (
        f"the run ended before the probes did (raise MAX_STEPS): {probes.timeline}"
    )
    records = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    steps = [r for r in records if r.get("type") == "step"]
    assert max(r["version"] for r in steps) == MAX_STEPS
    # every evaluation the trainer asked for ran to the end on every task
    evals = {r["version"]: r for r in records if r.get("type") == "eval"}
    assert set(range(EVERY, MAX_STEPS + 1, EVERY)) <= set(evals), sorted(evals)
    assert all(r["n"] == EVAL_TASKS and math.isfinite(r["accuracy"]) for r in evals.values())
    # the poison that kept coming was refused at the door and counted by reason
    assert codes and all(c == 422 for c in codes), codes
    refused = status.get("refused", {})
    assert refused.get("422 POST /trajectories: episodes.*.trajectories.*.tokens", 0) >= 1, refused
    assert refused.get("422 POST /trajectories: episodes.*.rewards.agent", 0) >= 1, refused
    # the victim was never deregistered: it pushed until the end
    summary = [r for r in records if r.get("type") == "run_summary"][-1]
    assert summary["nodes"][probes.victim]["episodes"] > 0
