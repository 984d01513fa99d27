"""Guard on the private TRL/transformers API the AstraFlow trainer relies on.

``AstraGRPOTrainer`` replaces ``GRPOTrainer._generate_and_score_completions`` and commits steps in
``Trainer._maybe_log_save_evaluate``. Neither is public API, so TRL is pinned and this test fails
loudly, naming what moved, when an upgrade changes any of it. Fix the trainer, then this test.
"""

from __future__ import annotations

import inspect
import re

import pytest

trl = pytest.importorskip("trl")

from transformers import Trainer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

#: Keys our batch producer returns (see astraflow/trainer/grpo.py).
PRODUCED = {
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "advantages",
    "num_items_in_batch",
    "old_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "ref_per_token_logps",
}
#: Keys TRL's loss reads only for vision-language models (never produced by text samples).
MULTIMODAL = {
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
}


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == "1.16.0", (
        f"trl {trl.__version__} installed, the trainer was written against 1.16.0 private API; "
        "re-read GRPOTrainer._generate_and_score_completions/_compute_loss before bumping the pin"
    )


def test_batch_producer_hook_signature():
    sig = inspect.signature(GRPOTrainer._generate_and_score_completions)
    assert list(sig.parameters) == ["self", "inputs"]
    src = inspect.getsource(GRPOTrainer._prepare_inputs)
    # One producer call per generation batch, reused steps_per_generation * num_iterations times.
    assert "self._generate_and_score_completions(generation_batch)" in src
    assert "self.args.steps_per_generation * self.num_iterations" in src
    assert "split_tensor_dict(" in src and "shuffle_sequence_dict(" in src


def test_loss_reads_only_keys_we_produce():
    src = inspect.getsource(GRPOTrainer._compute_loss)
    read = set(re.findall(r'inputs\["(\w+)"\]', src)) | set(
        re.findall(r'inputs\.get\("(\w+)"', src)
    )
    read |= set(re.findall(r'"(\w+)" (?:not )?in inputs', src))
    unknown = read - PRODUCED - MULTIMODAL
    assert not unknown, f"GRPOTrainer._compute_loss now reads {sorted(unknown)}; produce them"
    # The semantics we build on:
    assert 'completion_mask * inputs["tool_mask"]' in src  # loss mask = completion x tool mask
    assert "per_token_logps.detach() if old_per_token_logps is None" in src
    assert "log_ratio = per_token_logps - old_per_token_logps" in src
    assert "if advantages.dim() == 1:" in src  # (B, T) advantages are accepted
    assert 'inputs["num_items_in_batch"]' in src  # DAPO normaliser = tokens in the batch
    # TRL applies its own vLLM IS ratio only when use_vllm; we fold ours into the advantages.
    assert "self.use_vllm and self.vllm_importance_sampling_correction" in src


def test_helpers_we_call_keep_their_signature():
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    assert params[:6] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
    ]
    assert "compute_loss" in GRPOTrainer.__dict__
    for name in (
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
        "steps_per_generation",
        "num_iterations",
        "activation_checkpointing",
        "off_policy_mask_threshold",
    ):
        assert name in GRPOConfig.__dataclass_fields__, name
    init_src = inspect.getsource(GRPOTrainer.__init__)
    for attr in (
        "self.vllm_importance_sampling_correction =",
        "self.vllm_importance_sampling_mode =",
        "self.vllm_importance_sampling_clip_max =",
        "self.vllm_importance_sampling_clip_min =",
        "self.scale_rewards =",
        "self.loss_type =",
        "self._tokenizer =",
        "self._metrics =",
        "self.ref_model = None",
    ):
        assert attr in init_src, attr


def test_step_commit_hook_runs_after_the_optimizer_step():
    sig = inspect.signature(Trainer._maybe_log_save_evaluate)
    assert list(sig.parameters)[:3] == ["self", "tr_loss", "grad_norm"]
    loop = inspect.getsource(Trainer._run_epoch)
    step = loop.index("self.optimizer.step()")
    bump = loop.index("self.state.global_step += 1")
    commit = loop.index("self._maybe_log_save_evaluate(", bump)
    assert step < bump < commit
    body = inspect.getsource(Trainer._maybe_log_save_evaluate)
    assert body.index("self.log(logs") < body.index("self._save_checkpoint(model, trial)")
