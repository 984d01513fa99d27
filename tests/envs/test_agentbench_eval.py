"""`astraflow eval agentbench`: the oracle's JSON report, bad input and checkpoint resolution of run
directories. A real tiny policy end to end (a trained checkpoint of it) is in
tests/envs/test_agentbench_recipes.py, on the CPU recipe's training run."""

from __future__ import annotations

import json

import pytest
from agentbench_helpers import need_data
from astraflow.cli.eval import resolve_policy
from astraflow.cli.main import app
from typer.testing import CliRunner


def test_oracle_report_json_and_tables(tmp_path):
    data = need_data()
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "agentbench",
            "--agent",
            "oracle",
            "--tasks",
            "dbbench",
            "--data",
            str(data),
            "--limit",
            "45",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "overall_cat_accuracy" in result.output and "UPDATE" in result.output
    report = json.loads(out.read_text())
    db = report["tasks"]["dbbench"]
    assert (db["total"], db["passed"], db["skipped"], db["success_rate"]) == (45, 45, 0, 1.0)
    assert sum(v["total"] for v in db["by_type"].values()) == 45
    assert db["status"] == {"completed": 45}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "webshop"], "--tasks takes a comma-separated subset of dbbench, os"),
        (["--split", "test"], "--split must be one of dev, standard"),
        (["--engine-arg", "novalue"], "--engine-arg expects KEY=VALUE"),
        (["--data", "/nonexistent/agentbench"], "does not exist; pass --data DIR"),
        (
            ["--db", "postgres://x", "--agent", "oracle", "--tasks", "dbbench"],
            "mysql://user:pass@host:port",
        ),
    ],
)
def test_bad_input_is_named(args, message):
    result = CliRunner().invoke(app, ["eval", "agentbench", *args])
    assert result.exit_code != 0
    assert message in " ".join(result.output.split())


def test_run_directory_resolves_to_latest_checkpoint(tmp_path):
    for step in (2, 10, 9):
        ckpt = tmp_path / "trainer" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text("{}")
    assert resolve_policy(str(tmp_path)).endswith("checkpoint-10")
    assert resolve_policy(str(tmp_path / "trainer" / "checkpoint-2")).endswith("checkpoint-2")
    assert resolve_policy("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="neither a checkpoint nor a run directory"):
        resolve_policy(str(empty))
