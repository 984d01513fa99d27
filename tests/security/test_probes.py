"""Every probe of the hostile-node table (issue 25), against a real service on loopback.

Each probe is what a caller holding only a node token did; each must now be a 4xx with a clear
reason naming the field or the bound (or the documented behaviour), never a 500, and must leave
the service working for everyone else. Probe 11 (reward forging in the code env) lives with the
other sandbox attacks: ``tests/envs/test_sandbox_hostile.py``.
"""

from __future__ import annotations

import json
import math
import threading

import pytest
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe
from hostile import NODE_TOKEN, TRAINER_TOKEN, VOCAB, Raw, detail, push_body, traj

from astraflow.protocol.bounds import MAX_IN_FLIGHT, MAX_METRIC_KEYS, MAX_NESTING
from astraflow.protocol.client import SyncDataflowClient
from astraflow.trainer.main import evaluation_key


@pytest.fixture
def svc(tmp_path):
    recipe = make_recipe(tmp_path)
    with ThreadedService(recipe, tmp_path / "df.db") as s:
        with SyncDataflowClient(s.url, TRAINER_TOKEN, retries=0) as trainer:
            # what the trainer announces at start: the model's vocabulary and context length
            trainer.announce_version(
                policy="policy", version=0, location="mem://0", digest="d0", vocab_size=VOCAB,
                context_length=256,
            )  # fmt: skip
        yield s


@pytest.fixture
def node(svc):
    raw = Raw(svc.url)
    yield raw
    raw.close()


def register(raw: Raw, name: str = "evil") -> dict:
    resp = raw.json("POST", "/nodes/register", {"name": name, "policies": {"policy": 0}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def lease_one(raw: Raw, node_id: str, **extra) -> dict:
    resp = raw.json(
        "POST",
        "/leases",
        {"node_id": node_id, "max_tasks": 1, "versions": {"policy": 0}, **extra},
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["leases"][0]


def status(svc) -> dict:
    with SyncDataflowClient(svc.url, TRAINER_TOKEN, retries=0) as c:
        return c.status().model_dump()


# -- probe 1: out-of-vocabulary, negative, empty, first-token-trained ---------------------------
@pytest.mark.parametrize(
    ("tokens", "mask", "field", "reason"),
    [
        ([1, 2, 1_000_000, 3], None, "tokens", f"outside the policy's vocabulary [0, {VOCAB})"),
        ([1, -5, 2, 3], None, "tokens", "token ids must be >= 0"),
        ([], [], "tokens", "tokens is empty"),
        ([1, 2, 3, 4], [1, 1, 1, 1], "loss_mask", "loss_mask[0] must be 0"),
        (list(range(300)), None, "tokens", "exceed the policy's context length of 256"),
    ],
)
@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_probe1_poisoned_token_arrays_are_refused(svc, node, tokens, mask, field, reason, encoding):
    reg = register(node)
    lease = lease_one(node, reg["node_id"])
    body = push_body(reg["node_id"], lease, traj(tokens, mask))
    if encoding == "msgpack":  # packed arrays: the service's fast path checks them with numpy
        import numpy as np

        tr = body["episodes"][0]["trajectories"][0]
        for name, dtype in (("tokens", "<i4"), ("loss_mask", "<i4"), ("versions", "<i4")):
            tr[name] = np.asarray(tr[name], dtype=dtype).tobytes()
        tr["logprobs"] = np.asarray(tr["logprobs"], dtype="<f4").tobytes()
        resp = node.msgpack("POST", "/trajectories", body)
        reply = __import__("msgpack").unpackb(resp.content)
    else:
        resp = node.json("POST", "/trajectories", body)
        reply = resp.json()
    assert resp.status_code == 422, reply
    assert reply["fields"][0].startswith("episodes.0.trajectories.0")
    assert f"{field}" in reply["detail"] and reason in reply["detail"]
    # nothing was stored: the lease can still deliver an honest group
    with SyncDataflowClient(svc.url, NODE_TOKEN, retries=0) as c:
        ok = c.push(
            node_id=reg["node_id"],
            lease_id=lease["id"],
            episodes=group(lease["task"]["id"], [1.0] * 4),
        )
    assert ok.accepted, ok
    assert sum(status(svc)["refused"].values()) >= 1


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_turn_rewards_must_match_the_generated_turns(svc, node, encoding):
    """One reward per run of generated tokens, or the push is refused naming the field."""
    import msgpack
    import numpy as np

    reg = register(node)
    lease = lease_one(node, reg["node_id"])
    bad = traj([1, 2, 3, 4, 5, 6], [0, 1, 0, 1, 1, 0]) | {"turn_rewards": [1.0]}
    body = push_body(reg["node_id"], lease, bad)
    if encoding == "msgpack":
        tr = body["episodes"][0]["trajectories"][0]
        for name, dtype in (("tokens", "<i4"), ("loss_mask", "<i4"), ("versions", "<i4")):
            tr[name] = np.asarray(tr[name], dtype=dtype).tobytes()
        tr["logprobs"] = np.asarray(tr["logprobs"], dtype="<f4").tobytes()
        resp = node.msgpack("POST", "/trajectories", body)
        reply = msgpack.unpackb(resp.content)
    else:
        resp = node.json("POST", "/trajectories", body)
        reply = resp.json()
    assert resp.status_code == 422, reply
    assert reply["fields"][0].startswith("episodes.0.trajectories.0")
    assert "turn_rewards has 1 entries but the loss mask has 2 generated turn(s)" in reply["detail"]


# -- probe 2: unstorable integers and strings in a registration ---------------------------------
@pytest.mark.parametrize(
    "text",
    [
        '{"policies": {"policy": 18446744073709551616}}',
        '{"policies": {"policy": -9223372036854775809}}',
        '{"name": "\\ud800", "policies": {"policy": 0}}',
        '{"policies": {"\\udfff": 0}}',
    ],
)
def test_probe2_registration_values_are_bounded_and_status_keeps_working(svc, node, text):
    resp = node.json("POST", "/nodes/register", text=text)
    assert resp.status_code == 422, resp.text
    (field,) = resp.json()["fields"]
    assert field.split(".")[0] in ("policies", "name") and field in detail(resp)
    with SyncDataflowClient(svc.url, TRAINER_TOKEN, retries=0) as c:  # msgpack /status
        assert c.status().policies["policy"].latest_version == 0


# -- probe 3: a node's key cannot hit the trainer's evaluation ---------------------------------
def test_probe3_node_keys_never_meet_evaluation_keys(svc, node):
    reg = register(node)
    lease = lease_one(node, reg["node_id"])
    guessed = "eval-policy-v350"
    resp = node.json(
        "POST",
        "/trajectories",
        push_body(reg["node_id"], lease, traj([1, 2, 3, 4]), idempotency_key=guessed),
    )
    assert resp.status_code == 200, resp.text
    with SyncDataflowClient(svc.url, TRAINER_TOKEN, retries=0) as c:
        ev = c.request_evaluation(
            policy="policy", version=0, step=350, idempotency_key=guessed, num_tasks=2
        )
        assert ev.num_tasks == 2 and not ev.done
    key = evaluation_key(TRAINER_TOKEN, "policy", 350)
    assert key != guessed and key == evaluation_key(TRAINER_TOKEN, "policy", 350)
    assert key != evaluation_key("another-token", "policy", 350)


# -- probe 4: deregistering another node; node ids leaking -----------------------------------
def test_probe4_a_node_token_deregisters_only_its_own_node(svc, node):
    victim = register(node, "victim")
    attacker = register(node, "attacker")
    assert victim["node_key"] and victim["node_key"] != attacker["node_key"]
    for headers in ({}, {"x-node-key": attacker["node_key"]}, {"x-node-key": "guess"}):
        resp = node.http.delete(f"/nodes/{victim['node_id']}", headers=headers)
        assert resp.status_code == 403, resp.text
        assert "only its own node" in detail(resp)
    # a refused push for the victim's lease does not name the victim
    lease = lease_one(node, victim["node_id"])
    resp = node.json(
        "POST", "/trajectories", push_body(attacker["node_id"], lease, traj([1, 2, 3, 4]))
    )
    assert resp.status_code == 200 and not resp.json()["accepted"]
    assert victim["node_id"] not in resp.text and "another node" in resp.text
    # the victim itself may leave, with its own credential
    resp = node.http.delete(
        f"/nodes/{victim['node_id']}", headers={"x-node-key": victim["node_key"]}
    )
    assert resp.status_code == 200, resp.text


def test_probe4_the_client_sends_its_node_key(svc):
    with SyncDataflowClient(svc.url, NODE_TOKEN, retries=0) as c:
        reg = c.register(policies={"policy": 0})
        assert c.deregister(reg.node_id).ok


# -- probes 5 and 6: one key for a parked lease request and a push -----------------------------
def test_probe5_probe6_a_key_shared_by_a_lease_and_a_push_is_harmless(svc, node):
    reg = register(node)
    nid = reg["node_id"]
    first = node.json(
        "POST", "/leases", {"node_id": nid, "max_tasks": 4096, "versions": {"policy": 0}}
    )
    leases = first.json()["leases"]
    parked: dict = {}

    def park():
        parked["resp"] = node.json(
            "POST",
            "/leases",
            {
                "node_id": nid,
                "max_tasks": 1,
                "versions": {"policy": 0},
                "idempotency_key": "K" * 8,
                "wait_s": 1.0,
            },
        )

    t = threading.Thread(target=park)
    t.start()
    resp = node.json(
        "POST",
        "/trajectories",
        push_body(nid, leases[0], traj([1, 2, 3, 4]), idempotency_key="K" * 8),
    )
    t.join(30)
    assert resp.status_code == 200, resp.text
    assert parked["resp"].status_code == 200, parked["resp"].text
    # probe 6: the same key again for a lease request: answered as a lease, not a 500
    again = node.json(
        "POST",
        "/leases",
        {"node_id": nid, "max_tasks": 1, "versions": {"policy": 0}, "idempotency_key": "K" * 8},
    )
    assert again.status_code == 200, again.text


# -- probe 7: non-finite rewards and log-probs -----------------------------------------------
@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
def test_probe7_nonfinite_rewards_and_logprobs_are_refused(svc, node, bad):
    reg = register(node)
    lease = lease_one(node, reg["node_id"])
    text = json.dumps(push_body(reg["node_id"], lease, traj([1, 2, 3, 4]), reward="R"))
    resp = node.json("POST", "/trajectories", text=text.replace('"R"', bad))
    assert resp.status_code == 422, resp.text
    assert "episodes.0.rewards.agent" in resp.json()["fields"] and "finite" in detail(resp)
    lp = json.dumps(
        push_body(reg["node_id"], lease, traj([1, 2, 3, 4], logprobs=[0.0, 0.0, "L", 0.0]))
    )
    resp = node.json("POST", "/trajectories", text=lp.replace('"L"', bad))
    assert resp.status_code == 422 and "logprobs must be finite" in detail(resp), resp.text


# -- probe 8: huge heartbeats, metric floods, registration floods ------------------------------
def test_probe8_heartbeats_are_bounded_in_size_keys_and_rate(svc, node):
    nid = register(node)["node_id"]
    hb = f"/nodes/{nid}/heartbeat"
    resp = node.json("POST", hb, {"in_flight": [f"lease-{i}" for i in range(MAX_IN_FLIGHT + 1)]})
    assert resp.status_code == 422 and "in_flight" in resp.json()["fields"][0], resp.text
    assert str(MAX_IN_FLIGHT) in detail(resp)
    resp = node.json("POST", hb, {"metrics": {f"k{i}": 1.0 for i in range(MAX_METRIC_KEYS + 1)}})
    assert resp.status_code == 422 and str(MAX_METRIC_KEYS) in detail(resp), resp.text
    # unknown keys within the bound: dropped and counted, never stored
    resp = node.json(
        "POST", hb, {"metrics": {"episodes": 3.0, **{f"junk{i}": 1.0 for i in range(200)}}}
    )
    assert resp.status_code == 200, resp.text
    shown = next(n for n in status(svc)["nodes"] if n["id"] == nid)["metrics"]
    assert shown == {"episodes": 3.0, "dropped_metric_keys": 200.0}
    # a heartbeat storm is cut off by the node's rate limit, naming it
    codes = [node.json("POST", hb, {}).status_code for _ in range(40)]
    assert 429 in codes and codes[0] == 200
    limited = node.json("POST", hb, {})
    assert limited.status_code == 429 and "exceed the limit" in detail(limited)


def test_probe8_registrations_are_bounded(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"max_nodes": 5})
    with ThreadedService(recipe, tmp_path / "df.db") as s:
        node = Raw(s.url)
        try:
            for i in range(5):
                register(node, f"n{i}")
            resp = node.json("POST", "/nodes/register", {"policies": {"policy": 0}})
        finally:
            node.close()
    assert resp.status_code == 429 and "limit is 5 (MAX_NODES" in detail(resp), resp.text


# -- probe 9: surrogates in ids, deep nesting, integers past int64 -----------------------------
def test_probe9_ids_nesting_and_big_integers_are_refused(svc, node):
    reg = register(node)
    nid = reg["node_id"]
    resp = node.json(
        "POST", "/leases", text='{"node_id": "\\ud800", "max_tasks": 1, "versions": {}}'
    )
    assert resp.status_code == 422 and resp.json()["fields"] == ["node_id"], resp.text
    deep: dict = {}
    cur = deep
    for _ in range(MAX_NESTING + 5):
        cur["x"] = {}
        cur = cur["x"]
    resp = node.json("POST", "/nodes/register", {"policies": {"policy": 0}, "meta": deep})
    assert resp.status_code == 422 and "MAX_NESTING" in detail(resp), resp.text
    resp = node.json(
        "POST", "/nodes/register", text='{"policies": {}, "meta": ' + "[" * 1000 + "]" * 1000 + "}"
    )
    assert resp.status_code == 422, resp.text
    resp = node.json(
        "POST", "/leases", {"node_id": nid, "max_tasks": 1, "versions": {"policy": 2**63}}
    )
    assert resp.status_code == 422 and "versions.policy" in resp.json()["fields"][0], resp.text
    trainer = Raw(svc.url, TRAINER_TOKEN)
    try:
        resp = trainer.json(
            "POST", "/batches", {"policy": "policy", "num_groups": 1, "trainer_version": 2**63}
        )
        assert resp.status_code == 422 and "trainer_version" in resp.json()["fields"], resp.text
        resp = trainer.json(
            "POST", "/evaluations", {"policy": "policy", "version": 0, "step": 2**64}
        )
        assert resp.status_code == 422 and "step" in resp.json()["fields"], resp.text
    finally:
        trainer.close()


# -- probe 10: one push key, two bodies --------------------------------------------------------
def test_probe10_same_key_different_body_is_409_naming_the_key(svc, node):
    reg = register(node)
    lease = lease_one(node, reg["node_id"])
    body = push_body(reg["node_id"], lease, traj([1, 2, 3, 4]), idempotency_key="push-key-1")
    assert node.json("POST", "/trajectories", body).status_code == 200
    again = node.json("POST", "/trajectories", body)
    assert again.status_code == 200 and again.json()["duplicate"]
    other = push_body(reg["node_id"], lease, traj([1, 2, 3, 5]), idempotency_key="push-key-1")
    resp = node.json("POST", "/trajectories", other)
    assert resp.status_code == 409 and "'push-key-1'" in detail(resp), resp.text
    # another node's identical key is its own key
    mine = register(node, "other")
    lease2 = lease_one(node, mine["node_id"])
    resp = node.json(
        "POST",
        "/trajectories",
        push_body(mine["node_id"], lease2, traj([1, 2, 3, 4]), idempotency_key="push-key-1"),
    )
    assert resp.status_code == 200 and not resp.json()["duplicate"], resp.text


def test_refusals_are_counted_by_reason(svc, node):
    reg = register(node)
    lease = lease_one(node, reg["node_id"])
    for _ in range(3):
        node.json(
            "POST", "/trajectories", push_body(reg["node_id"], lease, traj([1, 2, 999_999, 3]))
        )
    refused = status(svc)["refused"]
    assert refused["422 POST /trajectories: episodes.*.trajectories.*.tokens"] == 3
    assert math.isfinite(sum(refused.values()))
    assert TOKEN not in json.dumps(refused)
