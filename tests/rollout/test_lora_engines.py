"""LoRA adapter policies served by one transformers engine: mixed-adapter batches (peft's
``adapter_names``), per-adapter versions and updates, the base held once and never written."""

from __future__ import annotations

import asyncio

import pytest
import torch

from astraflow.models import resolve_model
from astraflow.models.lora import AdapterSpec, adapter_seed
from astraflow.recipe.schema import AdapterConfig
from astraflow.rollout.engines import SamplingParams, WeightUpdate
from astraflow.rollout.engines.adapters import adapter_engines
from astraflow.rollout.engines.transformers_engine import TransformersEngine
from astraflow.weights.delta import SparseDelta
from astraflow.weights.digest import state_digest

pytest.importorskip("peft")

SPECS = [
    AdapterSpec("solver", AdapterConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), 11),
    AdapterSpec("verifier", AdapterConfig(r=8, alpha=16), 22),
]
FACES = {"solver": "solver", "verifier": "verifier", "frozen": None}


@pytest.fixture(scope="module")
def path() -> str:
    return resolve_model("builtin:tiny-arith")


def trained(engine: TransformersEngine, policy: str, seed: int) -> dict[str, torch.Tensor]:
    """A state of ``policy``'s adapter as training leaves it: A as initialised, B moved."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(v.shape, generator=g) * 0.5 if ".lora_B." in k else v.clone()
        for k, v in engine.adapter_state(policy).items()
    }


def base_digest(engine: TransformersEngine) -> str:
    base = engine.model.get_base_model()
    return state_digest({k: v for k, v in base.state_dict().items() if ".lora_" not in k})


async def _loaded(path: str):
    engine = TransformersEngine(path, device="cpu", seed=0, adapters=SPECS)
    faces = adapter_engines(engine, FACES)
    await faces["solver"].load_weights(WeightUpdate(1, full=trained(engine, "solver", 1)))
    await faces["verifier"].load_weights(WeightUpdate(3, full=trained(engine, "verifier", 3)))
    return engine, faces


def test_one_batch_of_two_adapters_and_the_base_equals_each_alone(path):
    """Requests of two adapters and of the frozen base, decoded together, give the tokens and
    log-probs each gives alone; the adapters really differ from each other and from the base."""

    async def main():
        engine, faces = await _loaded(path)
        prompt = engine.tokenizer("12+34=")["input_ids"]
        params = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=5)
        alone = {name: await face.generate(prompt, params) for name, face in faces.items()}
        prefills = engine.stats["prefills"]
        mixed = await asyncio.gather(*(f.generate(prompt, params) for f in faces.values()))
        together_prefills = engine.stats["prefills"] - prefills
        for face in faces.values():
            await face.close()
        return alone, dict(zip(faces, mixed, strict=True)), together_prefills

    alone, mixed, prefills = asyncio.run(main())
    assert prefills == 1  # the three policies' requests ran as one batch
    for name in FACES:
        for a, m in zip(alone[name], mixed[name], strict=True):
            assert a.token_ids == m.token_ids, name
            torch.testing.assert_close(
                torch.tensor(m.logprobs), torch.tensor(a.logprobs), rtol=0, atol=1e-4
            )
    assert [g.version for g in mixed["solver"]] == [1, 1, 1]
    assert [g.version for g in mixed["verifier"]] == [3, 3, 3]
    assert [g.version for g in mixed["frozen"]] == [0, 0, 0]
    # same prompt, same seeds: only the weights differ between the three
    first = {name: (mixed[name][0].token_ids, mixed[name][0].logprobs) for name in FACES}
    assert len({str(v) for v in first.values()}) == 3, first


def test_an_adapter_generates_as_the_base_with_the_adapter_merged(path, tmp_path):
    """What an adapter serves is the model ``W + scale * B @ A`` (peft's semantics), the model a
    full-model engine would serve from merged weights: same greedy tokens, same log-probs."""
    from transformers import AutoModelForCausalLM

    async def main():
        engine, faces = await _loaded(path)
        state = {k: v.clone() for k, v in engine.adapter_state("solver").items()}
        prompt = engine.tokenizer("7+25=")["input_ids"]
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        got = await asyncio.gather(*(faces[p].generate(prompt, greedy) for p in FACES))
        for face in faces.values():
            await face.close()
        return state, prompt, got[0][0]

    state, prompt, adapter_gen = asyncio.run(main())
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    weights = merged.state_dict()
    scale = SPECS[0].lora.alpha / SPECS[0].lora.r
    for key in state:
        if ".lora_A." in key:
            module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
            b = state[key.replace(".lora_A.", ".lora_B.")]
            weights[f"{module}.weight"] += scale * b @ state[key]
    merged.load_state_dict(weights)
    merged.save_pretrained(tmp_path / "merged")
    merged_tok = TransformersEngine(path, device="cpu").tokenizer
    merged_tok.save_pretrained(tmp_path / "merged")

    async def full():
        engine = TransformersEngine(str(tmp_path / "merged"), device="cpu", seed=0)
        out = await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))
        await engine.close()
        return out[0]

    plain = asyncio.run(full())
    assert adapter_gen.token_ids == plain.token_ids
    torch.testing.assert_close(
        torch.tensor(adapter_gen.logprobs), torch.tensor(plain.logprobs), rtol=0, atol=1e-4
    )


def test_an_adapter_update_waits_only_for_that_adapters_rows(path):
    """While a long verifier generation runs, a solver update applies at once and new solver
    requests carry the new version; a verifier update waits for the verifier's running row,
    which keeps the version it started with."""

    async def main():
        engine, faces = await _loaded(path)
        prompt = engine.tokenizer("1+1=")["input_ids"]
        long = asyncio.create_task(
            faces["verifier"].generate(
                prompt, SamplingParams(temperature=1.0, max_tokens=120, ignore_eos=True, seed=1)
            )
        )
        while not engine.stats["steps"]:  # the long row is decoding
            await asyncio.sleep(0.01)
        await faces["solver"].load_weights(WeightUpdate(2, full=trained(engine, "solver", 2)))
        solver_running = not long.done()
        short = await faces["solver"].generate(prompt, SamplingParams(max_tokens=2, seed=3))
        solver_overtook = not long.done()
        verifier_update = asyncio.create_task(
            faces["verifier"].load_weights(WeightUpdate(4, full=trained(engine, "verifier", 4)))
        )
        finished = await long
        await verifier_update
        after = await faces["verifier"].generate(prompt, SamplingParams(max_tokens=2, seed=3))
        for face in faces.values():
            await face.close()
        return solver_running, solver_overtook, short, finished, after

    solver_running, solver_overtook, short, finished, after = asyncio.run(main())
    assert solver_running and solver_overtook  # no drain of the verifier for a solver update
    assert short[0].version == 2
    assert finished[0].version == 3 and len(finished[0].token_ids) == 120
    assert after[0].version == 4


def test_adapter_deltas_apply_with_digests_per_adapter_and_the_base_is_never_written(path):
    """An adapter's sparse delta (from the store, as a node fetches it) moves that adapter only:
    its digest is the store's, the other adapter and the base stay byte-identical."""

    async def main():
        engine = TransformersEngine(path, device="cpu", seed=0, adapters=SPECS)
        faces = adapter_engines(engine, FACES)
        base_before = base_digest(engine)
        verifier_before = state_digest(engine.adapter_state("verifier"))
        v0 = {k: v.clone() for k, v in engine.adapter_state("solver").items()}
        v1 = trained(engine, "solver", 1)
        d0, d1 = state_digest(v0), state_digest(v1)
        delta = SparseDelta.compute(v0, v1, old_digest=d0, new_digest=d1)
        await faces["solver"].load_weights(WeightUpdate(1, delta=delta, parent=0, digest=d1))
        after = {
            "solver": state_digest(engine.adapter_state("solver")),
            "verifier": state_digest(engine.adapter_state("verifier")),
            "base": base_digest(engine),
            "version": faces["solver"].version,
        }
        with pytest.raises(ValueError, match="delta to version 3 applies on top of version 2"):
            await faces["solver"].load_weights(WeightUpdate(3, delta=delta, parent=2))
        for face in faces.values():
            await face.close()
        return base_before, verifier_before, d1, after

    base_before, verifier_before, d1, after = asyncio.run(main())
    assert after == {"solver": d1, "verifier": verifier_before, "base": base_before, "version": 1}


def test_version_zero_is_the_same_bytes_on_every_engine(path):
    """Adapters start from weights seeded by the run seed and the policy (peft would draw A from
    the global RNG), so a node's version 0 is the trainer's and the first delta applies."""
    specs = [AdapterSpec("solver", AdapterConfig(r=4), adapter_seed(0, "solver"))]
    torch.manual_seed(1)
    one = TransformersEngine(path, device="cpu", adapters=specs)
    torch.manual_seed(2)
    two = TransformersEngine(path, device="cpu", adapters=specs)
    a, b = one.adapter_state("solver"), two.adapter_state("solver")
    assert state_digest(a) == state_digest(b)
    assert all(float(v.abs().sum()) == 0 for k, v in a.items() if ".lora_B." in k)
    assert all(float(v.abs().sum()) > 0 for k, v in a.items() if ".lora_A." in k)
    other = TransformersEngine(
        path, device="cpu", adapters=[AdapterSpec("solver", AdapterConfig(r=4), 7)]
    )
    assert state_digest(other.adapter_state("solver")) != state_digest(a)
    for engine in (one, two, other):
        asyncio.run(engine.close())


def test_wrong_adapter_requests_are_refused_by_name(path):
    async def main():
        engine = TransformersEngine(path, device="cpu", adapters=SPECS[:1])
        prompt = engine.tokenizer("1+1=")["input_ids"]
        with pytest.raises(ValueError, match="serves no adapter 'critic'; it serves solver"):
            await engine.generate(prompt, SamplingParams(max_tokens=1), adapter="critic")
        with pytest.raises(ValueError, match="an update names its adapter"):
            await engine.load_weights(WeightUpdate(1, full={}))
        face = adapter_engines(engine, {"frozen": None})["frozen"]
        with pytest.raises(ValueError, match="frozen"):
            await face.load_weights(WeightUpdate(1, full={}))
        await face.close()

    asyncio.run(main())
