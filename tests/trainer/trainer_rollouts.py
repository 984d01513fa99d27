"""Real rollouts from the built-in tiny policy, for the trainer tests.

Samples are produced the way a rollout node produces them: the model samples completions with
transformers, and the behaviour log-probs are the log-softmax of the logits it sampled from (at the
sampling temperature). Rewards come from a simple rule on the decoded answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from astraflow.protocol import Batch, Group, Sample, new_id

TEMPERATURE = 1.0


def arith_prompts(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        out.append((f"{a}+{b}", str(a + b)))
    return out


def digit_reward(text: str, answer: str) -> float:
    """Exact answer = 1; otherwise partial credit for a close number, digits and plain characters.

    The dense partial credit keeps reward variance inside groups for a random policy and for a
    warm-started one alike, so GRPO advantages are non-zero and every step has a learning signal.
    """
    text = text.strip()
    if text == answer:
        return 1.0
    n = max(1, len(text))
    score = 0.3 * sum(c.isdigit() for c in text) / n
    score += 0.1 * sum(c.isascii() and c.isprintable() for c in text) / n
    try:
        score += 0.3 * max(0.0, 1.0 - abs(int(text) - int(answer)) / max(1, abs(int(answer))))
    except ValueError:
        pass
    return score


@torch.no_grad()
def rollout_group(
    model,
    tokenizer,
    question: str,
    answer: str,
    *,
    policy: str,
    group_size: int,
    version: int,
    max_new_tokens: int = 6,
    temperature: float = TEMPERATURE,
    reward_fn: Callable[[str, str], float] = digit_reward,
) -> Group:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    inputs = torch.tensor([prompt_ids] * group_size)
    out = model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        do_sample=True,
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    gen = out.sequences[:, len(prompt_ids) :]
    logits = torch.stack(out.logits, dim=1).float() / temperature  # (G, T, V)
    logps = torch.log_softmax(logits, dim=-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
    group_id = new_id("grp")
    task_id = new_id("task")
    samples = []
    for i in range(group_size):
        ids = gen[i].tolist()
        n = len(ids)
        if tokenizer.eos_token_id in ids:
            n = ids.index(tokenizer.eos_token_id) + 1
        completion = ids[:n]
        text = tokenizer.decode(completion, skip_special_tokens=True)
        tokens = prompt_ids + completion
        samples.append(
            Sample(
                policy=policy,
                role="agent",
                task_id=task_id,
                episode_id=new_id("ep"),
                group_id=group_id,
                tokens=tokens,
                loss_mask=[0] * len(prompt_ids) + [1] * n,
                logprobs=[0.0] * len(prompt_ids) + logps[i, :n].tolist(),
                versions=[-1] * len(prompt_ids) + [version] * n,
                reward=reward_fn(text, answer),
            )
        )
    rewards = torch.tensor([s.reward for s in samples])
    return Group(
        id=group_id,
        task_id=task_id,
        policy=policy,
        samples=samples,
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std()) if len(samples) > 1 else 0.0,
    )


def make_batch(groups: list[Group], policy: str, version: int) -> Batch:
    return Batch(id=new_id("batch"), policy=policy, trainer_version=version, groups=groups)


def arith_producer(
    model,
    tokenizer,
    *,
    group_size: int = 4,
    seed_offset: int = 0,
    reward_fn: Callable[[str, str], float] = digit_reward,
) -> Callable[[str, int, int], Batch]:
    """An :class:`~astraflow.trainer.source.InProcessBatchSource` producer: ``num_groups`` real
    groups sampled from ``model`` on the arithmetic prompts of seed ``seed_offset + version``,
    the way an in-process "rollout node" would make a step's batch."""

    def producer(policy: str, num_groups: int, version: int) -> Batch:
        groups = [
            rollout_group(
                model,
                tokenizer,
                q,
                a,
                policy=policy,
                group_size=group_size,
                version=version,
                reward_fn=reward_fn,
            )  # fmt: skip
            for q, a in arith_prompts(num_groups, seed=seed_offset + version)
        ]
        return make_batch(groups, policy, version)

    return producer
