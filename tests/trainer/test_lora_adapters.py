"""One trainer process for two LoRA adapter policies of one base: real steps on real rollouts of the
tiny policy, each adapter with its own optimizer, version stream and checkpoints, the base loaded
once and never written, versions holding the adapter's tensors only."""

from __future__ import annotations

import pytest
import torch
from trainer_rollouts import arith_prompts, make_batch, rollout_group

from astraflow.models.lora import AdapterSpec
from astraflow.recipe.schema import AdapterConfig, TrainerConfig
from astraflow.trainer.adapters import SharedBase, run_side_by_side
from astraflow.trainer.grpo import build_trainer
from astraflow.trainer.source import InProcessBatchSource
from astraflow.weights import WeightStore
from astraflow.weights.digest import state_digest

pytest.importorskip("peft")

SPECS = {
    "solver": AdapterSpec("solver", AdapterConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), 1),
    "verifier": AdapterSpec("verifier", AdapterConfig(r=8, alpha=16), 2),
}  # fmt: skip
LR = {"solver": 0.1, "verifier": 0.3}
#: SGD, so that the row order of a batch (see test_adapters_move_independently) changes the
#: result by float rounding only: Adam maps a near-zero gradient's rounding noise to a +-lr step
OPTIM = {"optim": "sgd"}
STEPS = 2


@pytest.fixture(scope="module")
def batches(tiny_policy):
    """The batches of each policy, fixed once, so every run below trains on the same data."""
    model, tok = tiny_policy
    torch.manual_seed(0)
    return {
        policy: [
            make_batch(
                [
                    rollout_group(model, tok, q, a, policy=policy, group_size=4, version=v)
                    for q, a in arith_prompts(2, seed=10 * i + v)
                ],
                policy,
                v,
            )
            for v in range(STEPS)
        ]
        for i, policy in enumerate(SPECS)
    }


def train(tiny_model_path, batches, policies, root, shared: SharedBase | None):
    store = WeightStore(root / "weights")
    trainers = {}
    for policy in policies:
        source = InProcessBatchSource()
        for batch in batches[policy]:
            source.put(batch)
        source.close()
        cfg = TrainerConfig(
            groups_per_step=2, learning_rate=LR[policy], checkpoint_every=STEPS, extra=OPTIM
        )
        trainers[policy] = build_trainer(
            tiny_model_path, cfg, source, root / "run", policy, max_steps=STEPS,
            adapter=SPECS[policy], base_model=shared.copy() if shared is not None else None,
            publish=lambda v, sd, p=policy: store.publish(p, v, sd),
        )  # fmt: skip
    versions = run_side_by_side({p: (lambda t=t: t.run(resume=False)) for p, t in trainers.items()})
    return store, trainers, versions


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_path, batches):
    """Both adapters side by side on one shared base, and the solver alone (its own base)."""
    shared = SharedBase.load(tiny_model_path, torch.float32)
    before = state_digest(shared.tensors())
    root = tmp_path_factory.mktemp("adapters")
    store, trainers, versions = train(tiny_model_path, batches, list(SPECS), root / "both", shared)
    alone, _, _ = train(tiny_model_path, batches, ["solver"], root / "alone", None)
    return {
        "shared": shared, "base_before": before, "store": store, "trainers": trainers,
        "versions": versions, "alone": alone, "root": root,
    }  # fmt: skip


def test_each_adapter_publishes_a_version_stream_of_its_own_tensors(runs):
    store = runs["store"]
    assert runs["versions"] == {"solver": STEPS, "verifier": STEPS}
    keys = {}
    for policy in SPECS:
        assert store.versions(policy) == list(range(STEPS + 1))
        state = store.load_state(policy, STEPS)
        assert all(".lora_A." in k or ".lora_B." in k for k in state), sorted(state)[:3]
        keys[policy] = set(state)
        assert store.meta(policy, STEPS)["parent"] == STEPS - 1  # a delta, of the adapter only
    # solver: q/v of 2 layers (A and B each); verifier: every linear layer
    assert {k.split(".")[-3] for k in keys["solver"]} == {"q_proj", "v_proj"}
    assert len(keys["verifier"]) > len(keys["solver"])
    assert store.meta("verifier", 0)["digest"] != store.meta("solver", 0)["digest"]


def test_the_base_is_held_once_and_stays_byte_identical(runs):
    shared = runs["shared"]
    assert state_digest(shared.tensors()) == runs["base_before"]
    base_ptrs = {t.data_ptr() for t in shared.tensors().values()}
    for trainer in runs["trainers"].values():
        frozen = [p for n, p in trainer.model.named_parameters() if ".lora_" not in n]
        assert frozen and all(p.data_ptr() in base_ptrs for p in frozen)
        assert all(not p.requires_grad for p in frozen)


def test_adapters_move_independently(runs):
    """Each adapter moved; the solver trained beside the verifier ends where it ends alone, up to
    float rounding: TRL shuffles a batch's rows with torch's process-wide RNG, whose draws the
    two threads interleave, so the rows are summed in another order (the same rows)."""
    store, alone = runs["store"], runs["alone"]
    for policy in SPECS:
        first, last = store.load_state(policy, 0), store.load_state(policy, STEPS)
        moved = max(float((last[k] - first[k]).abs().max()) for k in first)
        assert moved > 1e-3, policy
    together, by_itself = store.load_state("solver", STEPS), alone.load_state("solver", STEPS)
    assert set(together) == set(by_itself)
    for key in together:
        torch.testing.assert_close(together[key], by_itself[key], rtol=0, atol=1e-6)


def test_version_zero_is_the_version_a_node_starts_from(runs, tiny_model_path):
    from astraflow.rollout.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, device="cpu", adapters=list(SPECS.values()))
    for policy in SPECS:
        node = state_digest(engine.adapter_state(policy))
        assert node == runs["store"].meta(policy, 0)["digest"], policy


def test_each_adapter_checkpoints_and_resumes_alone(runs, tiny_model_path, batches):
    root = runs["root"] / "both" / "run" / "checkpoints"
    for policy in SPECS:
        folder = root / policy / f"checkpoint-{STEPS}"
        assert (folder / "adapter_model.safetensors").is_file()
        assert not (folder / "model.safetensors").exists()
    # the solver resumes from its own checkpoint, whatever the verifier does
    source = InProcessBatchSource()
    source.put(batches["solver"][0])
    source.close()
    published = {}
    cfg = TrainerConfig(
        groups_per_step=2, learning_rate=LR["solver"], checkpoint_every=STEPS, extra=OPTIM
    )
    resumed = build_trainer(
        tiny_model_path, cfg, source, runs["root"] / "both" / "run", "solver",
        max_steps=STEPS + 1, adapter=SPECS["solver"],
        publish=lambda v, sd: published.setdefault(v, {k: t.clone() for k, t in sd.items()}),
    )  # fmt: skip
    assert resumed.run(resume=True) == STEPS + 1
    assert sorted(published) == [STEPS, STEPS + 1]
    stored = runs["store"].load_state("solver", STEPS)
    assert state_digest(published[STEPS]) == state_digest(stored)
