"""Engine arguments are declared per engine kind (astraflow/rollout/engines/args.py) and checked:
a misspelt or ill-typed key is refused by the recipe loader, `recipe check` and `make_engine` with
the key, the engine and the accepted keys, and every declared vLLM argument reaches the vLLM
server's command line (a declared setting that did nothing would be a silent no-op).

Why: every vLLM policy of recipes/gpu set ``gpu_memory_utilization``, which the engine did not
take: `recipe check` passed and every rollout node crashed at start with a TypeError."""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.engine_kinds import ENGINE_KINDS
from astraflow.recipe import RecipeError, load_recipe
from astraflow.rollout.engines import make_engine
from astraflow.rollout.engines.args import (
    ENGINE_ARGS,
    VLLM_SERVER_FLAGS,
    EngineArgsError,
    VllmEngineArgs,
    accepted_args,
    parse_engine_args,
)
from astraflow.rollout.engines.vllm_engine import vllm_server_command

FAKE = Path(__file__).with_name("fake_vllm_server.py")

RECIPE = """
[policies.policy]
model = "builtin:tiny-arith"
engine = "vllm"
engine_args = {ARGS}
[tasks]
env = "astraflow/Arith-v0"
sets = [{ name = "arith" }]
"""

#: a non-default value of every declared vLLM server argument, and what it must become on the
#: server's command line
SERVER_SETTINGS = {
    "dtype": ("bfloat16", ["--dtype", "bfloat16"]),
    "max_model_len": (3072, ["--max-model-len", "3072"]),
    "gpu_memory_utilization": (0.35, ["--gpu-memory-utilization", "0.35"]),
    "tensor_parallel_size": (2, ["--tensor-parallel-size", "2"]),
    "enable_prefix_caching": (True, ["--enable-prefix-caching"]),
    "max_num_seqs": (48, ["--max-num-seqs", "48"]),
    "quantization": ("fp8", ["--quantization", "fp8"]),
    "enforce_eager": (True, ["--enforce-eager"]),
}


def _recipe(tmp_path: Path, args: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.replace("{ARGS}", args))
    return path


def _has_run(argv: list[str], run: list[str]) -> bool:
    return any(argv[i : i + len(run)] == run for i in range(len(argv)))


# -- declarations ---------------------------------------------------------------------------------
def test_every_engine_kind_declares_its_constructor_arguments():
    """The declared arguments are the constructors' user-settable ones, both ways: a declared key
    the constructor lacked would be the old TypeError, an undeclared one unreachable."""
    from astraflow.rollout.engines.openai_engine import OpenAIEngine
    from astraflow.rollout.engines.transformers_engine import TransformersEngine
    from astraflow.rollout.engines.vllm_engine import VllmEngine

    assert tuple(ENGINE_ARGS) == ENGINE_KINDS
    constructors = {"transformers": TransformersEngine, "vllm": VllmEngine, "openai": OpenAIEngine}
    # set by the caller (make_engine), not the user; extra_args: extra_server_args' older name
    not_user = {"self", "model", "version", "adapters", "extra_args"}
    for kind, cls in constructors.items():
        params = set(inspect.signature(cls.__init__).parameters) - not_user
        assert set(ENGINE_ARGS[kind].model_fields) == params, kind


def test_the_required_vllm_flags_are_declared():
    wanted = {"gpu_memory_utilization", "tensor_parallel_size", "max_model_len", "dtype",
              "enable_prefix_caching", "max_num_seqs", "quantization", "enforce_eager"}  # fmt: skip
    assert wanted <= set(VLLM_SERVER_FLAGS) <= set(VllmEngineArgs.model_fields)
    assert set(SERVER_SETTINGS) == set(VLLM_SERVER_FLAGS)  # a new flag needs its case here
    assert "extra_server_args" in accepted_args("vllm")


# -- refusals ---------------------------------------------------------------------------------------
def test_a_misspelt_key_is_refused_with_the_key_the_engine_and_the_accepted_keys(tmp_path):
    path = _recipe(tmp_path, "{ gpu_memory_utlization = 0.45 }")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    text = str(info.value)
    assert "policies.policy.engine_args.gpu_memory_utlization" in text
    assert "not an argument of the vllm engine" in text
    assert "did you mean gpu_memory_utilization?" in text
    assert "accepted: " + ", ".join(accepted_args("vllm")) in text

    result = CliRunner().invoke(_cli(), ["recipe", "check", "--no-tasks", str(path)])
    out = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "policies.policy.engine_args.gpu_memory_utlization" in out
    assert "not an argument of the vllm engine" in out


@pytest.mark.parametrize(
    ("args", "key", "expected"),
    [
        ('{ gpu_memory_utilization = "high" }', "gpu_memory_utilization", "a valid number"),
        ("{ gpu_memory_utilization = 1.5 }", "gpu_memory_utilization", "less than or equal to 1"),
        ("{ tensor_parallel_size = 0 }", "tensor_parallel_size", "greater than or equal to 1"),
        ('{ max_model_len = "long" }', "max_model_len", "a valid integer"),
        ('{ dtype = "int4" }', "dtype", "'auto', 'half'"),
        ('{ extra_server_args = "--swap-space 8" }', "extra_server_args", "a valid list"),
    ],
)
def test_an_ill_typed_value_is_refused_with_the_key_and_the_engine(tmp_path, args, key, expected):
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tmp_path, args))
    line = next(ln for ln in str(info.value).splitlines() if "engine_args" in ln)
    assert f"policies.policy.engine_args.{key}: got " in line
    assert expected in line and "(vllm engine)" in line


def test_settings_that_would_do_nothing_or_contradict_are_refused(tmp_path):
    cases = {
        # a server flag on an engine that attaches to a running server acts nowhere
        '{ base_url = "http://gpu:8000", gpu_memory_utilization = 0.5 }': (
            "gpu_memory_utilization act only on a server the engine starts"
        ),
        # a declared flag passed through as well: two values, one of them unchecked
        '{ max_model_len = 2048, extra_server_args = ["--max-model-len", "4096"] }': (
            "extra_server_args has --max-model-len: set engine_args.max_model_len instead"
        ),
        '{ extra_server_args = ["--port=9"] }': "--port, which the engine sets itself",
    }
    for args, message in cases.items():
        with pytest.raises(RecipeError, match="policies.policy.engine_args") as info:
            load_recipe(_recipe(tmp_path, args))
        assert message in str(info.value), args


def test_other_engines_are_checked_too(tmp_path):
    text = RECIPE.replace('engine = "vllm"', 'engine = "transformers"')
    (tmp_path / "t.toml").write_text(text.replace("{ARGS}", "{ max_batch_size = 0 }"))
    with pytest.raises(RecipeError, match="max_batch_size: got 0; .*transformers engine"):
        load_recipe(tmp_path / "t.toml")
    judge = (
        '[policies.judge]\nmodel = "gpt-4o"\nengine = "openai"\ntrainable = false\n'
        "engine_args = {ARGS}\n"
    )
    (tmp_path / "o.toml").write_text(RECIPE.replace("{ARGS}", "{}") + judge.replace("{ARGS}", "{}"))
    with pytest.raises(RecipeError, match="judge.engine_args.base_url: .*required by the openai"):
        load_recipe(tmp_path / "o.toml")


def test_valid_arguments_load_and_render_back_as_written(tmp_path):
    from astraflow.recipe import recipe_to_toml

    recipe = load_recipe(_recipe(tmp_path, "{ gpu_memory_utilization = 0.45, max_num_seqs = 64 }"))
    args = recipe.policies["policy"].engine_args
    assert args == {"gpu_memory_utilization": 0.45, "max_num_seqs": 64}  # no defaults added
    assert "max_num_seqs = 64" in recipe_to_toml(recipe)
    assert parse_engine_args("vllm", args).tensor_parallel_size is None


def test_make_engine_refuses_before_loading_anything():
    """``astraflow serve policy`` / ``astraflow eval`` ``--engine-arg`` reach make_engine."""
    with pytest.raises(EngineArgsError) as info:
        make_engine("transformers", "builtin:tiny-arith", gpu_memory_utilization=0.5)
    assert "gpu_memory_utilization" in str(info.value)
    assert "not an argument of the transformers engine" in str(info.value)
    assert "accepted: attn_implementation, device, dtype" in str(info.value)


# -- what the declared vLLM arguments become -------------------------------------------------------
def test_each_declared_vllm_argument_reaches_the_server_command_line():
    settings = {key: value for key, (value, _) in SERVER_SETTINGS.items()}
    args = VllmEngineArgs(**settings, extra_server_args=["--swap-space", "8"])
    server = args.model_dump(include={*VLLM_SERVER_FLAGS, "extra_server_args"})
    argv = vllm_server_command("py", "/m", host="127.0.0.1", port=8001, **server)
    for key, (_, run) in SERVER_SETTINGS.items():
        assert _has_run(argv, run), (key, argv)
    assert argv[-2:] == ["--swap-space", "8"]  # the pass-through comes last, as written
    # and None leaves vLLM its default: no flag at all
    bare = vllm_server_command("py", "/m", host="127.0.0.1", port=8001)
    assert not {"--gpu-memory-utilization", "--tensor-parallel-size", "--enforce-eager"} & set(bare)
    off = vllm_server_command("py", "/m", host="h", port=1, enable_prefix_caching=False)
    assert "--no-enable-prefix-caching" in off


def test_a_recipes_vllm_arguments_reach_the_server_a_node_starts(tmp_path, monkeypatch):
    """From the recipe through the rollout node's engine factory to the server's argv (the
    server is a recording stand-in started exactly as vLLM is)."""
    from astraflow.rollout.main import NodeOptions, build_policies

    record = tmp_path / "record.jsonl"
    settings = {key: value for key, (value, _) in SERVER_SETTINGS.items()}
    settings |= {"python": str(FAKE), "workdir": str(tmp_path / "work"), "startup_timeout": 60,
                 "env": {"FAKE_VLLM_RECORD": str(record)}}  # fmt: skip
    recipe = load_recipe(_recipe(tmp_path, json.dumps(settings).replace('": ', '" = ')))
    engine = build_policies(recipe, NodeOptions(join="http://unused", token="t"))["policy"].engine

    async def started() -> None:
        try:
            await engine.wait_ready()
        finally:
            await engine.close()

    asyncio.run(started())
    argv = json.loads(record.read_text().splitlines()[0])["argv"]
    for key, (_, run) in SERVER_SETTINGS.items():
        assert _has_run(argv, run), (key, argv)


def _cli():
    from astraflow.cli.main import app

    return app
