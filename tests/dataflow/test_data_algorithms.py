"""Selection logic of the adaptive data algorithms (curriculum, predictive skipping, replay,
deadlines) on crafted streams, and their service side on a real store behind real HTTP: state that
survives a restart, counted skips and replays, replayed samples as new rows."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

from astraflow.dataflow.policies import GroupView, Pipeline, PolicyConfigError, TaskView
from astraflow.dataflow.policies.curriculum import PassRateCurriculum
from astraflow.dataflow.policies.group_replay import GroupReplay, advantage_score
from astraflow.dataflow.policies.selection import EarliestDeadlineFirst, draw_set
from astraflow.dataflow.policies.skipping import PredictiveSkip, prompt_key
from astraflow.dataflow.storage import history
from astraflow.protocol import WeightVersion
from astraflow.protocol.client import SyncDataflowClient
from astraflow.recipe import DataflowPolicyConfig


def _g(task_id: str, rewards: list[float], task_set: str = "s", min_version: int = 0, seq: int = 0):
    return GroupView(f"{task_id}/p", task_id, "p", task_set, rewards, seq, min_version)


# ------------------------------------------------------------------ curriculum


def test_curriculum_favours_the_learnable_band():
    cur = PassRateCurriculum(band=[0.2, 0.8], floor=0.1, decay=1.0)
    base = {"easy": 1.0, "mid": 1.0, "hard": 2.0, "new": 1.0}
    for i in range(5):
        cur.observe(_g(f"e{i}", [1, 1, 1, 1], "easy"))
        cur.observe(_g(f"m{i}", [1, 0, 1, 0], "mid"))
        cur.observe(_g(f"h{i}", [0, 0, 0, 0], "hard"))
    assert cur.pass_rate("easy") == pytest.approx(21 / 22)
    assert cur.pass_rate("mid") == pytest.approx(11 / 22)
    assert cur.pass_rate("hard") == pytest.approx(1 / 22)
    assert cur.pass_rate("new") == 0.5  # unseen: the prior, inside the band
    assert cur.weights(base) == {"easy": 0.1, "mid": 1.0, "hard": pytest.approx(0.2), "new": 1.0}


def test_curriculum_forgets_with_decay_so_a_set_can_come_back():
    cur = PassRateCurriculum(band=[0.2, 0.8], decay=0.5)
    for i in range(6):
        cur.observe(_g(f"h{i}", [0, 0, 0, 0], "hard"))
    assert cur.factor("hard") == 0.1
    # the policy starts solving half of it: a few groups bring it back into the band
    cur.observe(_g("x", [1, 1, 0, 0], "hard"))
    cur.observe(_g("y", [1, 1, 1, 0], "hard"))
    assert 0.2 <= cur.pass_rate("hard") <= 0.8 and cur.factor("hard") == 1.0


def test_curriculum_state_round_trips():
    cur = PassRateCurriculum()
    cur.observe(_g("a", [1, 0], "s1"))
    cur.observe(_g("b", [1, 1], "s2"))
    changes = json.loads(json.dumps(cur.state_changes()))
    assert set(changes) == {"s1", "s2"} and cur.state_changes() == {}
    again = PassRateCurriculum()
    again.load_state(changes)
    assert again.pass_rate("s1") == cur.pass_rate("s1") and again.counts == cur.counts


def test_curriculum_rejects_bad_kwargs():
    with pytest.raises(PolicyConfigError, match="band"):
        PassRateCurriculum(band=[0.9, 0.1])
    with pytest.raises(PolicyConfigError, match="floor"):
        PassRateCurriculum(floor=0)


def test_weighted_draw_follows_the_weights_and_is_seeded():
    weights = {"a": 3.0, "b": 1.0, "c": 0.0}
    draws = [draw_set(weights, ["a", "b", "c"], f"0:draw:{i}") for i in range(4000)]
    counts = Counter(draws)
    assert counts["c"] == 0 and 0.72 < counts["a"] / 4000 < 0.78
    assert draws == [draw_set(weights, ["a", "b", "c"], f"0:draw:{i}") for i in range(4000)]
    assert draw_set(weights, ["b"], "x") == "b"  # only what is available
    with pytest.raises(LookupError):
        draw_set(weights, ["c"], "x")


# ------------------------------------------------------------------ predictive skipping


def _task(key: str, epoch: int = 0) -> TaskView:
    return TaskView(f"arith:train:e{epoch}:{key}", "arith", 0)


def test_prompt_key_is_the_same_across_epochs():
    assert prompt_key("arith:train:e0:q7") == prompt_key("arith:train:e12:q7") == "arith:train:q7"


def test_predictive_skip_only_after_zero_variance_and_with_decaying_probability():
    skip = PredictiveSkip(p_max=0.9, decay=0.5, seed=3)
    n = 4000
    keys = [f"q{i}" for i in range(n)]
    # never seen, or last group informative: always runs
    assert all(skip.skip_reason(_task(k), 0.0) is None for k in keys)
    for i, k in enumerate(keys):
        rewards = [1, 1, 1, 1] if i % 2 else [0, 0, 0, 0]  # all correct / all wrong
        skip.observe(_g(f"arith:train:e0:{k}", rewards))
    skip.observe(_g("arith:train:e0:mixed", [1, 0, 1, 1]))
    assert skip.skip_reason(_task("mixed", 1), 0.0) is None
    # first chance: skipped with p_max; those skipped once are skipped again with p_max * decay
    first = {k for k in keys if skip.skip_reason(_task(k, 1), 0.0) == "predicted_zero_variance"}
    assert 0.87 < len(first) / n < 0.93
    second = {k for k in first if skip.skip_reason(_task(k, 2), 0.0)}
    assert 0.41 < len(second) / len(first) < 0.49
    third = {k for k in second if skip.skip_reason(_task(k, 3), 0.0)}
    assert 0.18 < len(third) / len(second) < 0.27
    assert skip.skip_probability(f"arith:train:{keys[0]}") in (0.9, 0.45, 0.225, 0.1125)


def test_predictive_skip_retry_resets_on_an_informative_group():
    skip = PredictiveSkip(p_max=1.0, decay=0.5, min_streak=2, seed=0)
    skip.observe(_g("arith:train:e0:q", [1, 1]))
    assert skip.skip_probability("arith:train:q") == 0.0  # streak 1 < min_streak
    skip.observe(_g("arith:train:e1:q", [1, 1]))
    assert skip.skip_reason(_task("q", 2), 0.0) == "predicted_zero_variance"  # p = 1
    assert skip.skip_probability("arith:train:q") == 0.5
    skip.observe(_g("arith:train:e2:q", [1, 0]))  # it ran and taught something
    assert skip.skip_probability("arith:train:q") == 0.0


def test_predictive_skip_is_deterministic_and_restores_its_state():
    def run(policy):
        for i in range(50):
            policy.observe(_g(f"arith:train:e0:q{i}", [1, 1, 1]))
        return [policy.skip_reason(_task(f"q{i}", 1), 0.0) for i in range(50)]

    a, b = PredictiveSkip(seed=7), PredictiveSkip(seed=7)
    assert run(a) == run(b)
    restored = PredictiveSkip(seed=7)
    restored.load_state(json.loads(json.dumps(a.state_changes())))
    assert restored.prompts == a.prompts
    with pytest.raises(PolicyConfigError, match="retried"):
        PredictiveSkip(decay=1.0)


# ------------------------------------------------------------------ replay


def test_replay_scores_admits_and_chooses_best_fresh_first():
    assert advantage_score([1, 1, 1]) == 0.0
    assert advantage_score([1, 0, 1, 0]) == 0.5
    assert advantage_score([1, 0, 0, 0]) == pytest.approx(0.375)
    replay = GroupReplay(ratio=0.25, max_staleness=2, min_score=0.3, max_replays=1)
    assert [replay.slots(n) for n in (1, 2, 4, 8, 16)] == [0, 0, 1, 2, 4]
    assert replay.admits(_g("a", [1, 0, 1, 0]), 0)
    assert not replay.admits(_g("a", [1, 0, 1, 0]), 1)  # max_replays reached
    assert not replay.admits(_g("b", [1, 1, 1, 1]), 0)  # no signal
    assert not replay.admits(_g("c", [1, 0, 0, 0, 0, 0, 0, 0]), 0)  # 0.219 < min_score
    pool = [
        _g("old", [1, 0, 1, 0], min_version=2, seq=1),
        _g("weak", [1, 0, 0, 0], min_version=9, seq=2),
        _g("best", [1, 0, 1, 0], min_version=9, seq=3),
        _g("best_older", [1, 0, 1, 0], min_version=8, seq=4),
    ]
    chosen, expired = replay.choose(pool, trainer_version=10, n=2)
    assert [g.task_id for g in chosen] == ["best", "best_older"]
    assert [g.task_id for g in expired] == ["old"]
    with pytest.raises(PolicyConfigError, match="ratio"):
        GroupReplay(ratio=1.0)


# ------------------------------------------------------------------ deadlines


def test_edf_orders_by_deadline_and_drops_late_tasks_only_when_asked():
    tasks = [
        TaskView("fifo-first", "s", 1, deadline=None),
        TaskView("late", "s", 2, deadline=5.0),
        TaskView("soon", "s", 3, deadline=20.0),
        TaskView("later", "s", 4, deadline=30.0),
    ]
    edf = EarliestDeadlineFirst(drop_expired=True)
    assert [t.id for t in sorted(tasks, key=edf.sort_key)] == [
        "late",
        "soon",
        "later",
        "fifo-first",
    ]
    assert [edf.skip_reason(t, now=10.0) for t in tasks] == [None, "deadline_expired", None, None]
    assert EarliestDeadlineFirst().skip_reason(tasks[1], now=10.0) is None
    with pytest.raises(PolicyConfigError, match="selection"):
        EarliestDeadlineFirst(stage="batching", drop_expired=True)


def test_pipeline_files_each_policy_under_its_hooks():
    pipe = Pipeline.from_config(
        [
            DataflowPolicyConfig(name="edf", kwargs={"drop_expired": True}),
            DataflowPolicyConfig(name="curriculum"),
            DataflowPolicyConfig(name="predictive_skip"),
            DataflowPolicyConfig(name="replay", kwargs={"ratio": 0.5}),
        ]
    )
    assert isinstance(pipe.task_order, EarliestDeadlineFirst)
    assert [type(g) for g in pipe.gates] == [EarliestDeadlineFirst, PredictiveSkip]
    assert [type(a) for a in pipe.adaptive] == [PassRateCurriculum]
    assert [type(o) for o in pipe.observers] == [PassRateCurriculum, PredictiveSkip]
    assert pipe.replay is not None and pipe.replay.ratio == 0.5
    assert pipe.observer_key(pipe.observers[1]) == "2:predictive_skip"


def test_a_third_party_gate_and_observer_plugs_in_like_the_builtins():
    from astraflow.dataflow.policies import GroupObserver, PolicyRegistry, TaskGate

    class SkipOddTasks(TaskGate, GroupObserver):
        name = "skip_odd"

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seen: list[str] = []

        def skip_reason(self, task, now):
            return "odd" if int(task.id[-1]) % 2 else None

        def observe(self, group):
            self.seen.append(group.task_id)

        def state_changes(self):
            return {}

        def load_state(self, entries):
            pass

    registry = PolicyRegistry()
    registry.add(SkipOddTasks)
    pipe = Pipeline.from_config([DataflowPolicyConfig(name="skip_odd")], registry)
    assert [t.name for t in pipe.gates] == ["skip_odd"] and pipe.observers == pipe.gates
    assert [pipe.skip_reason(TaskView(f"t{i}", "s", i), 0.0) for i in range(4)] == [
        None, "odd", None, "odd"
    ]  # fmt: skip
    pipe.observe(_g("t2", [1, 0]))
    assert pipe.gates[0].seen == ["t2"]


# ------------------------------------------------------------------ service side (real HTTP, SQLite)

TWO_LEVELS = [{"name": "arith", "kwargs": {"level": 1}}, {"name": "arith", "kwargs": {"level": 2}}]


def _lease_push(c, node: str, n: int, rewards_for) -> list[str]:
    ids = []
    for lease in c.lease(node_id=node, max_tasks=n, versions={"policy": 0}).leases:
        c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, rewards_for(lease)))
        ids.append(lease.task.id)
    return ids


def test_curriculum_state_survives_a_restart_and_steers_the_feeder(tmp_path):
    recipe = make_recipe(
        tmp_path,
        tasks={"group_size": 4, "sets": TWO_LEVELS},
        dataflow={
            "buffer_steps": 0,
            "policies": [{"name": "curriculum", "kwargs": {"decay": 1.0}}],
        },
    )
    db = tmp_path / "df.db"
    with ThreadedService(recipe, db) as svc, SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        # level 1 is mastered, level 2 is half solved
        solved = lambda lease: [1, 1, 1, 1] if lease.task.task_set == "arith[0]" else [1, 0, 1, 0]  # noqa: E731
        for _ in range(6):
            _lease_push(c, node, 4, solved)
        rates = {
            k: svc.service.ctx.pipeline.adaptive[0].pass_rate(k) for k in ("arith[0]", "arith[1]")
        }
        assert rates["arith[0]"] > 0.85 and 0.4 < rates["arith[1]"] < 0.6
    with ThreadedService(recipe, db) as svc, SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
        cur = svc.service.ctx.pipeline.adaptive[0]
        assert {k: cur.pass_rate(k) for k in rates} == rates  # restored, not relearned
        node = c.register(policies={"policy": 0}).node_id
        leased = []
        for _ in range(10):
            leased += [
                lease.task.task_set
                for lease in c.lease(node_id=node, max_tasks=4, versions={"policy": 0}).leases
            ]
        counts = Counter(leased)
        # weights 0.1 : 1 -> level 2 drawn ~10x as often (window tasks from before included)
        assert counts["arith[1]"] > 4 * counts["arith[0]"]


def test_predictive_skip_skips_counts_and_persists(tmp_path):
    recipe = make_recipe(
        tmp_path,
        tasks={"group_size": 4, "sets": [{"name": "arith", "limit": 4}]},
        dataflow={
            "buffer_steps": 0,
            "policies": [{"name": "predictive_skip", "kwargs": {"p_max": 1.0, "decay": 0.5}}],
        },
    )
    db = tmp_path / "df.db"
    with ThreadedService(recipe, db) as svc, SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        # epoch 0: prompts 0 and 1 all correct, 2 and 3 informative
        first = _lease_push(
            c,
            node,
            4,
            lambda lease: [1, 1, 1, 1] if lease.task.id.endswith(("-0", "-1")) else [1, 0, 0, 1],
        )
        assert len(first) == 4
        # epoch 1: the two all-correct prompts are skipped (p = 1), the others run
        second = [
            lease.task.id
            for lease in c.lease(node_id=node, max_tasks=4, versions={"policy": 0}).leases
        ]
        in_e1 = sorted(i.rsplit("-", 1)[1] for i in second if ":e1:" in i)
        assert in_e1 == ["2", "3"]
        skipped = [
            t
            for t in svc.service.store.call(history.tasks)
            if (t.winner or "").startswith("skipped:")
        ]
        assert {t.id for t in skipped if ":e1:" in t.id} == {
            f"arith:train:e1:arith-L2-train-{k}" for k in (0, 1)
        }
        assert {t.winner for t in skipped} == {"skipped:predicted_zero_variance"}
        st = c.status()["policies"]["policy"]
        # rollouts not generated
        assert st["dropped"]["predicted_zero_variance"] == 4 * len(skipped)
    with ThreadedService(recipe, db) as svc:
        skip = svc.service.ctx.pipeline.gates[0]
        times = sum(":arith-L2-train-0" in t.id for t in skipped)
        assert skip.prompts["arith:train:arith-L2-train-0"] == [1, times]  # streak 1, skips
        assert skip.skip_probability("arith:train:arith-L2-train-0") == 0.5**times


def test_replay_serves_copies_that_reference_the_originals(tmp_path):
    recipe = make_recipe(
        tmp_path,
        run={"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 10},
        tasks={"group_size": 4},
        dataflow={
            "buffer_steps": 0,
            "policies": [{"name": "replay", "kwargs": {"ratio": 0.5, "max_staleness": 2}}],
        },
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
    ):
        node = c.register(policies={"policy": 0}).node_id
        _lease_push(c, node, 8, lambda lease: [1, 0, 1, 0])
        c.announce_version(WeightVersion(policy="policy", version=0, location="/w", digest="d0"))
        acked: list[list[str]] = []
        for v in range(3):
            batch = c.next_batch(policy="policy", num_groups=2, trainer_version=v).batch
            acked.append([s.id for s in batch.samples])
            c.ack(batch.id, trainer_version=v + 1)  # no checkpoint: arrays freed at once
            c.announce_version(
                WeightVersion(policy="policy", version=v + 1, location="/w", digest=f"d{v}")
            )
        replayed = [[i for i in ids if "#r1" in i] for ids in acked]
        assert [len(r) for r in replayed] == [0, 4, 4]  # one group of 4 in each later batch
        originals = {i for ids in acked for i in ids if "#r" not in i}
        assert {i.split("#r")[0] for r in replayed for i in r} <= originals
        all_ids = [i for ids in acked for i in ids]
        assert len(all_ids) == len(set(all_ids))  # no sample row in two acknowledged batches
        # the replayed samples still carried their tokens when served (copies made at batch time)
        rows = svc.service.store.call(history.replays)
        assert all(r.n == 1 and r.source == r.origin for r in rows)
        counters = c.status()["policies"]["policy"]["counters"]
        assert counters["replayed_groups"] == 2 and counters["replayed_samples"] == 8
        # the pool ages out: at version 5 every remaining copy (min_version 0) is past the bound
        c.lease(node_id=node, max_tasks=2, versions={"policy": 0})
        _lease_push(c, node, 2, lambda lease: [1, 0, 0, 0])
        batch = c.next_batch(policy="policy", num_groups=2, trainer_version=5).batch
        assert batch is not None and not any("#r" in s.id for s in batch.samples)
        assert c.status()["policies"]["policy"]["counters"]["replay_expired"] >= 1


def test_a_rewound_batch_with_replays_is_served_again_unchanged(tmp_path):
    recipe = make_recipe(
        tmp_path,
        run={"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 10},
        dataflow={"buffer_steps": 0, "policies": [{"name": "replay", "kwargs": {"ratio": 0.5}}]},
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
    ):
        node = c.register(policies={"policy": 0}).node_id
        _lease_push(c, node, 8, lambda lease: [1, 0, 1, 0])

        def announce(v):
            c.announce_version(
                WeightVersion(policy="policy", version=v, location="/w", digest=f"d{v}")
            )

        announce(0)
        served = []
        for v in range(3):  # the trainer checkpoints only at step 1
            b = c.next_batch(policy="policy", num_groups=2, trainer_version=v).batch
            served.append((b.id, [s.id for s in b.samples], [s.tokens for s in b.samples]))
            c.ack(b.id, trainer_version=v + 1, checkpoint_version=1)
            announce(v + 1)
        assert any("#r" in i for i in served[1][1])
        announce(1)  # restarted from checkpoint-1: steps 2 and 3 are trained again
        for v in (1, 2):
            b = c.next_batch(policy="policy", num_groups=2, trainer_version=v).batch
            assert (b.id, [s.id for s in b.samples], [s.tokens for s in b.samples]) == served[v]
            assert all(s.tokens for s in b.samples)  # kept: no checkpoint covers them yet
            c.ack(b.id, trainer_version=v + 1, checkpoint_version=1)
        ids = [
            sid
            for b in svc.service.store.call(history.batches)
            if b.state == "acked"
            for sid in b.sample_ids
        ]
        assert len(ids) == len(set(ids)) == 3 * 8


def test_per_set_deadlines_reach_the_tasks_and_edf_serves_them_first(tmp_path):
    sets = [
        {"name": "arith", "kwargs": {"level": 1}, "deadline_s": 600.0},
        {"name": "arith", "kwargs": {"level": 2}, "deadline_s": 30.0},
    ]
    recipe = make_recipe(
        tmp_path,
        tasks={"group_size": 4, "sets": sets},
        dataflow={"buffer_steps": 0, "policies": [{"name": "edf"}]},
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
    ):
        node = c.register(policies={"policy": 0}).node_id
        leases = c.lease(node_id=node, max_tasks=6, versions={"policy": 0}).leases
        # the pending window holds both sets; the 30 s set is served before the 600 s set
        assert [lease.task.task_set for lease in leases] == ["arith[1]"] * 6
        assert all(lease.task.deadline is not None for lease in leases)
