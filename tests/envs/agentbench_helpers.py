"""Shared helpers of the AgentBench tests: data location and MariaDB reachability."""

from __future__ import annotations

from pathlib import Path

import pytest
from astraflow.tasks.data import data_dir

DATA = data_dir() / "agentbench"
MYSQL_URL = "mysql://root@127.0.0.1:3306"


def need_data() -> Path:
    if not (DATA / "dbbench" / "dev.jsonl").is_file():
        pytest.skip(f"AgentBench data not found at {DATA.resolve()} (shared/data beside the repo)")
    return DATA.resolve()


def need_mysql() -> str:
    try:
        import pymysql
    except ImportError:
        pytest.skip("pymysql is not installed (pip install 'astraflow[mysql]')")
    try:
        pymysql.connect(
            host="127.0.0.1", port=3306, user="root", password="", connect_timeout=3
        ).close()
    except pymysql.MySQLError as exc:
        pytest.skip(f"no MySQL/MariaDB reachable at root@127.0.0.1:3306: {exc}")
    return MYSQL_URL


def need_alfworld_data() -> Path:
    """The AgentBench data folder when it holds the ALFWorld games (dev.json, train.json, games/)."""
    if not (DATA / "alfworld" / "dev.json").is_file():
        pytest.skip(f"AgentBench ALFWorld data not found at {(DATA / 'alfworld').resolve()}")
    return DATA.resolve()


def need_alfworld() -> str:
    """Skip unless the alfworld extra (alfworld, textworld[pddl], nltk) is installed."""
    from astraflow.envs.agentbench.alfworld.game import require_textworld

    try:
        return require_textworld()
    except ImportError as exc:
        pytest.skip(str(exc))
