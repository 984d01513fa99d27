"""Relative input files in a recipe resolve against the recipe's folder, whatever the working
directory; outputs and --set values stay relative to the working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from astraflow.tasks.check import check_sets

from astraflow.recipe import load_recipe, recipe_to_toml


def test_inputs_resolve_against_the_recipe_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    for split in ("train", "test"):
        (folder / "data" / f"{split}.jsonl").write_text(
            json.dumps({"question": f"{split} 1+1", "answer": "2"}) + "\n"
        )
    (folder / "agent.py").write_text("async def run(client, payload):\n    return '2'\n")
    (folder / "r.toml").write_text(
        '[policies.policy]\nmodel = "builtin:tiny-arith"\n'
        '[tasks]\nsets = [{ name = "jsonl", kwargs = { path = "data/{split}.jsonl" } }]\n'
        '[workflow]\nname = "openai_agent"\nagent = "agent.py:run"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recipe = load_recipe(Path(os.path.relpath(folder / "r.toml")), ["run.output_dir=out"])
    assert recipe.tasks.sets[0].kwargs["path"] == str(folder.resolve() / "data" / "{split}.jsonl")
    assert recipe.workflow.agent == f"{(folder / 'agent.py').resolve()}:run"
    assert recipe.run.output_dir == Path("out")  # an output: the working directory's
    assert recipe.policies["policy"].model == "builtin:tiny-arith"
    # the data really loads from here, both splits
    assert [c.error for c in check_sets(recipe)] == [None, None]
    # the run directory's copy (what nodes load) holds the absolute paths
    assert str(folder.resolve() / "data") in recipe_to_toml(recipe)


def test_set_inputs_resolve_against_the_working_directory(tmp_path, monkeypatch):
    """A --set input file is the working directory's (as the docs say), made absolute at load so
    the run directory's copy names it for every service; the recipe's own accelerate config (under
    ``trainer``) is anchored to the recipe's folder (it was left relative)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "r.toml").write_text(
        '[policies.policy]\nmodel = "builtin:tiny-arith"\n'
        '[policies.policy.trainer]\naccelerate_config = "fsdp.yaml"\n'
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    sets = 'tasks.sets=[{ name = "jsonl", kwargs = { path = "mine/{split}.jsonl" } }]'
    recipe = load_recipe(folder / "r.toml", [sets, "run.output_dir=out"])
    assert recipe.tasks.sets[0].kwargs["path"] == str(cwd.resolve() / "mine" / "{split}.jsonl")
    assert recipe.policies["policy"].trainer.accelerate_config == folder.resolve() / "fsdp.yaml"
    assert recipe.run.output_dir == Path("out")  # outputs stay the working directory's, relative
    mine = 'policies.policy.trainer.accelerate_config="ddp.yaml"'
    again = load_recipe(folder / "r.toml", [mine])
    assert again.policies["policy"].trainer.accelerate_config == cwd.resolve() / "ddp.yaml"
