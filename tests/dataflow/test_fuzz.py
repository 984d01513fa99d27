"""A bounded schemathesis pass over the service's own OpenAPI document: no input gives a 5xx."""

from __future__ import annotations

import httpx
import pytest
from dataflow_helpers import TOKEN, ThreadedService, make_recipe

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis not installed (pip install schemathesis)"
)
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

MAX_EXAMPLES = 15


@pytest.mark.slow  # schemathesis over every route
def test_openapi_fuzz_produces_no_server_errors(tmp_path):
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        auth = {"authorization": f"Bearer {TOKEN}"}
        raw = httpx.get(f"{svc.url}/openapi.json", headers=auth).json()
        schema = schemathesis.openapi.from_dict(raw)
        failures: list[str] = []
        checked = 0
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation, mode in [(op, m) for op in operations for m in schemathesis.GenerationMode]:

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                _clamp_long_polls(case)
                response = case.call(base_url=svc.url, headers=auth, timeout=30)
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path}: "
                        f"{response.status_code} {response.text[:300]}"
                    )

            try:
                run()
            except Unsatisfiable:  # nothing to negate (e.g. GET /healthz has no inputs)
                continue
            checked += 1
        assert checked >= 20
        assert not failures, "\n".join(failures[:10])


def _clamp_long_polls(case) -> None:
    """Long polls (``wait_s`` of batch and lease requests, ``/status?wait_done_s``) legitimately
    hold a valid request up to 600 s; clamp valid values to 1 s so the pass stays bounded (the
    waiting itself is tested in test_lease_wait.py). Invalid values are left for the fuzzer."""
    for holder, key in ((case.query, "wait_done_s"), (case.body, "wait_s")):
        if isinstance(holder, dict) and key in holder:
            try:
                if float(holder[key]) > 1.0:
                    holder[key] = 1.0
            except (TypeError, ValueError):
                pass


# -- semantic fuzzing: valid-shaped bodies carrying hostile values ------------------------------
def _role_clients(url: str, headers: dict[str, str]) -> tuple[httpx.Client, httpx.Client]:
    """A node's and a trainer's raw client (each with its role's token) sending ``headers``."""
    from astraflow.protocol.auth import NODE, TRAINER, derive_token

    return tuple(
        httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {derive_token(TOKEN, r)}", **headers}
        )
        for r in (NODE, TRAINER)
    )


def _assert_still_serving(url: str, failures: list[str]) -> None:
    """No request was answered 5xx, and ``/status`` (msgpack) still answers."""
    status = httpx.get(
        f"{url}/status",
        headers={"authorization": f"Bearer {TOKEN}", "accept": "application/msgpack"},
    )
    assert status.status_code == 200
    assert not failures, "\n".join(failures[:10])


def _hostile_strategies():
    """Values of the right JSON type that no honest client sends: past int64, negative, out of
    any vocabulary, non-finite, lone surrogates, deep nesting."""
    from hypothesis import strategies as st

    ints = (
        st.sampled_from([2**63, 2**64, -(2**63) - 1, -1, -(2**31), 2**31 - 1, 10**6, 10**18, 0])
        | st.integers()
    )
    floats = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e309"]).map(lambda s: f"@{s}@")
    texts = st.sampled_from(["\ud800", "a\udfffb", "x" * 5000, "", "\x00"]) | st.text(max_size=8)
    numbers = ints | floats | st.floats(allow_nan=False)
    deep = st.integers(1, 400).map(lambda n: "@[" + "[" * n + "]" * n + "]@")
    return ints, numbers, texts, deep


def _render(body) -> bytes:
    """JSON text with the markers ``"@X@"`` replaced by raw JSON (NaN, deep arrays)."""
    import json
    import re

    text = json.dumps(body, ensure_ascii=True)
    return re.sub(r'"@(.*?)@"', lambda m: m.group(1), text).encode()


@pytest.mark.slow  # seven routes x 40 examples: ~5-10 s
def test_semantic_fuzz_hostile_values_produce_no_server_errors(tmp_path):
    from hypothesis import strategies as st

    ints, numbers, texts, deep = _hostile_strategies()
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        node, trainer = _role_clients(svc.url, {"content-type": "application/json"})
        reg = node.post("/nodes/register", content=b'{"policies": {"policy": 0}}').json()
        nid = reg["node_id"]
        lease = node.post(
            "/leases",
            content=_render({"node_id": nid, "max_tasks": 64, "versions": {"policy": 0}}),
        ).json()["leases"]
        failures: list[str] = []

        def call(client, path, body):
            resp = client.post(path, content=_render(body), timeout=30)
            if resp.status_code >= 500:
                failures.append(f"{path}: {resp.status_code} {body!r:.300}")

        trajectory = st.fixed_dictionaries(
            {
                "role": st.just("agent") | texts,
                "tokens": st.lists(ints, min_size=0, max_size=6),
                "loss_mask": st.lists(ints, min_size=0, max_size=6),
                "logprobs": st.lists(numbers, min_size=0, max_size=6),
                "versions": st.lists(ints, min_size=0, max_size=6),
            }
        )
        episode = st.fixed_dictionaries(
            {
                "task_id": st.sampled_from([lease[0]["task"]["id"]]) | texts,
                "trajectories": st.lists(trajectory, max_size=2),
                "rewards": st.dictionaries(st.just("agent") | texts, numbers, max_size=2),
                "info": st.dictionaries(texts, numbers | texts | deep, max_size=2),
            }
        )

        @settings(
            max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            eps=st.lists(episode, min_size=1, max_size=2),
            key=texts,
            lease_i=st.integers(0, len(lease) - 1),
            version=ints,
            name=texts,
            meta=st.dictionaries(texts, numbers | texts | deep, max_size=2),
            metric=numbers,
        )
        def run(eps, key, lease_i, version, name, meta, metric):
            call(
                node,
                "/trajectories",
                {
                    "node_id": nid,
                    "lease_id": lease[lease_i]["id"],
                    "episodes": eps,
                    "idempotency_key": key,
                },
            )
            call(node, "/nodes/register", {"name": name, "policies": {name: version}, "meta": meta})
            call(
                node,
                f"/nodes/{nid}/heartbeat",
                {"versions": {"policy": version}, "in_flight": [name], "metrics": {name: metric}},
            )
            call(
                node,
                "/leases",
                {
                    "node_id": name,
                    "max_tasks": 1,
                    "versions": {"policy": version},
                    "idempotency_key": key,
                },
            )
            call(trainer, "/batches", {"policy": name, "num_groups": 1, "trainer_version": version})
            call(
                trainer,
                "/evaluations",
                {"policy": "policy", "version": version, "step": version, "idempotency_key": key},
            )
            call(
                trainer,
                "/versions",
                {
                    "policy": "policy",
                    "version": version,
                    "location": name,
                    "digest": name,
                    "vocab_size": version,
                },
            )

        run()
        node.close()
        trainer.close()
        _assert_still_serving(svc.url, failures)


def test_semantic_fuzz_of_packed_msgpack_pushes_produces_no_server_errors(tmp_path):
    """The msgpack wire format (what every node sends) has its own decoder for packed arrays
    (``storage/packed.py``, numpy instead of pydantic): hostile packed arrays (odd byte counts,
    NaN and infinite log-probs, ids past the announced vocabulary, negative ids, versions past
    int32, arrays of unequal length) and hostile scalars beside them are 4xx, never 5xx."""
    import msgpack
    import numpy as np
    from hypothesis import strategies as st

    vocab = 4096
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        mp = {"content-type": "application/msgpack", "accept": "application/msgpack"}
        node, trainer = _role_clients(svc.url, mp)
        pack = msgpack.packb
        announced = trainer.post(
            "/versions",
            content=pack({"policy": "policy", "version": 0, "location": "mem://0",
                          "digest": "d0", "vocab_size": vocab, "context_length": 64}),
        )  # fmt: skip
        assert announced.status_code == 200, announced.text
        nid = msgpack.unpackb(
            node.post("/nodes/register", content=pack({"policies": {"policy": 0}})).content
        )["node_id"]
        leases = msgpack.unpackb(
            node.post(
                "/leases",
                content=pack({"node_id": nid, "max_tasks": 64, "versions": {"policy": 0}}),
            ).content
        )["leases"]
        failures: list[str] = []
        refused: set[str] = set()  # the fields the 422s named

        ints = st.sampled_from([0, 1, 5, vocab - 1, vocab, 10**6, -1, -(2**31), 2**31 - 1])
        floats = st.sampled_from([0.0, -1.5, float("nan"), float("inf"), -float("inf"), 1e39])

        def packed(dtype: str, values):
            def pack_as(xs):
                with np.errstate(over="ignore"):  # 1e39 as float32 is inf: on purpose
                    return np.asarray(xs, dtype=dtype).tobytes()

            return values.map(pack_as)

        raw_bytes = st.binary(max_size=40)  # any byte count, aligned or not
        arrays = st.fixed_dictionaries(
            {
                "role": st.sampled_from(["agent", "\udcff", "x" * 300]),
                "tokens": packed("<i8", st.lists(ints, max_size=8)).map(lambda b: b[::2])
                | packed("<i4", st.lists(ints.filter(lambda i: -(2**31) <= i < 2**31), max_size=8))
                | raw_bytes,
                "loss_mask": packed("<i4", st.lists(st.sampled_from([0, 1, 2, -1]), max_size=8))
                | raw_bytes,
                "logprobs": packed("<f4", st.lists(floats, max_size=8)) | raw_bytes,
                "versions": packed(
                    "<i4", st.lists(st.sampled_from([-2, -1, 0, 2**31 - 1]), max_size=8)
                )
                | raw_bytes,
            }
        )
        scalar = st.sampled_from(
            [2**64 - 1, -(2**63), 2**63, 1.5, float("nan"), "", "\udcff", b"x", None]
        )

        @settings(
            max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def traj(tokens, logprobs):
            return {
                "role": "agent",
                "tokens": np.asarray(tokens, dtype="<i4").tobytes(),
                "loss_mask": np.asarray([0] + [1] * (len(tokens) - 1), dtype="<i4").tobytes(),
                "logprobs": np.asarray(logprobs, dtype="<f4").tobytes(),
                "versions": np.zeros(len(tokens), dtype="<i4").tobytes(),
            }

        # The random draws reach a deep check only when every field before it passes, which 60
        # draws did not always do; these two reach the token and log-prob checks every run.
        @example(trajs=[traj([1, vocab], [0.0, -0.5])], lease_i=0, reward=1.0, key=None, extra={})
        @example(
            trajs=[traj([1, 2], [0.0, float("nan")])], lease_i=0, reward=1.0, key=None, extra={}
        )
        @given(
            trajs=st.lists(arrays, min_size=1, max_size=2),
            lease_i=st.integers(0, len(leases) - 1),
            reward=floats | scalar,
            key=st.sampled_from(["k", "k" * 200, "\udcff"]) | st.none(),
            extra=st.dictionaries(st.sampled_from(["info", "meta", "x"]), scalar, max_size=2),
        )
        def run(trajs, lease_i, reward, key, extra):
            lease = leases[lease_i]
            episode = {"task_id": lease["task"]["id"], "trajectories": trajs,
                       "rewards": {"agent": reward}, **extra}  # fmt: skip
            body = {"node_id": nid, "lease_id": lease["id"], "episodes": [episode]}
            if key is not None:
                body["idempotency_key"] = key
            try:
                content = msgpack.packb(body, use_bin_type=True, unicode_errors="surrogatepass")
            except (OverflowError, TypeError, ValueError):  # not encodable: nothing to send
                return
            resp = node.post("/trajectories", content=content, timeout=30)
            if resp.status_code >= 500:
                failures.append(f"{resp.status_code} {resp.content[:300]!r} for {body!r:.300}")
            elif resp.status_code == 422:
                refused.update(msgpack.unpackb(resp.content).get("fields") or [])

        run()
        node.close()
        trainer.close()
        _assert_still_serving(svc.url, failures)
        # the values reached the checks deep inside the push, not just the outer shape
        assert {f.rsplit(".", 1)[-1] for f in refused} >= {"tokens", "logprobs"}, refused
