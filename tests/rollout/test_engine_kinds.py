"""One list of engine kinds (astraflow/engine_kinds.py) read by the recipe, the factory and the CLI."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from astraflow.engine_kinds import CHECKPOINT_ENGINE_KINDS, ENGINE_KINDS
from astraflow.recipe.schema import PolicyConfig
from astraflow.rollout.engines import ENGINE_KINDS as FACTORY_KINDS
from astraflow.rollout.engines import make_engine

REPO = Path(__file__).resolve().parents[2]
#: a written-out list of kinds: "transformers", "vllm" next to each other in a tuple/Literal/list
KIND_LIST = re.compile(r"""["']transformers["']\s*,\s*["']vllm["']""")


def test_the_schema_and_the_factory_read_the_one_list():
    assert get_args(PolicyConfig.model_fields["engine"].annotation) == ENGINE_KINDS
    assert FACTORY_KINDS is ENGINE_KINDS
    assert set(CHECKPOINT_ENGINE_KINDS) == set(ENGINE_KINDS) - {"openai"}
    with pytest.raises(ValueError, match="expected one of transformers, vllm, openai"):
        make_engine("sglang", "m")


def test_no_other_module_writes_the_list_out():
    written = [
        str(path.relative_to(REPO))
        for folder in ("astraflow", "cli")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.name != "engine_kinds.py" and KIND_LIST.search(path.read_text(encoding="utf-8"))
    ]
    assert written == []


def test_the_cli_checks_engine_kinds_against_the_list():
    from astraflow.cli.main import app

    out = CliRunner().invoke(app, ["serve", "policy", "builtin:tiny-arith", "--engine", "openai"])
    assert out.exit_code == 1
    assert "--engine must be one of transformers, vllm, got 'openai'" in out.output
