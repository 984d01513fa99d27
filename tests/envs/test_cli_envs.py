"""`astraflow envs list|show|check` through the real Typer app."""

from __future__ import annotations

import json

from astraflow.cli.main import app
from typer.testing import CliRunner

runner = CliRunner()


def test_list_shows_math_and_search_with_source():
    result = runner.invoke(app, ["envs", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in json.loads(result.stdout)}
    assert rows["astraflow/Math-v0"]["family"] == "math"
    assert rows["astraflow/Search-v0"]["family"] == "search"
    assert rows["astraflow/MathMultiTurn-v0"]["source"] == "astraflow"
    table = runner.invoke(app, ["envs", "list"], env={"COLUMNS": "200"})
    assert "astraflow/Search-v0" in table.stdout and "family" in table.stdout


def test_show_documents_actions_reward_and_fields():
    result = runner.invoke(app, ["envs", "show", "astraflow/Search-v0"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in (
        "Action format",
        "<search>query</search>",
        "Reward",
        "exact match",
        "question",
        "top_k",
    ):
        assert text in result.stdout, text


def test_check_passes_and_fails_with_exit_codes():
    ok = runner.invoke(app, ["envs", "check", "astraflow/MathMultiTurn-v0", "--episodes", "2"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(
        app,
        ["envs", "check", "astraflow/Math-v0", "--kwarg", "format_reward=-1", "--episodes", "1"],
    )
    assert bad.exit_code == 1
    assert "format_reward must be >= 0" in bad.output
    unknown = runner.invoke(app, ["envs", "check", "astraflow/Serch-v0"])
    assert unknown.exit_code == 1
    assert "did you mean astraflow/Search-v0" in unknown.output
