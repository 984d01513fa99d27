"""GPU readiness of the trainer, measured on CPU: exact micro-batch accumulation, flat memory as
the batch grows, and mixed precision that moves the weights as float32 does.

Three checks, each on the real trainer (``AstraGRPOTrainer`` built by ``build_trainer``):

* ``grad_accum_rel_err``: the built-in tiny policy in float64, one batch of rows of very
  different lengths with tool output inside the completions (no loss on it) and behaviour
  log-probs that make the importance ratio truncate; the gradient accumulated over micro-batches
  of ``trainer.micro_batch_tokens`` against the one-pass gradient of the same batch,
  ``|g_micro - g_one| / |g_one|``, the largest over the loss types grpo, dr_grpo, dapo and bnpo
  and over the seeds. Target <= 1e-6.
* ``peak_mem_ratio_8x``: a randomly initialised Llama-shaped model (config below; built from a
  config, nothing downloaded) takes one optimizer step on a batch, then, in a fresh process, on a
  batch 8x as large, both at the same ``micro_batch_tokens`` (the 1x batch is one micro-batch).
  Memory is the process's peak resident set size (``ru_maxrss``) minus its resident size just
  before the step (after the model is loaded): what the step itself added, activations,
  gradients and AdamW state included. Each step runs in a process of its own because the peak
  is a high-water mark. RSS rather than tracemalloc because torch allocates outside Python's
  allocator. glibc's mmap threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) in those processes:
  left dynamic, it rises as large blocks are freed and freed tensors then stay in the heap, so
  the RSS would count pages kept for reuse (measured: 1.31 instead of 1.09 on the quick shape),
  which says more about glibc than about what the step holds. Target <= 1.2. ``peak_mem_ratio_8x_one_pass`` is the same 8x step with a
  budget above the whole batch (one forward over all rows), to show what the budget saves.
* ``moved_fraction_vs_fp32``: 20 steps at lr 1e-6 of the tiny policy on fixed synthetic
  batches with ``trainer.dtype = "bfloat16"`` (float32 master weights and AdamW state, bfloat16
  autocast) and with ``"float32"``; the fraction of parameter elements that changed, bf16 over
  fp32. Target >= 0.9. ``pure_bf16_moved_vs_fp32`` is the same with the parameters themselves
  in bfloat16 (the trainer's behaviour before fp32 masters), to show the rounding it avoids.

The JSON keeps every check's details under ``checks.NAME`` and its headline figure at the top
level, with ``targets`` and ``met``; further checks (FSDP equivalence, clipping) add a key, a
``checks`` entry and a target the same way.

    python bench/gpu_readiness.py --quick --json /tmp/gpu_readiness.json   # < 3 min on 2 cores
    python bench/gpu_readiness.py --json docs/results/gpu_readiness.json
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _cli
import _report
import _stamp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: figure -> (comparison, target)
TARGETS: dict[str, tuple[str, float]] = {
    "grad_accum_rel_err": ("<=", 1e-6),
    "peak_mem_ratio_8x": ("<=", 1.2),
    "moved_fraction_vs_fp32": (">=", 0.9),
}
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
#: seeds of the synthetic batches of the accumulation check
SEEDS = {"quick": (0,), "full": (0, 1, 2)}
#: the accumulation check's budget: small enough to cut the tiny batch into several parts
ACCUM_BUDGET = 60
#: (hidden, layers, intermediate, vocabulary, rows of the 1x batch, tokens per row) of the
#: memory check's model and batch; the budget is the 1x batch's padded size
MEMORY_SHAPE = {"quick": (256, 2, 768, 4096, 8, 160), "full": (512, 4, 1408, 8192, 8, 256)}
#: bytes: allocations above it are mmapped, and returned to the system when freed
MMAP_THRESHOLD = 128 * 1024
PRECISION_STEPS = 20
PRECISION_LR = 1e-6
POLICY = "policy"
TINY = "builtin:tiny-arith"


# ------------------------------------------------------------------------------ batches
def synthetic_batch(
    seed: int, version: int, *, groups: int = 2, rows: int = 4, vocab: int = 361, tail=None
):
    """Groups of rows of very different lengths: a prompt, a generated turn, tool output (no
    loss), a last generated turn; behaviour log-probs far from any policy's (the importance
    ratio truncates). ``tail``: the last turn's length per row (default 1, 4, 9, 17...)."""
    import torch

    from astraflow.protocol import Batch, Group, Sample, new_id

    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        gid, tid = new_id("grp"), new_id("task")
        samples = []
        for r in range(rows):
            last = tail(rng, r) if tail else [1, 4, 9, 17][r % 4]
            prompt = rng.randint(3, 12)
            tokens = [rng.randrange(4, vocab) for _ in range(prompt)]
            mask, logps, versions = [0] * prompt, [0.0] * prompt, [-1] * prompt
            for k, n in enumerate((rng.randint(2, 6), rng.randint(1, 5), last)):
                gen = k % 2 == 0
                tokens += [rng.randrange(4, vocab) for _ in range(n)]
                mask += [int(gen)] * n
                logps += [-rng.uniform(3.0, 9.0) if gen else 0.0 for _ in range(n)]
                versions += [version if gen else -1] * n
            samples.append(
                Sample(
                    policy=POLICY,
                    role="agent",
                    task_id=tid,
                    episode_id=new_id("ep"),
                    group_id=gid,
                    tokens=tokens,
                    loss_mask=mask,
                    logprobs=logps,
                    versions=versions,
                    reward=rng.random(),
                )  # fmt: skip
            )
        rewards = torch.tensor([s.reward for s in samples])
        out.append(
            Group(
                id=gid,
                task_id=tid,
                policy=POLICY,
                samples=samples,
                reward_mean=float(rewards.mean()),
                reward_std=float(rewards.std()),
            )  # fmt: skip
        )
    return Batch(id=new_id("batch"), policy=POLICY, trainer_version=version, groups=out)


def _trainer(model_path: str, run_dir: Path, max_steps: int, **cfg):
    from astraflow.recipe.schema import TrainerConfig
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import InProcessBatchSource

    source = InProcessBatchSource(producer=cfg.pop("producer", None))
    trainer = build_trainer(
        model_path, TrainerConfig(device="cpu", checkpoint_every=1000, **cfg), source, run_dir,
        POLICY, max_steps=max_steps, publish_on_start=False,
    )  # fmt: skip
    return trainer, source


# ------------------------------------------------------------------------------ checks
def grad_accum(seeds: tuple[int, ...]) -> dict[str, Any]:
    """Accumulated over micro-batches vs one pass, float64, per loss type and seed."""
    import torch

    from astraflow.models import resolve_model

    path = resolve_model(TINY)
    errors: dict[str, float] = {}
    parts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for loss_type in LOSS_TYPES:
            worst = 0.0
            for seed in seeds:
                trainer, source = _trainer(
                    path, Path(tmp) / f"{loss_type}-{seed}", 1, groups_per_step=2,
                    loss_type=loss_type,
                )  # fmt: skip
                trainer.model.to(torch.float64).train()
                source.put(synthetic_batch(seed, 0))
                inputs = trainer._generate_and_score_completions([])
                grads = []
                for budget in (None, ACCUM_BUDGET):
                    trainer.micro_batch_tokens = budget
                    trainer.model.zero_grad(set_to_none=True)
                    copy = {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
                    trainer.compute_loss(trainer.model, copy).backward()
                    grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
                trainer.micro_batch_tokens = ACCUM_BUDGET
                parts[loss_type] = len(trainer._split_micro_batches(inputs))
                one, micro = grads
                worst = max(worst, float((micro - one).norm() / one.norm()))
            errors[loss_type] = worst
    return {
        "rel_err": errors,
        "micro_batches": parts,
        "budget_tokens": ACCUM_BUDGET,
        "seeds": list(seeds),
        "dtype": "float64",
        "value": max(errors.values()),
    }


def _memory_model(shape: tuple, workdir: Path) -> Path:
    """A random Llama-shaped model saved with the tiny policy's tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from astraflow.models import resolve_model

    hidden, layers, inter, vocab, _, _ = shape
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=2,
        eos_token_id=3, pad_token_id=0,
    )  # fmt: skip
    out = workdir / "model"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tiny = Path(resolve_model(TINY))
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def memory_child(model: str, groups: int, length: int, budget: int, seed: int) -> None:
    """(In its own process.) One optimizer step on ``groups`` x 4 rows of ``length`` tokens;
    prints the step's peak added resident memory in KiB as JSON."""
    import torch

    torch.manual_seed(seed)
    trainer, source = _trainer(
        model, Path(tempfile.mkdtemp(prefix="gpu-readiness-")), 1, groups_per_step=groups,
        loss_type="dapo", micro_batch_tokens=budget,
    )  # fmt: skip

    def tail(rng, r):  # every row the same padded length: ~length tokens
        return length - 30

    batch = synthetic_batch(seed, 0, groups=groups, vocab=361, tail=tail)
    for g in batch.groups:  # fixed lengths: prompt 12, turns 6 + 5 + rest
        for s in g.samples:
            assert len(s.tokens) <= length
    source.put(batch)
    import gc

    gc.collect()
    before = _rss_kib()
    trainer.run(resume=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"step_kib": peak - before, "before_kib": before, "peak_kib": peak}))


def _measure(model: Path, groups: int, length: int, budget: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--_memory-child", str(model), str(groups), str(length),
           str(budget)]  # fmt: skip
    # glibc raises its mmap threshold as large blocks are freed, after which freed tensors stay
    # in the heap and count in the RSS until reused: pin it, so the RSS follows live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"memory step failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_memory(mode: str, workdir: Path) -> dict[str, Any]:
    shape = MEMORY_SHAPE[mode]
    rows, length = shape[4], shape[5]
    groups = rows // 4
    budget = rows * length  # the 1x batch is exactly one micro-batch
    model = _memory_model(shape, workdir)
    one = _measure(model, groups, length, budget)
    eight = _measure(model, 8 * groups, length, budget)
    whole = _measure(model, 8 * groups, length, 10**9)
    return {
        "model": dict(zip(("hidden", "layers", "intermediate", "vocab"), shape[:4], strict=True)),
        "rows_1x": rows,
        "tokens_per_row": length,
        "budget_tokens": budget,
        "step_mib": {
            "1x": round(one["step_kib"] / 1024, 1),
            "8x": round(eight["step_kib"] / 1024, 1),
            "8x_one_pass": round(whole["step_kib"] / 1024, 1),
        },
        "measure": "peak RSS (ru_maxrss) minus RSS before the step, one process per step, "
        f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}",
        "value": round(eight["step_kib"] / one["step_kib"], 3),
        "one_pass": round(whole["step_kib"] / one["step_kib"], 3),
    }


def precision() -> dict[str, Any]:
    import torch

    from astraflow.models import resolve_model

    path = resolve_model(TINY)
    moved: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, pure in (
            ("float32", "float32", False),
            ("bf16_fp32_masters", "bfloat16", False),
            ("pure_bf16", "bfloat16", True),
        ):
            trainer, _ = _trainer(
                path, Path(tmp) / name, PRECISION_STEPS, groups_per_step=2, loss_type="dapo",
                learning_rate=PRECISION_LR, dtype=dtype,
                producer=lambda policy, n, v: synthetic_batch(v, v),
            )  # fmt: skip
            if pure:
                trainer.model.to(torch.bfloat16)
            before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            trainer.run(resume=False)
            changed = sum(
                int((p.detach() != before[n]).sum()) for n, p in trainer.model.named_parameters()
            )
            moved[name] = changed / sum(p.numel() for p in trainer.model.parameters())
    return {
        "moved_fraction": {k: round(v, 4) for k, v in moved.items()},
        "steps": PRECISION_STEPS,
        "learning_rate": PRECISION_LR,
        "value": round(moved["bf16_fp32_masters"] / moved["float32"], 4),
        "pure_bf16": round(moved["pure_bf16"] / moved["float32"], 4),
    }


def met(key: str, value: float | None) -> bool | None:
    if value is None:
        return None
    op, target = TARGETS[key]
    return value <= target if op == "<=" else value >= target


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_memory-child":
        model, groups, length, budget = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        memory_child(model, groups, length, budget, seed=0)
        return 0
    ap = _cli.bench_parser(__doc__)
    _cli.add_output_flags(ap, quick="one seed, a smaller memory model", plot=False)
    ns = ap.parse_args(argv)
    mode = "quick" if ns.quick else "full"
    started = time.time()
    checks: dict[str, Any] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-readiness-") as tmp:
        for name, run in (
            ("grad_accum", lambda: grad_accum(SEEDS[mode])),
            ("peak_mem", lambda: peak_memory(mode, Path(tmp))),
            ("precision", precision),
        ):
            try:
                checks[name] = run()
            except Exception as exc:  # the other checks still report
                errors[name] = f"{type(exc).__name__}: {exc}"
    figures = {
        "grad_accum_rel_err": (checks.get("grad_accum") or {}).get("value"),
        "peak_mem_ratio_8x": (checks.get("peak_mem") or {}).get("value"),
        "peak_mem_ratio_8x_one_pass": (checks.get("peak_mem") or {}).get("one_pass"),
        "moved_fraction_vs_fp32": (checks.get("precision") or {}).get("value"),
        "pure_bf16_moved_vs_fp32": (checks.get("precision") or {}).get("pure_bf16"),
    }
    out: dict[str, Any] = {
        **figures,
        "targets": {k: f"{op} {t:g}" for k, (op, t) in TARGETS.items()},
        "met": {k: met(k, figures[k]) for k in TARGETS},
        "checks": checks,
        "errors": errors,
        "quick": ns.quick,
        "bench_s": round(time.time() - started, 1),
    }
    rows = []
    for key in figures:
        value = figures[key]
        target = " ".join(map(str, TARGETS[key])) if key in TARGETS else ""
        ok = {True: "yes", False: "NO", None: ""}[met(key, value) if key in TARGETS else None]
        rows.append([key, _report.fmt(value, "{:.3g}"), target, ok])
    _report.console.print(
        _report.table(f"gpu_readiness ({mode})", ["figure", "value", "target", "met"], rows)
    )
    if "peak_mem" in checks:
        _report.console.print(f"  step memory (MiB): {checks['peak_mem']['step_mib']}")
    for name, err in errors.items():
        _report.console.print(f"[red]{name} failed[/]: {err[-2000:]}")
    if ns.json:
        _stamp.write_json(ns.json, out)
        _report.console.print(f"wrote {ns.json}")
    return 0 if not errors and all(out["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
