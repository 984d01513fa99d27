"""Builder of ``builtin:tiny-arith``: a tiny Llama causal LM warm-started on generated arithmetic.

Why Llama rather than Qwen2: transformers 5 ``AutoTokenizer`` forces ``Qwen2Tokenizer`` (a byte-level
pre-tokenizer) on every ``qwen2`` checkpoint, which would silently mangle this character-level
vocabulary in any tool that loads it that way (vLLM does); for ``llama`` it honours the
checkpoint's own ``tokenizer.json``.

Why warm-start: RL from a random policy gets zero reward on every group, so GRPO has nothing to
learn from. A short supervised run on arithmetic (level 2 of :mod:`astraflow.tasks.arith`) leaves a policy that
is weak but right often enough, and uncertain enough when sampling, that groups have reward variance.

Why deterministic: the checkpoint is committed; rebuilding with the same seed, step count and
thread count on the same machine must reproduce it byte for byte (``torch.use_deterministic_algorithms``,
seeded generators, a fixed data order, one code path).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Architecture of the tiny policy. Untied embeddings: vLLM reloads lm_head separately.
MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
}
DEFAULT_SEED = 0
#: At most this many optimizer steps; training stops earlier once the dev accuracy reaches
#: :data:`DEFAULT_TARGET_ACCURACY` (checked every :data:`CHECK_EVERY` steps).
DEFAULT_STEPS = 1200
DEFAULT_TARGET_ACCURACY = 0.25
CHECK_EVERY = 25
WARMUP_STEPS = 30
DEV_SIZE = 200
BATCH_SIZE = 128
LEARNING_RATE = 3e-3
ARITH_LEVEL = 2
#: Tokens an answer may take, <|end|> included ("-99" / "891" are the longest level-2 answers).
MAX_ANSWER_TOKENS = 6


@dataclass
class BuildResult:
    out_dir: Path
    steps: int
    seed: int
    final_loss: float | None
    greedy_accuracy: float
    sampled_accuracy: float
    #: Fraction of test problems whose sampled answers (T=1) were neither all right nor all wrong.
    mixed_group_fraction: float
    params: int
    size_bytes: int


def _prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def encode_example(tokenizer, question: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of one solved problem and the loss mask (1 on the answer and its <|end|>)."""
    prompt = _prompt_ids(tokenizer, question)
    target = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt + target, [0] * len(prompt) + [1] * len(target)


def new_model(tokenizer, seed: int, config: dict[str, Any] | None = None):
    """A freshly initialised Llama of :data:`MODEL_CONFIG` (or ``config``) over ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **(MODEL_CONFIG if config is None else config),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.to(torch.float32)
    return model


def _batches(tokenizer, problems: list[dict], steps: int, seed: int):
    encoded = [encode_example(tokenizer, p["question"], p["answer"]) for p in problems]
    return padded_batches(encoded, tokenizer.pad_token_id, steps, seed, BATCH_SIZE)


def padded_batches(
    encoded: list[tuple[list[int], list[int]]], pad_id: int, steps: int, seed: int, batch_size: int
):
    """Right-padded (ids, labels, attention) batches of ``(ids, loss mask)`` examples in a seeded
    order (reshuffled each pass), ``steps`` of them."""
    import torch

    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            extra = list(range(len(encoded)))
            rng.shuffle(extra)
            order.extend(extra)
        chosen, order = order[:batch_size], order[batch_size:]
        width = max(len(encoded[i][0]) for i in chosen)
        ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chosen), width), -100, dtype=torch.long)
        attn = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, i in enumerate(chosen):
            seq, mask = encoded[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            attn[row, : len(seq)] = 1
            labels[row, : len(seq)] = torch.tensor(
                [t if m else -100 for t, m in zip(seq, mask, strict=True)]
            )
        yield ids, labels, attn


def train_step(model, opt, sched, ids, labels, attn) -> float:
    """One supervised step of a built-in model's warm start (clipped at 1.0); its loss."""
    import torch

    model.train()
    loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def answers(
    model, tokenizer, questions: list[str], temperature: float = 0.0, seed: int = 0
) -> list[str]:
    """Decode an answer to each question (greedy when ``temperature == 0``).

    Questions are grouped by prompt length, so each group decodes as one unpadded batch.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    by_len: dict[int, list[int]] = {}
    prompts = [_prompt_ids(tokenizer, q) for q in questions]
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    out = [""] * len(questions)
    model.eval()
    with torch.no_grad():
        for idx in by_len.values():
            ids = torch.tensor([prompts[i] for i in idx])
            start = ids.shape[1]
            done = torch.zeros(len(idx), dtype=torch.bool)
            for _ in range(MAX_ANSWER_TOKENS):
                logits = model(input_ids=ids).logits[:, -1, :].float()
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    probs = torch.softmax(logits / temperature, -1)
                    nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
                nxt = torch.where(done, torch.full_like(nxt, tokenizer.pad_token_id), nxt)
                done |= nxt == tokenizer.eos_token_id
                ids = torch.cat([ids, nxt[:, None]], dim=1)
                if bool(done.all()):
                    break
            for row, i in enumerate(idx):
                gen_ids = [t for t in ids[row, start:].tolist() if t != tokenizer.pad_token_id]
                if tokenizer.eos_token_id in gen_ids:
                    gen_ids = gen_ids[: gen_ids.index(tokenizer.eos_token_id)]
                out[i] = tokenizer.decode(gen_ids, skip_special_tokens=True).strip()
    return out


def accuracy(
    model, tokenizer, problems: list[dict], temperature: float = 0.0, seed: int = 0
) -> float:
    got = answers(model, tokenizer, [p["question"] for p in problems], temperature, seed)
    return sum(g == p["answer"] for g, p in zip(got, problems, strict=True)) / max(1, len(problems))


def mixed_group_fraction(
    model, tokenizer, problems: list[dict], group: int = 8, seed: int = 0
) -> tuple[float, float]:
    """(sampled accuracy, fraction of problems with both right and wrong answers in ``group`` samples)."""
    questions = [p["question"] for p in problems for _ in range(group)]
    got = answers(model, tokenizer, questions, temperature=1.0, seed=seed)
    right = [g == problems[i // group]["answer"] for i, g in enumerate(got)]
    mixed = sum(0 < sum(right[i * group : (i + 1) * group]) < group for i in range(len(problems)))
    return sum(right) / max(1, len(right)), mixed / max(1, len(problems))


def build(
    out_dir: str | Path,
    seed: int = DEFAULT_SEED,
    steps: int = DEFAULT_STEPS,
    on_step: Callable[[int, float], None] | None = None,
    eval_size: int = 500,
    target_accuracy: float = DEFAULT_TARGET_ACCURACY,
) -> BuildResult:
    """Train and save the tiny policy into ``out_dir``; returns its measured accuracy.

    Training runs for at most ``steps`` optimizer steps and stops as soon as greedy accuracy on a
    dev set (fresh train-distribution problems, never the test split) reaches ``target_accuracy``
    (0 disables the early stop). Stopping on a measured accuracy rather than a fixed step count
    keeps the policy "weak but non-zero" even if the data or the library versions shift; the
    check is itself deterministic, so the build stays reproducible.
    """
    import torch

    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    previous_threads = torch.get_num_threads()
    # One thread: the result is then independent of the core count, and on a shared machine a
    # single thread is several times faster than two that wait on each other.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        return _build(out_dir, seed, steps, on_step, eval_size, target_accuracy)
    finally:
        torch.set_num_threads(previous_threads)


def _build(out_dir, seed, steps, on_step, eval_size, target_accuracy) -> BuildResult:
    import torch

    from astraflow.models.tokenizer import build_tokenizer
    from astraflow.tasks import arith

    tokenizer = build_tokenizer()
    model = new_model(tokenizer, seed)
    final_loss = None
    done_steps = 0
    if steps:
        # The dev set is held out from training (like the test split), so the early stop measures
        # generalisation, not memorisation of the train stream.
        stream = arith.generate("train", seed=seed, level=ARITH_LEVEL)
        dev = stream[:DEV_SIZE]
        dev_questions = {p["question"] for p in dev}
        train = [p for p in stream[DEV_SIZE:] if p["question"] not in dev_questions]
        opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
        for step, (ids, labels, attn) in enumerate(_batches(tokenizer, train, steps, seed), 1):
            final_loss = train_step(model, opt, sched, ids, labels, attn)
            done_steps = step
            if on_step:
                on_step(step, final_loss)
            if target_accuracy > 0 and step % CHECK_EVERY == 0:
                if accuracy(model, tokenizer, dev) >= target_accuracy:
                    break
    model.eval()
    test = arith.generate("test", level=ARITH_LEVEL)[:eval_size]
    greedy = accuracy(model, tokenizer, test)
    sampled, mixed = mixed_group_fraction(model, tokenizer, test[: min(200, eval_size)], seed=seed)
    out = save(model, tokenizer, out_dir)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return BuildResult(
        out_dir=out,
        steps=done_steps,
        seed=seed,
        final_loss=final_loss,
        greedy_accuracy=greedy,
        sampled_accuracy=sampled,
        mixed_group_fraction=mixed,
        params=sum(p.numel() for p in model.parameters()),
        size_bytes=size,
    )


def save(
    model,
    tokenizer,
    out_dir: str | Path,
    chat_template: str | None = None,
    max_new_tokens: int = 32,
) -> Path:
    """Write the checkpoint in a layout both transformers 4.x/5.x and vLLM load (``chat_template``
    defaults to the tiny policies' plain :data:`~astraflow.models.tokenizer.CHAT_TEMPLATE`)."""
    from transformers import GenerationConfig

    from astraflow.models.tokenizer import CHAT_TEMPLATE

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    )
    model.save_pretrained(out, safe_serialization=True)
    # Keep the pre-5.0 spellings too, so older transformers/vLLM images read the same config.
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.setdefault("rope_theta", MODEL_CONFIG["rope_theta"])
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(out)
    # transformers 5 writes a tokenizer_config older releases (and vLLM images) cannot read:
    # name the classic fast-tokenizer class, keep special tokens and the template inline.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    cfg["chat_template"] = CHAT_TEMPLATE if chat_template is None else chat_template
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    special = {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "additional_special_tokens": list(cfg.get("additional_special_tokens", [])),
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; the files are committed and shared
    return out
