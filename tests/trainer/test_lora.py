"""LoRA training (peft) on the built-in tiny policy: real steps, real weight store, real export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_rollouts import arith_producer

from astraflow.recipe.schema import LoraConfig, TrainerConfig
from astraflow.trainer.grpo import build_trainer
from astraflow.trainer.source import InProcessBatchSource
from astraflow.weights import WeightStore

pytest.importorskip("peft")

POLICY = "policy"
TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_path, tiny_policy):
    """Three LoRA steps on real rollouts, every version published into a real weight store."""
    from transformers import AutoModelForCausalLM

    _, tok = tiny_policy
    tmp = tmp_path_factory.mktemp("lora")
    generator = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    base = {k: v.clone() for k, v in generator.state_dict().items()}
    store = WeightStore(tmp / "weights")
    torch.manual_seed(0)

    producer = arith_producer(generator, tok)

    def publish(version, state):
        store.publish(POLICY, version, state)
        generator.load_state_dict(state)  # the "node" follows: merged weights load as is

    cfg = TrainerConfig(groups_per_step=3, learning_rate=5e-3, checkpoint_every=3,
                        lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS))  # fmt: skip
    trainer = build_trainer(tiny_model_path, cfg, InProcessBatchSource(producer=producer),
                            tmp / "run", POLICY, max_steps=3, publish=publish)  # fmt: skip
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    assert trainer.run(resume=False) == 3
    after = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return {"base": base, "before": before, "after": after, "store": store, "tmp": tmp,
            "trainer": trainer}  # fmt: skip


def test_only_adapter_parameters_change(lora_run):
    before, after = lora_run["before"], lora_run["after"]
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "no parameter moved"
    assert all(".lora_" in k for k in changed), sorted(k for k in changed if ".lora_" not in k)
    assert any(".lora_B." in k for k in changed)  # B starts at 0: the adapter really learned
    trainable = [n for n, p in lora_run["trainer"].model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)


def test_published_versions_are_merged_base_weights(lora_run):
    store, base = lora_run["store"], lora_run["base"]
    assert store.versions(POLICY) == [0, 1, 2, 3]
    v0, v3 = store.load_state(POLICY, 0), store.load_state(POLICY, 3)
    assert set(v0) == set(base) == set(v3)  # the base model's keys: engines load them as is
    assert all(torch.equal(v0[k], base[k]) for k in base)  # B = 0: the start is the base model
    moved = {k for k in base if not torch.equal(v3[k], base[k])}
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved)


def test_delta_per_step_is_a_small_fraction_of_the_model(lora_run):
    store = lora_run["store"]
    full = len(store.read_full(POLICY, 2))
    for v in (1, 2, 3):
        delta = store.read_delta(POLICY, v)
        assert delta is not None
        # q_proj + v_proj are 11.5 % of the tiny model's elements; a delta stores index + value
        assert len(delta) < 0.3 * full, (v, len(delta), full)
    numel = sum(t.numel() for t in lora_run["base"].values())
    adapter = sum(t.numel() for k, t in lora_run["after"].items() if ".lora_" in k)
    assert adapter < 0.02 * numel  # what actually trains (and what a checkpoint holds)


def test_checkpoint_holds_the_adapter_and_exports_a_loadable_merge(lora_run):
    from transformers import AutoModelForCausalLM

    from astraflow.trainer.export import export_checkpoint

    ckpt = lora_run["tmp"] / "run" / "checkpoints" / POLICY / "checkpoint-3"
    assert (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists()  # the adapter only, not the full model
    out = export_checkpoint(ckpt, lora_run["tmp"] / "export")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    published = lora_run["store"].load_state(POLICY, 3)
    assert set(merged) == set(published)
    for k, v in published.items():
        torch.testing.assert_close(merged[k], v, rtol=0, atol=1e-6)


def test_export_rejects_a_folder_that_is_no_checkpoint(tmp_path: Path):
    from astraflow.trainer.export import export_checkpoint

    with pytest.raises(ValueError, match="neither a model"):
        export_checkpoint(tmp_path, tmp_path / "out")


def test_cli_export_of_a_run_directory_merges_the_newest_adapter(lora_run):
    from astraflow.cli.main import app
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    out = lora_run["tmp"] / "cli-export"
    result = CliRunner().invoke(app, ["export", str(lora_run["tmp"] / "run"), str(out)])
    assert result.exit_code == 0, result.output
    assert "checkpoint-3" in result.output
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    published = lora_run["store"].load_state(POLICY, 3)
    for k, v in published.items():
        torch.testing.assert_close(merged[k], v, rtol=0, atol=1e-6)


def test_resume_loads_the_adapter_checkpoint(lora_run, tiny_model_path, tiny_policy):
    """A restarted LoRA trainer starts from the adapter in checkpoint-3: the version it
    publishes on start is the one the first run published at step 3, and it goes on to step 4."""
    _, tok = tiny_policy
    from transformers import AutoModelForCausalLM

    sampler = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    sampler.load_state_dict(lora_run["store"].load_state(POLICY, 3))

    producer = arith_producer(sampler, tok)

    published: dict[int, dict[str, torch.Tensor]] = {}
    cfg = TrainerConfig(groups_per_step=3, learning_rate=5e-3, checkpoint_every=3,
                        lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS))  # fmt: skip
    resumed = build_trainer(tiny_model_path, cfg, InProcessBatchSource(producer=producer),
                            lora_run["tmp"] / "run", POLICY, max_steps=4,
                            publish=lambda v, sd: published.setdefault(v, dict(sd)))  # fmt: skip
    assert resumed.run(resume=True) == 4
    assert sorted(published) == [3, 4]
    first = lora_run["store"].load_state(POLICY, 3)
    for k, v in first.items():
        torch.testing.assert_close(published[3][k], v, rtol=0, atol=1e-7)
