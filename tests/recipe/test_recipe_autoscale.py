"""``[autoscale]``: the section validates its bounds and targets with messages naming the keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.recipe import RecipeError, load_recipe, recipe_from_dict

BASE = '[policies.policy]\nmodel = "builtin:tiny-arith"\n'


def load(tmp_path: Path, text: str):
    path = tmp_path / "r.toml"
    path.write_text(BASE + text)
    return load_recipe(path)


def test_off_by_default_and_loads_when_set(tmp_path: Path):
    assert load(tmp_path, "").autoscale.enabled is False
    r = load(
        tmp_path,
        "[rollout]\nnodes = 2\n[autoscale]\nenabled = true\nmin_nodes = 1\nmax_nodes = 3\n"
        "target_trainer_idle = 0.3\ncooldown_s = 10\ninterval_s = 2\n",
    )
    a = r.autoscale
    assert (a.enabled, a.min_nodes, a.max_nodes, a.target_trainer_idle) == (True, 1, 3, 0.3)
    assert (a.cooldown_s, a.interval_s) == (10.0, 2.0)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[autoscale]\nmin_nodes = 3\nmax_nodes = 2\n", "min_nodes .3. is above"),
        ("[autoscale]\ntarget_trainer_idle = nan\n", "target_trainer_idle"),
        ("[autoscale]\ntarget_trainer_idle = 1.5\n", "target_trainer_idle"),
        ("[autoscale]\ninterval_s = 0\n", "interval_s"),
        ("[autoscale]\nenable = true\n", "enable"),
        (
            "[rollout]\nnodes = 5\n[autoscale]\nenabled = true\nmax_nodes = 4\ntarget_trainer_idle = 0.2\n",
            r"rollout.nodes \(5\).*within autoscale.min_nodes..max_nodes \(1..4\)",
        ),
        (
            '[run]\nmode = "sync"\n[autoscale]\nenabled = true\ntarget_buffer_fill = 0.8\n',
            "target_buffer_fill needs run.mode",
        ),
    ],
)
def test_bad_sections_name_the_key(tmp_path: Path, text: str, message: str):
    with pytest.raises(RecipeError, match=message):
        load(tmp_path, text)


def test_enabled_needs_a_target(tmp_path: Path):
    with pytest.raises(RecipeError, match="no target: set target_trainer_idle"):
        load(tmp_path, "[autoscale]\nenabled = true\n")
    doc = {"policies": {"policy": {"model": "builtin:tiny-arith"}}}
    fill = recipe_from_dict({**doc, "autoscale": {"enabled": True, "target_buffer_fill": 0.8}})
    assert fill.autoscale.target_buffer_fill == 0.8 and fill.autoscale.target_trainer_idle is None
