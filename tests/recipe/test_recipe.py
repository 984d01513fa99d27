"""Recipe schema: good recipes load and round-trip, bad ones fail with actionable messages."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from astraflow.cli.main import app
from typer.testing import CliRunner

from astraflow.recipe import Recipe, RecipeError, load_recipe, recipe_from_dict, recipe_to_toml
from astraflow.recipe.loader import parse_override

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "recipes" / "quickstart.toml"
SHIPPED = sorted((REPO / "recipes").rglob("*.toml"))

MINIMAL = '[policies.policy]\nmodel = "builtin:tiny-arith"\n'


def write(tmp_path: Path, text: str, name: str = "bad.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_recipes_are_valid_and_round_trip(path: Path):
    recipe = load_recipe(path)
    rendered = recipe_to_toml(recipe)
    assert "\n\n\n" not in rendered
    again = recipe_from_dict(tomllib.loads(rendered), source="rendered")
    assert again == recipe


def test_quickstart_values():
    recipe = load_recipe(QUICKSTART)
    assert recipe.run.launcher == "local"
    assert recipe.trainable_policies() == ["policy"]
    assert recipe.policies["policy"].trainer.learning_rate == pytest.approx(2e-4)
    assert [p.name for p in recipe.dataflow.policies] == ["zero_variance_filter", "staleness"]
    assert recipe.max_lag_for("policy") == 2


def test_round_trip_of_awkward_values(tmp_path: Path):
    text = MINIMAL + (
        '[policies.policy.trainer.extra]\n"odd key" = "quote \\" back\\\\slash\\nnew\\tline"\n'
        "nested = { a = [1, 2.5, true], b = {} }\n"
        '[policies.judge]\nmodel = "gpt"\nengine = "openai"\ntrainable = false\n'
        'engine_args = { base_url = "http://judge:8000/v1" }\n'
        'sampling = { stop = ["\\n\\n", "</answer>"] }\n'
        '[workflow]\nroles = { solver = "policy", verifier = "judge" }\n'
    )
    recipe = load_recipe(write(tmp_path, text, "ok.toml"))
    again = recipe_from_dict(tomllib.loads(recipe_to_toml(recipe)))
    assert again == recipe
    assert again.policies["policy"].trainer.extra["odd key"] == 'quote " back\\slash\nnew\tline'


# (recipe text, overrides, substrings the message must contain: file, key path, value, expectation)
BAD = {
    "unknown-key": (
        MINIMAL + "[run]\nmax_step = 5\n",
        [],
        ["run.max_step", "unknown key", "did you mean 'run.max_steps'", "allowed keys under [run]"],
    ),
    "wrong-type": (
        MINIMAL + '[run]\nseed = "seven"\n',
        [],
        ["run.seed", "'seven'", "expected a valid integer"],
    ),
    "bad-launcher": (
        MINIMAL + '[run]\nlauncher = "slurm"\n',
        [],
        ["run.launcher", "'slurm'", "expected 'local' or 'ray'"],
    ),
    "negative-max-steps": (
        MINIMAL + "[run]\nmax_steps = -3\n",
        [],
        ["run.max_steps", "got -3", "greater than or equal to 1"],
    ),
    "undefined-policy": (
        MINIMAL + '[workflow]\nroles = { agent = "polcy" }\n',
        [],
        ["workflow.roles.agent", "'polcy'", "not defined", "defined policies: policy"],
    ),
    "invalid-toml": (
        "[run\nname = 1\n",
        [],
        ["not valid TOML", "line 1"],
    ),
    "missing-policies": (
        '[run]\nname = "x"\n',
        [],
        ["policies", "required key is missing", "[policies.NAME]"],
    ),
    "bad-set-syntax": (
        MINIMAL,
        ["run.max_steps"],
        ["--set 'run.max_steps'", "missing '='", "KEY.PATH=VALUE"],
    ),
    "nested-unknown-key": (
        MINIMAL + "[policies.policy.trainer]\nlerning_rate = 1e-4\n",
        [],
        [
            "policies.policy.trainer.lerning_rate",
            "did you mean 'policies.policy.trainer.learning_rate'",
        ],
    ),
    "bad-sets-entry": (
        MINIMAL + '[tasks]\nsets = ["arith"]\n',
        [],
        ["tasks.sets.0", "got 'arith'", "expected a table"],
    ),
    "sets-entry-unknown-key": (
        MINIMAL + '[tasks]\nsets = [{ nam = "arith" }]\n',
        [],
        ["tasks.sets.0.nam", "did you mean 'tasks.sets.0.name'", "tasks.sets.0.name: required"],
    ),
    "bad-enum-in-policy": (
        MINIMAL + 'engine = "tgi"\n',
        [],
        ["policies.policy.engine", "'tgi'", "'transformers', 'vllm' or 'openai'"],
    ),
    "section-not-table": (
        "run = 5\n" + MINIMAL,
        [],
        ["run", "got 5", "expected a table"],
    ),
    "bad-value-from-set": (
        MINIMAL,
        ["run.max_steps=many"],
        ["run.max_steps (from --set)", "'many'", "valid integer"],
    ),
    "set-into-a-value": (
        MINIMAL + '[run]\nname = "x"\n',
        ["run.name.first=1"],
        ["--set 'run.name.first=1'", "run.name is the value 'x', not a table"],
    ),
    "bad-policy-name": (
        '[policies."my policy"]\nmodel = "m"\n',
        [],
        ["policies", "'my policy'", "letters, digits"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_recipes_name_file_key_value_and_expectation(tmp_path: Path, case: str):
    text, overrides, needles = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as exc:
        load_recipe(path, overrides)
    message = str(exc.value)
    assert message.startswith(str(path)), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"


def test_every_problem_is_reported_at_once(tmp_path: Path):
    path = write(tmp_path, MINIMAL + '[run]\nseed = "x"\nmax_steps = 0\nlauncher = "k8s"\n')
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    assert "(3 problems)" in str(exc.value)


def test_missing_and_unreadable_files(tmp_path: Path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(RecipeError, match="not a UTF-8 text file"):
        load_recipe(binary)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("run.max_steps=12", 12),
        ("a.b=1e-4", 1e-4),
        ("a.b=0.5", 0.5),
        ("a.b=true", True),
        ("a.b=false", False),
        ("a.b=hello", "hello"),
        ('a.b="007"', "007"),
        ("a.b=[1, 2, 3]", [1, 2, 3]),
        ('a.b=["x", "y"]', ["x", "y"]),
        ("a.b={ k = 1 }", {"k": 1}),
        ("a.b=", ""),
    ],
)
def test_override_coercion(text: str, expected):
    _, value = parse_override(text)
    assert value == expected and type(value) is type(expected)


def test_overrides_reach_nested_keys_and_list_items():
    recipe = load_recipe(
        QUICKSTART,
        [
            "run.max_steps=3",
            "policies.policy.trainer.learning_rate=1e-3",
            'policies.policy.sampling.stop=["\\n"]',
            "tasks.sets.0.limit=50",
            "dataflow.policies.1.kwargs.max_staleness=5",
            "run.launcher=ray",
            "logging.live=false",
        ],
    )
    assert recipe.run.max_steps == 3
    assert recipe.policies["policy"].trainer.learning_rate == pytest.approx(1e-3)
    assert recipe.policies["policy"].sampling.stop == ["\n"]
    assert recipe.tasks.sets[0].limit == 50
    assert recipe.dataflow.policies[1].kwargs["max_staleness"] == 5
    assert recipe.run.launcher == "ray" and recipe.logging.live is False


def test_override_list_index_out_of_range():
    with pytest.raises(RecipeError, match=r"indexes a list of 1 item\(s\); expected an index 0..0"):
        load_recipe(QUICKSTART, ["tasks.sets.4.limit=1"])


runner = CliRunner()


def test_cli_recipe_check_ok_and_bad(tmp_path: Path):
    ok = runner.invoke(app, ["recipe", "check", str(QUICKSTART)])
    assert ok.exit_code == 0, ok.output
    assert "ok" in ok.output and "policies: policy" in ok.output

    bad = write(tmp_path, MINIMAL + "[run]\nmax_step = 5\n")
    result = runner.invoke(app, ["recipe", "check", str(bad), str(QUICKSTART)])
    assert result.exit_code == 1
    # Both files are reported; rich markup does not swallow "[run]".
    assert "did you mean 'run.max_steps'" in result.output
    assert "allowed keys under [run]" in result.output
    assert "ok" in result.output


def test_cli_recipe_show_is_valid_toml_with_overrides():
    result = runner.invoke(app, ["recipe", "show", str(QUICKSTART), "--set", "run.max_steps=7"])
    assert result.exit_code == 0, result.output
    data = tomllib.loads(result.stdout)
    assert data["run"]["max_steps"] == 7
    assert Recipe.model_validate(data) == load_recipe(QUICKSTART, ["run.max_steps=7"])

    as_json = runner.invoke(app, ["recipe", "show", str(QUICKSTART), "--json"])
    assert as_json.exit_code == 0
    assert Recipe.model_validate_json(as_json.stdout) == load_recipe(QUICKSTART)


def test_trainer_lora_and_processes_keys_validate_with_named_errors():
    from astraflow.recipe import RecipeError, load_recipe

    qs = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.toml"
    recipe = load_recipe(qs, ['policies.policy.trainer.lora={r=4, target_modules=["q_proj"]}',
                              "policies.policy.trainer.processes=2"])  # fmt: skip
    trainer = recipe.policies["policy"].trainer
    assert trainer.processes == 2 and trainer.lora is not None
    assert (trainer.lora.r, trainer.lora.alpha, trainer.lora.target_modules) == (
        4,
        16.0,
        ["q_proj"],
    )
    with pytest.raises(RecipeError, match=r"lora.*target_modules.*at least one module"):
        load_recipe(qs, ["policies.policy.trainer.lora={target_modules=[]}"])
    with pytest.raises(RecipeError, match=r"lora"):
        load_recipe(qs, ["policies.policy.trainer.lora={rank=4}"])  # the key is r


def test_cli_recipe_check_imports_the_openai_agent(tmp_path: Path):
    """``workflow.agent`` is imported and its signature checked by ``recipe check`` (as every node
    would at start-up), so a typo fails before the run starts."""
    agents = Path(__file__).resolve().parents[1] / "rollout" / "openai_agents" / "arith_agent.py"
    sync_agent = tmp_path / "sync_agent.py"
    sync_agent.write_text("def agent(client, payload):\n    return 1.0\n")
    base = ["recipe", "check", "--no-tasks", str(QUICKSTART), "--set", "workflow.name=openai_agent"]
    ok = runner.invoke(app, [*base, "--set", f"workflow.agent={agents}:solve"])
    assert ok.exit_code == 0, ok.output
    typo = runner.invoke(app, [*base, "--set", f"workflow.agent={agents}:solv"])
    assert typo.exit_code == 1
    assert "has no attribute 'solv'" in typo.output
    not_async = runner.invoke(app, [*base, "--set", f"workflow.agent={sync_agent}:agent"])
    assert not_async.exit_code == 1
    assert "must be an async function" in not_async.output


def test_removed_logging_log_every_key_fails_with_the_fix(tmp_path: Path):
    """``logging.log_every`` never had an effect; an old recipe that sets it is told to drop it."""
    path = write(tmp_path, MINIMAL + "[logging]\nlog_every = 5\n")
    with pytest.raises(RecipeError, match=r"logging\.log_every was removed.*delete the key"):
        load_recipe(path)


def test_multi_policy_agentic_recipe():
    """The agentic multi-policy recipe: two trainable policies with their own trainers, both tools
    behind the long-tailed latency, and workflow kwargs the solve_verify workflow accepts (a
    typo there would otherwise fail every episode on the node)."""
    import inspect

    from astraflow.envs.wrappers.latency import LatencyDistribution

    from astraflow.rollout.workflows import default_workflows

    recipe = load_recipe(REPO / "recipes" / "multi_policy_agentic.toml")
    assert recipe.trainable_policies() == ["solver", "verifier"]
    assert recipe.workflow.roles == {"solver": "solver", "verifier": "verifier"}
    assert recipe.run.mode == "async"
    assert (
        load_recipe(REPO / "recipes" / "multi_policy_agentic.toml", ['run.mode="sync"']).run.mode
        == "sync"
    )
    with pytest.raises(RecipeError, match=r"same trainer\.groups_per_step \(here solver 8, "):
        load_recipe(
            REPO / "recipes" / "multi_policy_agentic.toml",
            ['run.mode="sync"', "policies.solver.trainer.groups_per_step=8"],
        )
    dist = LatencyDistribution.from_config(
        recipe.tasks.env_latency.model_dump(exclude={"on", "inner", "seed"})
    )
    assert dist.quantile(0.5) == pytest.approx(0.3) and dist.quantile(0.99) == pytest.approx(5.0)
    assert recipe.tasks.env == "astraflow/MathMultiTurn-v0" and recipe.workflow.max_turns == 3
    spec = default_workflows().get(recipe.workflow.name)
    params = inspect.signature(spec.fn).parameters
    unknown = set(recipe.workflow.kwargs) - set(params)
    assert not unknown, unknown
    assert recipe.workflow.kwargs["verifier_tool_env"] == "astraflow/Math-v0"
