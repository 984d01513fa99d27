"""Recipe keys of LoRA adapter policies (``policies.NAME.base`` + ``lora``): what groups them into
engines and trainer processes, and the errors that name the key and the fix."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from astraflow.launch.trainer_command import (
    trainer_argv,
    trainer_service_name,
    trainer_service_policy,
)
from astraflow.recipe import RecipeError, load_recipe
from astraflow.recipe.loader import recipe_from_dict, recipe_to_toml

ROOT = Path(__file__).resolve().parents[2]
LORA_RECIPE = ROOT / "recipes" / "multi_policy_lora.toml"


def recipe(policies: dict, roles: dict | None = None, **extra):
    roles = roles or {name: name for name in policies}
    return recipe_from_dict({"policies": policies, "workflow": {"roles": roles}, **extra})


def test_the_lora_recipe_has_two_adapters_of_one_base_in_one_trainer_process():
    r = load_recipe(LORA_RECIPE)
    assert r.adapter_groups() == {"builtin:tiny-arith": ["solver", "verifier"]}
    assert r.trainer_processes() == [("solver", "verifier")]
    assert r.model_of("verifier") == "builtin:tiny-arith"
    assert r.policies["solver"].model is None and r.policies["solver"].lora.shared_trainer
    # the resolved recipe a run writes loads back to the same recipe
    assert recipe_from_dict(tomllib.loads(recipe_to_toml(r))) == r


def test_processes_group_shared_adapters_by_base_and_keep_full_policies_apart():
    r = recipe({
        "judge": {"model": "builtin:tiny-arith", "trainable": False},
        "full": {"model": "builtin:tiny-arith"},
        "a": {"base": "builtin:tiny-arith"},
        "b": {"base": "judge", "lora": {"r": 4}},
        "c": {"base": "builtin:tiny-arith", "lora": {"shared_trainer": False}},
        "d": {"base": "builtin:tiny-arith"},
        "e": {"base": "judge"},
    })  # fmt: skip
    assert r.trainer_processes() == [("full",), ("a", "d"), ("b", "e"), ("c",)]
    assert r.adapter_groups() == {"builtin:tiny-arith": ["a", "c", "d"], "judge": ["b", "e"]}
    assert r.model_of("b") == "builtin:tiny-arith"
    assert r.policies["a"].lora.r == 8  # the default adapter when base comes without lora
    assert trainer_service_name(r, "d") == "trainer-a+d"
    assert trainer_service_policy("trainer-a+d") == "a"
    argv = trainer_argv(r, Path("r.toml"), "d", "http://h:1", Path("run"))
    assert [argv[i + 1] for i, x in enumerate(argv) if x == "--policy"] == ["a", "d"]


@pytest.mark.parametrize(
    "policies, message",
    [
        ({"a": {}}, r"needs model = .* or base = "),
        ({"a": {"model": "m", "base": "m"}}, r"gives both model .* and base"),
        ({"a": {"model": "m", "lora": {"r": 4}}}, r"lora is set but base is not.*trainer\.lora"),
        ({"a": {"base": "m", "trainer": {"lora": {}}}}, r"already LoRA: configure it in lora"),
        ({"a": {"base": "m", "engine": "openai"}}, r"engine = 'openai' cannot serve a LoRA"),
        ({"a": {"base": "m", "trainable": False}}, r"trainable = false never leaves"),
        ({"a": {"base": "b"}, "b": {"model": "m"}}, r"policies\.b\.trainable = false"),
        ({"a": {"base": "b"}, "b": {"base": "m"}}, r"itself an adapter of 'm'.*set base = 'm'"),
        (
            {"a": {"base": "m", "engine": "vllm"}, "b": {"base": "m"}},
            r"policies\.b\.engine = 'transformers' but policies\.a\.engine = 'vllm'",
        ),
        (
            {"a": {"base": "m", "trainer": {"processes": 2}}, "b": {"base": "m"}},
            r"policies\.a\.lora\.shared_trainer = false",
        ),
        (
            {"a": {"base": "m", "trainer": {"dtype": "float32"}}, "b": {"base": "m"}},
            r"trainer\.dtype differs between a, b",
        ),
    ],
)
def test_bad_adapter_recipes_name_the_key_and_the_fix(policies, message):
    with pytest.raises(RecipeError, match=message):
        recipe(policies, roles={"x": next(iter(policies))})


def test_ray_placement_of_a_shared_trainer_is_its_first_policy():
    with pytest.raises(RecipeError, match=r"place that process with \[ray\.trainers\.a\]"):
        recipe({"a": {"base": "m"}, "b": {"base": "m"}}, ray={"trainers": {"b": {}}})
    assert recipe({"a": {"base": "m"}, "b": {"base": "m"}}, ray={"trainers": {"a": {}}})


def test_a_local_base_path_resolves_against_the_recipe_folder(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "r.toml").write_text(
        '[policies.a]\nbase = "ckpt"\n[policies.judge]\nmodel = "ckpt"\ntrainable = false\n'
        '[policies.b]\nbase = "judge"\n[workflow]\nroles = { x = "a", y = "b" }\n'
    )
    r = load_recipe(tmp_path / "r.toml")
    assert r.policies["a"].base == str(tmp_path / "ckpt")
    assert r.policies["b"].base == "judge"  # a policy's name is no path


def test_an_adapter_policy_s_transcripts_decode_with_its_base_tokenizer():
    from astraflow.launch.transcripts import Decoders
    from astraflow.models import load_tokenizer

    ids = load_tokenizer("builtin:tiny-arith")("12+30=42")["input_ids"]
    decode = Decoders(load_recipe(LORA_RECIPE)).for_policy("verifier")
    assert decode(ids) == "12+30=42"  # text, not the ids a decoder without a model shows
