"""The checks `astraflow recipe check` prints and `astraflow train` runs before starting anything
(astraflow/recipe/preflight.py): every GPU recipe passes them except for what a machine lacks
(a model not in the local Hugging Face cache, a data folder), each named with what to do; a hub id
is found in the local cache and nothing is downloaded.

The HF cache is a temporary folder in each test (empty, or holding stand-in snapshots), so what
this machine happens to have cached changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.recipe import load_recipe
from astraflow.recipe.preflight import (
    ABSENT_KINDS,
    PreflightError,
    preflight,
    preflight_or_raise,
)
from astraflow.rollout.engines.local_models import ModelNotCached, local_checkpoint

ROOT = Path(__file__).resolve().parents[2]
GPU_RECIPES = sorted((ROOT / "recipes" / "gpu").glob("*.toml"))
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache that huggingface_hub reads instead of the machine's."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def cache_model(cache: Path, repo_id: str, weights: bool = True) -> Path:
    """A snapshot of ``repo_id`` laid out as huggingface_hub writes one (refs/main -> commit)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    if weights:
        (snapshot / "model.safetensors").write_bytes(b"stand-in")
    return snapshot


def gpu_models() -> set[str]:
    return {
        p.model
        for path in GPU_RECIPES
        for p in load_recipe(path).policies.values()
        if p.model and p.engine != "openai"
    }


def test_the_gpu_recipes_fail_only_for_what_this_machine_lacks(hf_cache):
    """Nothing cached: each recipe's only problems are its models (with the download command)
    and data absent here (with the variable that points at it)."""
    assert len(GPU_RECIPES) >= 9
    for path in GPU_RECIPES:
        report = preflight(load_recipe(path), path)
        assert report.problems, path  # the models at least are not in an empty cache
        for problem in report.problems:
            assert problem.kind in ABSENT_KINDS, (path.name, str(problem))
            if problem.kind == "model_missing":
                model = load_recipe(path).policies[problem.where.split(".")[1]].model
                assert "not in the local Hugging Face cache" in problem.message
                assert f"hf download {model}" in problem.message
                assert f"huggingface-cli download {model}" in problem.message
            else:
                assert "ASTRAFLOW_" in problem.message, str(problem)


def test_the_gpu_recipes_pass_once_their_models_are_cached(hf_cache):
    for model in gpu_models():
        cache_model(hf_cache, model)
    for path in GPU_RECIPES:
        report = preflight(load_recipe(path), path)
        # data may be absent on this machine; nothing else may be wrong
        assert [p.kind for p in report.problems if p.kind != "data_missing"] == [], path
    result = CliRunner().invoke(_cli(), ["recipe", "check", *map(str, GPU_RECIPES)])
    absent = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert all("ASTRAFLOW_" in ln for ln in absent), absent
    assert result.output.count("ok ") == len(GPU_RECIPES) - len({ln.split(":")[1] for ln in absent})


def test_absent_data_is_named_with_where_it_was_looked_for(hf_cache, tmp_path, monkeypatch):
    empty = tmp_path / "no-data"
    empty.mkdir()
    monkeypatch.setenv("ASTRAFLOW_DATA_DIR", str(empty))
    monkeypatch.setenv("ASTRAFLOW_AGENTBENCH_DATA", str(empty))
    for model in gpu_models():
        cache_model(hf_cache, model)
    for name in ("math_qwen3.toml", "code_qwen3.toml", "agentbench_os.toml"):
        path = ROOT / "recipes" / "gpu" / name
        problems = preflight(load_recipe(path), path).problems
        assert problems and {p.kind for p in problems} == {"data_missing"}, name
        for p in problems:
            assert str(empty) in p.message and "ASTRAFLOW_" in p.message, str(p)


def test_a_hub_id_resolves_to_its_cached_snapshot_and_nothing_downloads(hf_cache, monkeypatch):
    import huggingface_hub

    def no_network(*_a, **_k):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    with pytest.raises(ModelNotCached, match="hf download Qwen/Qwen3-0.6B"):
        local_checkpoint("Qwen/Qwen3-0.6B")
    cache_model(hf_cache, "Qwen/Qwen3-0.6B", weights=False)
    with pytest.raises(ModelNotCached, match="without its weights"):
        local_checkpoint("Qwen/Qwen3-0.6B")
    snapshot = cache_model(hf_cache, "Qwen/Qwen3-1.7B")
    assert local_checkpoint("Qwen/Qwen3-1.7B") == str(snapshot)


def test_builtin_models_and_local_checkpoints_pass(tmp_path):
    recipe = load_recipe(QUICKSTART)
    assert preflight(recipe, QUICKSTART, tasks=False).problems == []
    assert preflight_or_raise(recipe, QUICKSTART).ok


def test_a_model_that_cannot_work_or_is_not_here_is_named(tmp_path, hf_cache):
    """An unknown built-in or a folder without a checkpoint is a mistake in the recipe
    (``model``); a path absent from this machine is something it lacks (``model_missing``)."""
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    cases = {
        "builtin:tiny-nothing": ("model", "unknown built-in model"),
        str(folder): ("model", "neither a checkpoint nor a run directory"),
        str(tmp_path / "gone"): ("model_missing", "no such local path"),
    }
    for model, (kind, message) in cases.items():
        recipe = load_recipe(QUICKSTART, [f"policies.policy.model={json.dumps(model)}"])
        problems = preflight(recipe, QUICKSTART, tasks=False).problems
        assert [(p.where, p.kind) for p in problems] == [("policies.policy.model", kind)], model
        assert message in problems[0].message


def test_preflight_or_raise_lists_every_problem(hf_cache):
    path = ROOT / "recipes" / "gpu" / "multi_policy_math.toml"
    with pytest.raises(PreflightError) as info:
        preflight_or_raise(load_recipe(path), path, tasks=False)
    text = str(info.value)
    assert text.startswith(f"{path}: 2 problems before start")
    assert "policies.solver.model: model 'Qwen/Qwen3-1.7B'" in text
    assert "policies.verifier.model: model 'Qwen/Qwen3-0.6B'" in text


def test_recipe_check_names_the_missing_model_and_can_skip_models(hf_cache):
    path = str(ROOT / "recipes" / "gpu" / "math_qwen3.toml")
    result = CliRunner().invoke(_cli(), ["recipe", "check", "--no-tasks", path])
    out = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "policies.policy.model: model 'Qwen/Qwen3-0.6B' is not in the local Hugging" in out
    assert "hf download Qwen/Qwen3-0.6B" in out
    skipped = CliRunner().invoke(_cli(), ["recipe", "check", "--no-tasks", "--no-models", path])
    assert skipped.exit_code == 0, skipped.output


def _cli():
    from astraflow.cli.main import app

    return app
