"""The stall check on status documents: when it names a cause, and when a slow run is left alone.

Real runs that stall are in ``test_stalled_runs.py``; these cases drive :class:`StallWatch` with
status documents built as the service builds them, so each rule is pinned down in milliseconds.
"""

from __future__ import annotations

from astraflow.launch.exits import exit_summary
from astraflow.launch.stall import StallWatch
from astraflow.protocol.status import DataflowStatus, ErrorSummary, PolicyStatus


def status(
    *,
    episodes: int,
    steps: int = 0,
    dropped: dict | None = None,
    errors: dict | None = None,
    buffer_groups: int = 0,
    filtered: dict | None = None,
) -> DataflowStatus:
    policy = PolicyStatus(
        trainable=True,
        latest_version=0,
        weight_location=None,
        steps=steps,
        max_steps=5,
        buffer_groups=buffer_groups,
        buffer_samples=buffer_groups * 4,
        unacked_batches=0,
        staleness={},
        dropped=dropped or {},
        filtered_rewards=filtered or {},
    )
    return DataflowStatus(
        run="r",
        mode="async",
        time=0.0,
        done=False,
        training_done=False,
        queue={},
        in_flight_leases=1,
        expired_leases=0,
        tasks_done=0,
        episodes=episodes,
        episodes_per_s=1.0,
        nodes=[],
        policies={"policy": policy},
        evaluations=[],
        dataflow_policies=[],
        errors={k: ErrorSummary(count=n, first=m) for k, (n, m) in (errors or {}).items()},
    )


def test_every_episode_failing_names_the_first_error():
    watch = StallWatch(10.0)
    assert watch.check(status(episodes=0), now=0.0) is None
    msg = "KeyError: unknown workflow 'single-agent'; did you mean single_agent?"
    failing = status(
        episodes=40, errors={"episode_error": (40, msg)}, dropped={"episode_error": 40}
    )
    assert watch.check(failing, now=5.0) is None  # not yet stall_s
    stall = watch.check(failing, now=10.5)
    assert stall is not None and stall.cause == "episodes_failing"
    assert "all 40 episodes since the last step failed" in stall.message
    assert "episode_error: 40 — " + msg in stall.message
    assert "run.stall_s = 10" in stall.message


def test_constant_reward_names_the_reward_and_the_fix():
    watch = StallWatch(5.0, first_transcript=lambda: "'1+1=' -> 'banana'")
    watch.check(status(episodes=0), now=0.0)
    st = status(episodes=2000, dropped={"zero_variance": 2000}, filtered={"0.0": 500})
    stall = watch.check(st, now=6.0)
    assert stall is not None and stall.cause == "constant_reward"
    assert "every group of the last 2,000 episodes had constant reward 0.0" in stall.message
    assert "check the env's answer format (first transcript: '1+1=' -> 'banana')" in (
        stall.message.replace("Check", "check")
    )
    assert "remove the zero_variance filter" in stall.message


def test_progress_or_a_buffered_group_resets_the_clock():
    watch = StallWatch(5.0)
    watch.check(status(episodes=0), now=0.0)
    dropped = {"zero_variance": 100}
    # a step landed: the window starts again
    assert watch.check(status(episodes=100, steps=1, dropped=dropped), now=6.0) is None
    assert watch.check(status(episodes=200, steps=1, dropped=dropped), now=10.0) is None
    # a group waits in the buffer (a slow trainer, not a stall)
    assert watch.check(status(episodes=300, steps=1, buffer_groups=1), now=20.0) is None
    # episodes that succeed without any drop: a group still forming, never a stall
    assert watch.check(status(episodes=400, steps=1), now=40.0) is None
    # nothing ran at all (slow start-up): not this check's case
    idle = StallWatch(5.0)
    idle.check(status(episodes=0), now=0.0)
    assert idle.check(status(episodes=0), now=60.0) is None
    # disabled
    off = StallWatch(0.0)
    off.check(status(episodes=0), now=0.0)
    assert off.check(status(episodes=10, errors={"episode_error": (10, "x")}), now=1e6) is None


def test_mixed_drops_say_every_group_was_dropped():
    watch = StallWatch(1.0)
    watch.check(status(episodes=0), now=0.0)
    st = status(episodes=50, dropped={"zero_variance": 30, "max_length": 20}, filtered={"0.0": 3})
    stall = watch.check(st, now=2.0)
    assert stall is not None and stall.cause == "all_dropped"
    assert "max_length 20" in stall.message and "zero_variance 30" in stall.message


def test_exit_summary_is_a_sentence():
    assert exit_summary({"node-0": -15, "trainer-policy": 0, "dataflow": 0}) == (
        "all 3 services stopped cleanly"
    )
    text = exit_summary({"node-0": 1, "dataflow": -9}, killed={"dataflow"})
    assert "node-0 exited with status 1 (logs/node-0.log)" in text
    assert "dataflow did not stop within its timeout and was killed (SIGKILL)" in text
    assert "ended by SIGSEGV" in exit_summary({"trainer-policy": -11})
