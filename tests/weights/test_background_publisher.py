"""Publication off the trainer's critical path: a call returns after a host copy, at most one
publication runs, a failure surfaces in the trainer's thread, and a trainer killed mid-publication
leaves the previous version served and the store consistent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from astraflow.weights.publisher import BackgroundPublisher
from astraflow.weights.store import WeightStore


def _state(value: float = 0.0) -> dict[str, torch.Tensor]:
    return {"w": torch.full((64, 64), value), "b": torch.zeros(64)}


def test_a_call_returns_before_the_version_is_written_and_publishes_the_copy():
    release = threading.Event()
    published: dict[int, torch.Tensor] = {}

    def slow_publish(version, state):
        assert release.wait(30)
        published[version] = state["w"].clone()

    pub = BackgroundPublisher(slow_publish)
    try:
        live = _state(1.0)
        started = time.perf_counter()
        pub(1, live)
        assert time.perf_counter() - started < 5  # not the publication: it is still blocked
        assert published == {}
        live["w"].add_(5.0)  # the next optimizer step updates the weights in place
        release.set()
        pub.flush()
        assert torch.equal(published[1], torch.full((64, 64), 1.0))  # what the step produced
        assert pub.stats.publications == 1 and pub.stats.snapshot_bytes == (64 * 64 + 64) * 4
    finally:
        release.set()
        pub.close()


def test_the_next_version_waits_only_for_the_one_being_written():
    gate = threading.Event()
    order: list[int] = []

    def publish(version, state):
        if version == 1:
            assert gate.wait(30)
        order.append(version)

    pub = BackgroundPublisher(publish)
    try:
        pub(1, _state())
        threading.Timer(0.3, gate.set).start()
        pub(2, _state())  # waits for v1, then returns with v2 queued
        assert pub.stats.waits == 1 and pub.stats.waited_s >= 0.2
        pub.flush()
        assert order == [1, 2]
    finally:
        gate.set()
        pub.close()


def test_a_failed_publication_raises_in_the_trainers_thread():
    def broken(version, state):
        raise OSError(f"disk full writing v{version}")

    pub = BackgroundPublisher(broken)
    pub(1, _state())
    with pytest.raises(OSError, match="disk full writing v1"):
        pub(2, _state())
    pub.close()


def test_background_publications_land_in_the_store_with_deltas(tmp_path):
    store = WeightStore(tmp_path)
    pub = BackgroundPublisher(lambda v, s: store.publish("policy", v, s, copy=False))
    state = _state()
    for version in range(3):
        pub(version, state)
        state["w"][0, version] += 1.0
    pub.close()
    assert store.versions("policy") == [0, 1, 2]
    assert store.meta("policy", 2)["parent"] == 1 and store.delta_path("policy", 2) is not None
    assert torch.equal(store.load_state("policy", 1)["w"][0, :2], torch.tensor([1.0, 0.0]))


KILLED_MID_PUBLICATION = textwrap.dedent(
    """
    import os, sys, time, torch
    from astraflow.weights.publisher import BackgroundPublisher
    from astraflow.weights.store import WeightStore

    root, ready = sys.argv[1], sys.argv[2]
    store = WeightStore(root)
    store.publish("policy", 1, {"w": torch.ones(256, 256)})
    real_rename = os.rename

    def stall(src, dst):  # v2 is written under its temporary name: the kill comes now
        open(ready, "w").close()
        time.sleep(600)

    os.rename = stall
    pub = BackgroundPublisher(lambda v, s: store.publish("policy", v, s, copy=False))
    pub(2, {"w": torch.full((256, 256), 2.0)})
    pub.flush()
    """
)


def test_a_trainer_killed_mid_publication_leaves_the_previous_version(tmp_path):
    ready = tmp_path / "writing"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_PUBLICATION, str(tmp_path / "w"), str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the publication never started writing"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = WeightStore(tmp_path / "w")
    assert store.versions("policy") == [1]  # the half-written v2 is invisible
    assert store.latest("policy").version == 1
    assert torch.equal(store.load_state("policy", 1)["w"], torch.ones(256, 256))
    # a restarted trainer publishes v2 again into a consistent store
    store.publish("policy", 2, {"w": torch.full((256, 256), 2.0)})
    assert store.versions("policy") == [1, 2] and store.meta("policy", 2)["parent"] == 1


def test_buffers_are_refilled_only_once_the_callee_let_them_go():
    """The store keeps the newest snapshot as the base of the next delta until its next call:
    the publisher refills the snapshot two versions back (warm pages), never the one still held."""
    seen: list[int] = []
    held: dict[str, object] = {}

    def publish(version, state):
        if held:  # the base kept since the previous call is untouched
            assert torch.equal(held["state"]["w"], held["value"]), f"v{version}: base overwritten"
        held.update(state=state, value=state["w"].clone())
        seen.append(id(state))

    pub = BackgroundPublisher(publish)
    for version in range(5):
        pub(version, _state(float(version)))
    pub.close()
    assert seen[2] == seen[0] and seen[3] == seen[1] and seen[0] != seen[1]
    assert torch.equal(held["state"]["w"], torch.full((64, 64), 4.0))


def test_the_snapshot_written_to_disk_is_the_bytes_a_cache_rebuilds(tmp_path):
    """The store writes the snapshot straight to its file (no second copy of the model in
    memory); a region's cache rebuilds it with ``snapshot_bytes`` and checks the trainer's sha256,
    so both must give the same bytes, whatever the dtypes."""
    from astraflow.weights.digest import bytes_digest, state_digest
    from astraflow.weights.store import file_digest, snapshot_bytes, write_snapshot

    state = {
        "a.weight": torch.randn(33, 7).to(torch.bfloat16),
        "b.bias": torch.randn(5),
        "c.idx": torch.arange(9, dtype=torch.int64),
        "d.half": torch.randn(4, 4).half(),
    }
    digest = state_digest(state)
    size = write_snapshot(tmp_path / "s.safetensors", state, digest, 3)
    expected = snapshot_bytes(state, digest, 3)
    assert (tmp_path / "s.safetensors").read_bytes() == expected and size == len(expected)
    assert file_digest(tmp_path / "s.safetensors") == bytes_digest(expected)
