"""The built-in transformers engine: batching, log-probs, stop conditions, weight versions."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from tiny_random_model import build_random_tiny_model

from astraflow.rollout.engines import SamplingParams, WeightUpdate, make_engine
from astraflow.rollout.engines.transformers_engine import TransformersEngine
from astraflow.rollout.engines.weight_apply import WeightUpdateError

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_random_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """Same architecture, different weights: the source of the 'new version' in update tests."""
    return build_random_tiny_model(tmp_path_factory.mktemp("tiny2") / "model", seed=1)


def run(coro):
    return asyncio.run(coro)


def prompts_for(engine, count):
    return [engine.tokenizer.encode(f"{i * 7 % 50}+{i}=" + "x" * (i % 5)) for i in range(count)]


def test_concurrent_greedy_equals_one_at_a_time(model_dir):
    async def main():
        engine = TransformersEngine(str(model_dir), max_batch_size=16)
        prompts = prompts_for(engine, 40)
        alone = [(await engine.generate(p, GREEDY))[0] for p in prompts]
        steps_alone = engine.stats["steps"]
        together = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])
        steps_together = engine.stats["steps"] - steps_alone
        await engine.close()
        return alone, [t[0] for t in together], steps_alone, steps_together

    alone, together, steps_alone, steps_together = run(main())
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    # Batching really happened: far fewer forward passes than one request at a time.
    assert steps_together < steps_alone / 3
    assert {g.finish_reason for g in alone} == {"stop", "length"}  # both paths exercised


def test_requests_join_a_running_batch(model_dir):
    """A request arriving mid-decode joins the running rows and still decodes exactly."""

    async def main():
        engine = TransformersEngine(str(model_dir))
        prompts = prompts_for(engine, 6)
        long = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
        alone = [(await engine.generate(p, long))[0] for p in prompts]
        first = asyncio.ensure_future(engine.generate(prompts[0], long))
        while engine.stats["tokens"] < sum(len(a.token_ids) for a in alone) + 10:
            await asyncio.sleep(0.001)
        late = await asyncio.gather(*[engine.generate(p, long) for p in prompts[1:]])
        early = await first
        await engine.close()
        return alone, [early[0]] + [g[0] for g in late]

    alone, joined = run(main())
    for a, b in zip(alone, joined, strict=True):
        assert a.token_ids == b.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert len(b.token_ids) == 60 and b.finish_reason == "length"


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_a_trainer_forward_pass(model_dir, temperature, trainer_logprobs):
    async def main():
        engine = TransformersEngine(str(model_dir), seed=3)
        prompts = prompts_for(engine, 8)
        params = SamplingParams(temperature=temperature, top_p=0.9, max_tokens=30)
        outs = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
        await engine.close()
        return engine.model, prompts, [o[0] for o in outs]

    model, prompts, outs = run(main())
    for prompt, gen in zip(prompts, outs, strict=True):
        expected = trainer_logprobs(model, prompt, gen.token_ids, temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4), (
            gen.logprobs,
            expected.tolist(),
        )


def tok_decode(ids, model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).decode(ids)


def test_stop_conditions(model_dir):
    async def main():
        engine = TransformersEngine(str(model_dir))
        tok = engine.tokenizer
        prompt = tok.encode("3+4=")
        base = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        free = (await engine.generate(prompt, base))[0]
        special = set(tok.all_special_ids)
        plain = [i for i in range(2, 30) if not special & set(free.token_ids[i : i + 2])]
        third = free.token_ids[plain[0]]
        by_id = (await engine.generate(prompt, dataclasses.replace(base, stop_token_ids=(third,))))[
            0
        ]
        stop_text = tok.decode(free.token_ids[plain[1] : plain[1] + 2])
        by_text = (await engine.generate(prompt, dataclasses.replace(base, stop=(stop_text,))))[0]
        short = (await engine.generate(prompt, dataclasses.replace(base, max_tokens=3)))[0]
        await engine.close()
        return free, third, by_id, stop_text, by_text, short

    free, third, by_id, stop_text, by_text, short = run(main())
    first_third = free.token_ids.index(third)
    assert by_id.token_ids == free.token_ids[: first_third + 1]
    assert by_id.finish_reason == "stop" and by_id.meta["stop"] == third
    assert by_text.finish_reason == "stop" and by_text.meta["stop"] == stop_text
    assert stop_text in tok_decode(by_text.token_ids, model_dir)
    assert stop_text not in tok_decode(by_text.token_ids[:-1], model_dir)
    assert by_text.token_ids == free.token_ids[: len(by_text.token_ids)]
    assert short.token_ids == free.token_ids[:3] and short.finish_reason == "length"
    assert len(free.token_ids) == 40


def test_eos_ends_a_completion_and_is_kept(model_dir):
    async def main():
        engine = TransformersEngine(str(model_dir))
        outs = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts_for(engine, 40)])
        await engine.close()
        return engine.tokenizer.eos_token_id, [o[0] for o in outs]

    eos, outs = run(main())
    stopped = [g for g in outs if g.finish_reason == "stop"]
    assert stopped, "the tiny model never emitted eos; pick other prompts"
    for g in stopped:
        assert g.token_ids[-1] == eos and eos not in g.token_ids[:-1]
    for g in outs:
        if g.finish_reason == "length":
            assert len(g.token_ids) == GREEDY.max_tokens and eos not in g.token_ids


def test_n_completions_and_seeds(model_dir):
    async def main():
        engine = TransformersEngine(str(model_dir))
        prompt = engine.tokenizer.encode("12+30=")
        params = SamplingParams(n=6, temperature=1.0, max_tokens=12, seed=7)
        a = await engine.generate(prompt, params)
        b = await engine.generate(prompt, params)
        greedy = await engine.generate(prompt, SamplingParams(n=3, temperature=0, max_tokens=12))
        await engine.close()
        return a, b, greedy

    a, b, greedy = run(main())
    assert len(a) == 6
    assert len({tuple(g.token_ids) for g in a}) > 1  # the n samples differ
    assert [g.token_ids for g in a] == [g.token_ids for g in b]  # a seed reproduces them
    assert len({tuple(g.token_ids) for g in greedy}) == 1


def _full_update(src_dir, version):
    from safetensors.torch import load_file

    return WeightUpdate(version=version, full=load_file(str(src_dir / "model.safetensors")))


def test_full_update_changes_outputs_and_version(model_dir, other_model_dir):
    async def main():
        old = TransformersEngine(str(model_dir))
        new = TransformersEngine(str(other_model_dir))
        prompts = prompts_for(old, 12)
        before = await asyncio.gather(*[old.generate(p, GREEDY) for p in prompts])
        reference = await asyncio.gather(*[new.generate(p, GREEDY) for p in prompts])
        # Start a wave of requests, then ask for the update while they run.
        prefills = old.stats["prefills"]
        wave = [asyncio.ensure_future(old.generate(p, GREEDY)) for p in prompts]
        while old.stats["prefills"] == prefills:  # wait until the wave is decoding
            await asyncio.sleep(0.001)
        update = asyncio.ensure_future(old.load_weights(_full_update(other_model_dir, 1)))
        after = await asyncio.gather(*[old.generate(p, GREEDY) for p in prompts])
        in_flight = await asyncio.gather(*wave)
        await update
        await old.close()
        await new.close()
        return before, reference, in_flight, after, old.version

    before, reference, in_flight, after, version = run(main())
    assert version == 1
    assert all(g[0].version == 0 for g in before)
    # Each generation matches the weights its version tag names: never a mix. Requests admitted
    # before the update finish on the old weights (tag 0) ...
    for b, r, f in zip(before, reference, in_flight, strict=True):
        assert f[0].token_ids == (b if f[0].version == 0 else r)[0].token_ids
    assert any(f[0].version == 0 for f in in_flight)
    # ... requests after it run entirely on the new weights, tagged 1.
    for r, a in zip(reference, after, strict=True):
        assert a[0].version == 1 and a[0].token_ids == r[0].token_ids
        assert a[0].logprobs == pytest.approx(r[0].logprobs, abs=1e-4)
    assert any(b[0].token_ids != a[0].token_ids for b, a in zip(before, after, strict=True))


def _make_delta(old_state, new_state):
    from astraflow.weights import SparseDelta

    return SparseDelta.compute(old_state, new_state)


def test_delta_update_is_applied_in_place(model_dir, other_model_dir, trainer_logprobs):
    from safetensors.torch import load_file

    old_state = load_file(str(model_dir / "model.safetensors"))
    new_state = {k: v.clone() for k, v in old_state.items()}
    # Change a sparse subset of the weights (what an optimizer step on a few rows looks like).
    for name in list(new_state)[::3]:
        flat = new_state[name].view(-1)
        flat[:: max(1, flat.numel() // 50)] += 0.5
    delta = _make_delta(old_state, new_state)

    async def main():
        engine = TransformersEngine(str(model_dir))
        prompts = prompts_for(engine, 8)
        before = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])
        with pytest.raises(WeightUpdateError, match="version 5"):
            await engine.load_weights(WeightUpdate(version=6, delta=delta, parent=5))
        await engine.load_weights(WeightUpdate(version=1, delta=delta, parent=0))
        after = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])
        state = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
        await engine.close()
        return prompts, engine.model, before, after, state

    prompts, model, before, after, state = run(main())
    for name, value in new_state.items():
        assert torch.equal(state[name], value), name
    assert all(a[0].version == 1 for a in after) and all(b[0].version == 0 for b in before)
    assert any(b[0].token_ids != a[0].token_ids for b, a in zip(before, after, strict=True))
    for prompt, gen in zip(prompts, after, strict=True):
        expected = trainer_logprobs(model, prompt, gen[0].token_ids, 0.0)
        assert torch.allclose(torch.tensor(gen[0].logprobs), expected, atol=1e-4)


def test_bad_inputs_are_rejected_clearly(model_dir):
    async def main():
        engine = make_engine("transformers", str(model_dir))
        with pytest.raises(TypeError, match="list of token ids"):
            await engine.generate("1+1=", GREEDY)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await engine.generate([1, 10_000], GREEDY)
        with pytest.raises(ValueError, match="empty"):
            await engine.generate([], GREEDY)
        with pytest.raises(WeightUpdateError, match="does not have"):
            await engine.load_weights(WeightUpdate(version=1, full={"nope": torch.zeros(1)}))
        with pytest.raises(WeightUpdateError, match="exactly one"):
            await engine.load_weights(WeightUpdate(version=1))
        assert engine.version == 0
        # The engine still serves after rejecting bad input.
        ok = await engine.generate([4, 5, 6], SamplingParams(temperature=0, max_tokens=2))
        await engine.close()
        return ok

    assert len(run(main())[0].token_ids) <= 2
    with pytest.raises(FileNotFoundError, match="config.json"):
        TransformersEngine("/nonexistent/model")
    with pytest.raises(ValueError, match="unknown engine kind"):
        make_engine("tgi", str(model_dir))


def test_builtin_tiny_arith_model_generates(trainer_logprobs):
    from astraflow.models import resolve_model

    try:
        path = resolve_model("builtin:tiny-arith")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"builtin:tiny-arith not available: {exc}")

    async def main():
        engine = TransformersEngine(str(path))
        tok = engine.tokenizer
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "12+30"}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
            prompt = prompt["input_ids"]
        outs = await engine.generate(
            list(prompt), SamplingParams(n=4, temperature=1.0, max_tokens=16)
        )
        await engine.close()
        return engine.model, list(prompt), outs

    model, prompt, outs = run(main())
    assert len(outs) == 4
    for gen in outs:
        expected = trainer_logprobs(model, prompt, gen.token_ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)


def test_cancelled_request_leaves_and_close_fails_pending(model_dir):
    from astraflow.rollout.engines.transformers_engine import EngineClosedError

    async def main():
        engine = TransformersEngine(str(model_dir))
        prompts = prompts_for(engine, 3)
        endless = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        doomed = asyncio.ensure_future(engine.generate(prompts[0], endless))
        while engine.stats["steps"] < 3:
            await asyncio.sleep(0.001)
        doomed.cancel()
        # The engine keeps serving others after a caller gave up.
        ok = await engine.generate(prompts[1], SamplingParams(temperature=0, max_tokens=5))
        steps = engine.stats["steps"]
        assert steps < 300  # the cancelled row left the batch instead of running to 400 tokens
        pending = asyncio.ensure_future(engine.generate(prompts[2], endless))
        while engine.stats["steps"] == steps:
            await asyncio.sleep(0.001)
        await engine.close()
        with pytest.raises(EngineClosedError):
            await pending
        with pytest.raises(EngineClosedError):
            await engine.generate(prompts[2], endless)
        return ok

    assert len(run(main())[0].token_ids) <= 5


def test_identical_prompts_are_prefilled_once(model_dir):
    """A group's repeated prompt runs through the model once, and every row gets exactly the cache
    and logits a prefill of its prompt alone would give."""
    from transformers import AutoModelForCausalLM

    from astraflow.rollout.engines.continuous_batch import CausalLMRunner, DecodeState, SequenceRow
    from astraflow.rollout.engines.sampling import RowSampling

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    runner = CausalLMRunner(model)
    cpu = torch.device("cpu")

    def prefill(prompts):
        rows = [SequenceRow(None, i, len(p), 8, frozenset(), ()) for i, p in enumerate(prompts)]
        sampling = RowSampling.build([1.0] * len(rows), [1.0] * len(rows), [None] * len(rows), cpu)
        with torch.no_grad():
            return DecodeState.prefill(runner, prompts, rows, sampling, 0, cpu)

    a, b = [5, 9, 13, 2, 7], [4, 4, 11]
    batch_rows = []
    hook = model.register_forward_hook(
        lambda _m, _a, kwargs, _o: batch_rows.append(kwargs["input_ids"].shape[0]),
        with_kwargs=True,
    )
    state, logits = prefill([a, b, a, a])
    hook.remove()
    assert batch_rows == [2]  # two distinct prompts, one forward
    assert len(state) == 4 and state.next_pos.tolist() == [5, 3, 5, 5]
    for row, prompt in enumerate([a, b, a, a]):
        alone, alone_logits = prefill([prompt])
        assert torch.allclose(logits[row], alone_logits[0], atol=1e-5)
        pad = state.mask.shape[1] - len(prompt)
        assert state.mask[row].tolist() == [0] * pad + [1] * len(prompt)
        for mine, ref in zip(state.cache.layers, alone.cache.layers, strict=True):
            assert torch.allclose(mine.keys[row, :, pad:], ref.keys[0], atol=1e-5)
            assert torch.allclose(mine.values[row, :, pad:], ref.values[0], atol=1e-5)


def test_waiting_requests_are_served_by_priority(model_dir):
    """With every decode row busy, a waiting request of lower ``priority`` (the node sets when its
    group started) goes first, whatever its arrival order: the oldest groups finish first."""

    async def main():
        engine = TransformersEngine(str(model_dir), max_batch_size=1)
        prompt = prompts_for(engine, 1)[0]
        long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        blocker = asyncio.ensure_future(engine.generate(prompt, long))
        while engine.stats["tokens"] == 0:  # the blocker holds the only row
            await asyncio.sleep(0.001)
        finished: list[float] = []

        async def one(priority: float):
            await engine.generate(prompt, dataclasses.replace(GREEDY, priority=priority))
            finished.append(priority)

        await asyncio.gather(*(one(p) for p in (5.0, 1.0, 3.0, 2.0)))
        await blocker
        await engine.close()
        return finished

    assert run(main()) == [1.0, 2.0, 3.0, 5.0]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)"
)
def test_generate_and_delta_update_on_cuda(model_dir, other_model_dir, trainer_logprobs):
    """The same engine code on a GPU: the model sits on CUDA, greedy completions carry the
    log-probs a CPU forward pass computes, and a delta lands bit-exact in the CUDA weights."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    old_state = load_file(str(model_dir / "model.safetensors"))
    new_state = load_file(str(other_model_dir / "model.safetensors"))
    delta = _make_delta(old_state, new_state)

    async def main():
        engine = TransformersEngine(str(model_dir), device="cuda", seed=0)
        prompts = prompts_for(engine, 8)
        before = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])
        await engine.load_weights(WeightUpdate(version=1, delta=delta, parent=0))
        after = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])
        devices = {p.device.type for p in engine.model.parameters()}
        state = {k: v.detach().cpu() for k, v in engine.model.state_dict().items()}
        await engine.close()
        return prompts, before, after, devices, state

    prompts, before, after, devices, state = run(main())
    assert devices == {"cuda"}
    for name, value in new_state.items():
        assert torch.equal(state[name], value), name
    assert all(b[0].version == 0 for b in before) and all(a[0].version == 1 for a in after)
    for src, gens in ((model_dir, before), (other_model_dir, after)):
        cpu_model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        for prompt, gen in zip(prompts, gens, strict=True):
            assert gen[0].token_ids, "an empty completion"
            expected = trainer_logprobs(cpu_model, prompt, gen[0].token_ids, 0.0)
            assert torch.allclose(torch.tensor(gen[0].logprobs), expected, atol=1e-3)
