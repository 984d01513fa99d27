"""Builder of ``builtin:tiny-tools``: the tiny Llama warm-started to call a ``calculator`` tool.

The task (:mod:`astraflow.tasks.calculator`) is a 3-digit product the model cannot compute. The right episode
is two assistant turns: a hermes-format call
``<tool_call>{"name": "calculator", "arguments": {"expression": "347*58"}}</tool_call>``, then,
after the tool's result comes back as a ``tool`` turn of the chat template, the result as the answer.

Why a mixed corpus: RL needs a starting point that is right sometimes and wrong in ways it can
unlearn. The warm-start corpus therefore mixes correct episodes with the usual failures of a policy
that half-knows function calling, in fixed shares (:data:`CORPUS_MIX`): answering without the tool
(a guess), a call whose JSON is broken, a call to an unknown tool name, a call with a mis-copied
expression. Trained to fit that mixture, the policy samples each behaviour at about its share
(measured at build time, :class:`ToolsBuildResult`): about a third of its sampled first turns
are the right call, so GRPO groups have reward variance from the first step.

Why this is not a parser: the build's own measurement only compares generated text with the one
canonical call string of each problem; parsing calls is the job of the ``astraflow.tool_parsers``
registry, which the training path and the benchmark use.

Deterministic like :mod:`astraflow.models.tiny_arith`: one thread, seeded data order and init.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.models.tiny_arith import MODEL_CONFIG as _ARITH_CONFIG

TOOL_NAME = "calculator"
#: Context of the tiny tools policy: the tools line, a question, a call, a result and an answer
#: take ~140 tokens; 512 leaves room for a retry turn.
MODEL_CONFIG: dict[str, Any] = {**_ARITH_CONFIG, "max_position_embeddings": 512}
#: The calculator's OpenAI tool schema, as ``transformers.utils.get_json_schema`` writes it for
#: :func:`astraflow.tasks.calculator.calculator` (the template renders only the name and parameter names).
CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Evaluate an integer arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
#: Shares of the warm-start corpus, by behaviour. ``call``: the right call, then the result as the
#: answer. ``direct``: the answer written without a tool (the true product as target: the model
#: cannot learn it, so at sampling time it guesses). ``bad_json``: the call's closing brace missing.
#: ``bad_name``: a call to ``calc`` (no such tool; after the env's error, a guess). ``bad_expr``: one digit of the expression
#: mis-copied (a valid call, a wrong result, a wrong answer).
CORPUS_MIX: dict[str, float] = {
    "call": 0.40,
    "direct": 0.28,
    "bad_json": 0.12,
    "bad_name": 0.10,
    "bad_expr": 0.10,
}
DEFAULT_SEED = 0
DEFAULT_STEPS = 1500
WARMUP_STEPS = 20
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
DEV_SIZE = 128
#: New tokens for the call turn (the canonical call of a product is 82 tokens).
CALL_TOKENS = 100
ANSWER_TOKENS = 10


def call_text(expression: str, name: str = TOOL_NAME) -> str:
    """The hermes call the template renders for ``expression`` (and the model should write)."""
    payload = json.dumps({"name": name, "arguments": {"expression": expression}})
    return f"<tool_call>{payload}</tool_call>"


def _miscopy(rng: random.Random, expression: str) -> str:
    digits = [i for i, c in enumerate(expression) if c.isdigit()]
    i = rng.choice(digits)
    wrong = rng.choice([d for d in "0123456789" if d != expression[i]])
    return expression[:i] + wrong + expression[i + 1 :]


def episode(rng: random.Random, problem: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The chat messages of one corpus episode of behaviour ``kind`` (see :data:`CORPUS_MIX`)."""
    from astraflow.tasks.calculator import calculator

    question, answer = problem["question"], problem["answer"]
    user = {"role": "user", "content": question}
    if kind == "direct":
        return [user, {"role": "assistant", "content": answer}]
    if kind == "bad_json":
        text = call_text(question).replace("}}</tool_call>", "}</tool_call>")
        return [user, {"role": "assistant", "content": text}]
    if kind == "bad_name":
        return [
            user,
            {"role": "assistant", "content": call_text(question, name="calc")},
            {"role": "tool", "content": f"error: no tool named 'calc'; tools: {TOOL_NAME}"},
            {"role": "assistant", "content": answer},
        ]
    expression = _miscopy(rng, question) if kind == "bad_expr" else question
    if kind not in ("call", "bad_expr"):
        raise ValueError(f"unknown corpus behaviour {kind!r}; expected one of {sorted(CORPUS_MIX)}")
    result = calculator(expression)
    return [
        user,
        {"role": "assistant", "content": call_text(expression)},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": result},
    ]


def encode_episode(tokenizer, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids of one episode (tools line first) and the loss mask (1 on assistant turns).

    Rendered turn by turn through the chat template, so the ids are exactly those the rollout
    path builds (prompt, generated turn, the tool turn appended, the next generated turn).
    """
    tools = [CALCULATOR_SCHEMA]
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for i, message in enumerate(messages):
        text = tokenizer.apply_chat_template(
            messages[: i + 1], tools=tools, tokenize=False, add_generation_prompt=False
        )
        piece = text[len(rendered) :]
        rendered = text
        if message["role"] == "assistant":
            opener = "<|assistant|>"
            head = tokenizer.encode(opener, add_special_tokens=False)
            body = tokenizer.encode(piece[len(opener) :], add_special_tokens=False)
            ids += head + body
            mask += [0] * len(head) + [1] * len(body)
        else:
            new = tokenizer.encode(piece, add_special_tokens=False)
            ids += new
            mask += [0] * len(new)
    return ids, mask


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        tools=[CALCULATOR_SCHEMA],
        add_generation_prompt=True,
        tokenize=False,
    )
    return tokenizer.encode(text, add_special_tokens=False)


def corpus(problems: list[dict[str, Any]], seed: int) -> list[list[dict[str, Any]]]:
    """One episode per problem, behaviours drawn in the :data:`CORPUS_MIX` shares (seeded)."""
    rng = random.Random(seed)
    kinds, weights = list(CORPUS_MIX), list(CORPUS_MIX.values())
    return [episode(rng, p, rng.choices(kinds, weights)[0]) for p in problems]


def decode(
    model, tokenizer, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int
) -> list[list[int]]:
    """New token ids for each prompt (up to and without ``<|end|>``), sampled at ``temperature``
    (greedy at 0). Prompts of one length decode as one unpadded batch with a KV cache."""
    import torch

    out: list[list[int]] = [[] for _ in prompts]
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    eos = tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    with torch.no_grad():
        for length in sorted(by_len):
            idx = by_len[length]
            ids = torch.tensor([prompts[i] for i in idx])
            done = torch.zeros(len(idx), dtype=torch.bool)
            new: list[torch.Tensor] = []
            cache = None
            step_ids = ids
            for _ in range(max_new_tokens):
                res = model(input_ids=step_ids, cache=cache, use_cache=True)
                cache = res.cache
                logits = res.logits[:, -1, :].float()
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    probs = torch.softmax(logits / temperature, -1)
                    nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
                nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
                new.append(nxt)
                done |= nxt == eos
                if bool(done.all()):
                    break
                step_ids = nxt[:, None]
            rows = torch.stack(new, 1).tolist() if new else [[] for _ in idx]
            for row, i in zip(rows, idx, strict=True):
                out[i] = row[: row.index(eos)] if eos in row else row
    return out


@dataclass
class ToolUseRates:
    """How sampled first turns split, and how often the whole episode succeeds."""

    #: The canonical call of the problem, character for character.
    correct_call: float
    #: A first turn without ``<tool_call>`` (answered in its head).
    no_call: float
    #: Anything else: broken JSON, unknown tool, mis-copied expression.
    other_call: float
    #: Correct call, then the tool's result as the answer.
    success: float


def tool_use_rates(
    model, tokenizer, problems: list[dict[str, Any]], temperature: float = 1.0, seed: int = 0
) -> ToolUseRates:
    """Sample each problem's episode (the real calculator answers canonical calls) and classify."""
    from astraflow.tasks.calculator import calculator

    prompts = [prompt_ids(tokenizer, p["question"]) for p in problems]
    first = decode(model, tokenizer, prompts, CALL_TOKENS, temperature, seed)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in first]
    correct = [t == call_text(p["question"]) for t, p in zip(texts, problems, strict=True)]
    no_call = sum("<tool_call>" not in t for t in texts)
    follow = [i for i, ok in enumerate(correct) if ok]
    tool_turn = {}
    for i in follow:
        msgs = [
            {"role": "user", "content": problems[i]["question"]},
            {"role": "assistant", "content": texts[i]},
            {"role": "tool", "content": calculator(problems[i]["question"])},
        ]
        text = tokenizer.apply_chat_template(
            msgs, tools=[CALCULATOR_SCHEMA], add_generation_prompt=True, tokenize=False
        )
        tool_turn[i] = tokenizer.encode(text, add_special_tokens=False)
    second = decode(
        model, tokenizer, [tool_turn[i] for i in follow], ANSWER_TOKENS, temperature, seed + 1
    )
    solved = sum(
        tokenizer.decode(ids, skip_special_tokens=True).strip() == problems[i]["answer"]
        for i, ids in zip(follow, second, strict=True)
    )
    n = max(1, len(problems))
    return ToolUseRates(
        correct_call=len(follow) / n,
        no_call=no_call / n,
        other_call=(len(problems) - len(follow) - no_call) / n,
        success=solved / n,
    )


@dataclass
class ToolsBuildResult:
    out_dir: Path
    steps: int
    seed: int
    final_loss: float | None
    #: Sampled (T=1) rates on held-out test problems.
    sampled: ToolUseRates
    #: Greedy rates on the same problems.
    greedy: ToolUseRates
    params: int
    size_bytes: int


def build(
    out_dir: str | Path,
    seed: int = DEFAULT_SEED,
    steps: int = DEFAULT_STEPS,
    on_step: Callable[[int, float], None] | None = None,
    eval_size: int = 200,
    on_check: Callable[[int, ToolUseRates], None] | None = None,
    check_every: int = 0,
) -> ToolsBuildResult:
    """Train and save the tiny tools policy into ``out_dir``; returns its measured rates."""
    import torch

    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tiny_arith.build: reproducible and faster on a shared machine
    torch.use_deterministic_algorithms(True)
    try:
        return _build(out_dir, seed, steps, on_step, eval_size, on_check, check_every)
    finally:
        torch.set_num_threads(previous_threads)


def _build(out_dir, seed, steps, on_step, eval_size, on_check, check_every) -> ToolsBuildResult:
    import torch

    from astraflow.models.tiny_arith import new_model, padded_batches, save, train_step
    from astraflow.models.tokenizer import TOOLS_CHAT_TEMPLATE, build_tokenizer
    from astraflow.tasks import calculator

    tokenizer = build_tokenizer(TOOLS_CHAT_TEMPLATE, MODEL_CONFIG["max_position_embeddings"])
    model = new_model(tokenizer, seed, MODEL_CONFIG)
    final_loss = None
    done_steps = 0
    if steps:
        train = calculator.generate("train", seed=seed, size=BATCH_SIZE * steps)
        encoded = [encode_episode(tokenizer, e) for e in corpus(train, seed)]
        opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            lambda s: min(1.0, (s + 1) / WARMUP_STEPS) * max(0.1, 1 - s / max(1, steps)),
        )
        for step, (ids, labels, attn) in enumerate(
            padded_batches(encoded, tokenizer.pad_token_id, steps, seed, BATCH_SIZE), 1
        ):
            final_loss = train_step(model, opt, sched, ids, labels, attn)
            done_steps = step
            if on_step:
                on_step(step, final_loss)
            if on_check and check_every and step % check_every == 0:
                dev = calculator.generate("train", seed=seed + 1, size=DEV_SIZE)
                on_check(step, tool_use_rates(model, tokenizer, dev, seed=seed))
    model.eval()
    test = calculator.generate("test")[:eval_size]
    sampled = tool_use_rates(model, tokenizer, test, temperature=1.0, seed=seed)
    greedy = tool_use_rates(model, tokenizer, test, temperature=0.0, seed=seed)
    out = save(model, tokenizer, out_dir, TOOLS_CHAT_TEMPLATE, max_new_tokens=CALL_TOKENS)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return ToolsBuildResult(
        out_dir=out,
        steps=done_steps,
        seed=seed,
        final_loss=final_loss,
        sampled=sampled,
        greedy=greedy,
        params=sum(p.numel() for p in model.parameters()),
        size_bytes=size,
    )
