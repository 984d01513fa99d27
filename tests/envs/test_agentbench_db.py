"""AgentBench dbbench: AgentBench's parsing and scoring rules, real SQLite and real MariaDB sessions,
and the oracle on the dev split (every INSERT/UPDATE hash reproduced, SELECT 20/20) on both."""

from __future__ import annotations

import asyncio

import pytest
from agentbench_helpers import need_data, need_mysql
from astraflow.envs.agentbench.data import load_dbbench
from astraflow.envs.agentbench.dbbench.backends import BackendError, TableSpec, make_backend
from astraflow.envs.agentbench.dbbench.env import AgentBenchDBEnv
from astraflow.envs.agentbench.dbbench.scoring import (
    hash_answer,
    parse_reply,
    select_correct,
    table_hash,
)
from astraflow.envs.registry import make_env

from astraflow.rollout.evaluation.agentbench import EvalConfig, evaluate, oracle_agent

TABLE = {
    "id": "t-1",
    "description": "How many cities are listed?",
    "add_description": "The name of this table is cities, and the headers of this table are name,pop.",
    "type": "counting",
    "table_name": "my cities",
    "columns": ["name", "pop"],
    "rows": [["Zürich", "400"], ["Kraków", "800"], ["Ōsaka", None]],
    "label": ["3"],
}


# --- rules ---------------------------------------------------------------------------------------


def test_parse_reply_follows_agentbench_patterns():
    op = parse_reply("I look.\nAction: Operation\n```sql\nSELECT *\nFROM t;\n```\nmore")
    assert op.kind == "operation" and op.sql == "SELECT * FROM t;"
    assert parse_reply("Action: Operation\nno block here").sql is None
    ans = parse_reply('Done.\nAction: Answer\nFinal Answer: ["a", "b"]')
    assert ans.kind == "answer" and ans.answer == ' ["a", "b"]'
    # "Final Answer:" must start a line; an Action needs a newline after it.
    assert parse_reply('Action: Answer Final Answer: ["x"]').answer is None
    assert parse_reply("Action: Operation").kind == "answer"


def test_select_comparison_is_agentbench_s():
    assert select_correct(' ["2011"]', ["2011.0"])  # one value: numeric equality
    assert select_correct(" [3]", ["3"])
    assert not select_correct(' ["2012"]', ["2011.0"])
    assert select_correct(' ["b", "a"]', ["a", "b"])  # several: set equality
    assert not select_correct(' ["a"]', ["a", "b"])
    assert select_correct(" 17", ["17"])  # a bare value is one raw answer
    assert select_correct(' ["March 19, 1998"]', ["March 19, 1998"])
    assert not select_correct(' "ab"', ["ab"])  # a string literal becomes its characters


def test_python_hash_equals_mysql_definition_on_known_rows():
    # md5 over sorted 5-char row hashes of CONCAT_WS(',', non-null values)
    import hashlib

    rows = [("a", "1"), ("b", None)]
    row_hashes = sorted(hashlib.md5(s.encode()).hexdigest()[:5] for s in ("a,1", "b"))
    expected = hashlib.md5(",".join(row_hashes).encode()).hexdigest()
    assert table_hash(rows) == expected
    assert hash_answer(expected) == f"[('{expected}',)]"
    assert table_hash([]) is None and hash_answer(None) == "[(None,)]"


def test_bad_db_url_is_named():
    with pytest.raises(BackendError, match="mysql://user:pass@host:port"):
        make_backend("postgres://x")


# --- env episodes on SQLite ------------------------------------------------------------------------


def test_sqlite_episode_observations_limits_and_scoring():
    env = make_env("astraflow/AgentBench-DB-v0")
    obs, info = env.reset(options={"task": TABLE})
    assert "Action: Operation" in obs and "Final Answer" in obs and TABLE["description"] in obs
    obs, r, term, trunc, _ = env.step(
        "Action: Operation\n```sql\nSELECT count(*) FROM `my cities`;\n```"
    )
    assert (obs, r, term) == ("[(3,)]", 0.0, False)
    obs, *_ = env.step(
        "Action: Operation\n```sql\nSELECT name FROM `my cities` WHERE pop IS NULL\n```"
    )
    assert obs == "[('Ōsaka',)]"
    obs, *_ = env.step("Action: Operation\n```sql\nSELEC nonsense\n```")
    assert "syntax error" in obs
    obs, *_ = env.step(
        "Action: Operation\n```sql\nWITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM n "
        "WHERE x < 500) SELECT x FROM n\n```"
    )
    assert len(obs) == 800 + len("[TRUNCATED]") and obs.endswith("[TRUNCATED]")
    obs, r, term, trunc, info = env.step('Action: Answer\nFinal Answer: ["3"]')
    assert term and r == 1.0 and info["status"] == "completed" and info["success"]
    env.close()


def test_sqlite_round_limit_and_validation_failure():
    env = AgentBenchDBEnv()
    env.reset(options={"task": TABLE})
    op = "Action: Operation\n```sql\nSELECT 1\n```"
    for _ in range(15):
        _obs, _r, term, _t, _i = env.step(op)
        assert not term
    _obs, r, term, _t, info = env.step(op)  # a 16th operation is over the limit
    assert term and r == 0.0 and info["status"] == "task limit reached"
    env.reset(options={"task": TABLE})
    _obs, r, term, _t, info = env.step("Action: Operation\nSELECT 1")
    assert term and info["status"] == "agent validation failed"


def test_update_is_scored_by_table_hash_whatever_the_answer():
    task = {
        **TABLE,
        "type": "UPDATE",
        "label": ["UPDATE `my cities` SET pop = '1' WHERE name = 'Zürich'"],
    }
    target = table_hash([("Zürich", "1"), ("Kraków", "800"), ("Ōsaka", None)])
    task["answer_md5"] = hash_answer(target)
    env = AgentBenchDBEnv()
    env.reset(options={"task": task})
    env.step("Action: Operation\n```sql\n" + task["label"][0] + "\n```")
    *_, info = env.step('Action: Answer\nFinal Answer: ["whatever"]')
    assert info["success"] and info["answer"] == task["answer_md5"]
    env.reset(options={"task": task})  # a fresh database: the update is gone
    *_, info = env.step('Action: Answer\nFinal Answer: ["none"]')
    assert not info["success"]


def test_sqlite_behaves_like_mysql_where_it_cheaply_can():
    session = make_backend(None).open(TableSpec.from_payload(TABLE))
    try:
        # utf8mb4_general_ci-like comparison: case, accents and trailing spaces ignored
        assert (
            session.execute("SELECT pop FROM `my cities` WHERE name = 'zurich  '") == "[('400',)]"
        )
        assert session.execute(
            "SELECT CONCAT(name, '-', pop), MD5('a') FROM `my cities` LIMIT 1"
        ) == ("[('Zürich-400', '0cc175b9c0f1b6a831c399e269772661')]")
        # several statements: all run, the first result is shown
        first = session.execute(
            "SELECT count(*) FROM `my cities`; DELETE FROM `my cities` WHERE pop = '800'"
        )
        assert first == "[(3,)]"
        assert session.execute("SELECT count(*) FROM `my cities`") == "[(2,)]"
        assert session.execute("SELECT 'a;b'") == "[('a;b',)]"  # a quoted semicolon is not a split
    finally:
        session.close()


# --- MariaDB ---------------------------------------------------------------------------------------


def test_mariadb_session_utf8mb4_multistatement_and_cleanup():
    url = need_mysql()
    backend = make_backend(url)
    spec = TableSpec("städte", ["name", "note"], [["a", "🚀"], ["b", None]])
    session = backend.open(spec)
    db = session.database
    try:
        assert session.execute("SELECT note FROM `städte` WHERE name = 'a'") == "[('🚀',)]"
        # several statements: all run, the first result is shown, the rest are consumed
        first = session.execute("SELECT count(*) FROM `städte`; UPDATE `städte` SET note='x'")
        assert first == "[(2,)]"
        assert session.execute("SELECT note FROM `städte` ORDER BY name") == "[('x',), ('x',)]"
        assert session.execute("SELEC 1").startswith("1064: ")
        # the server-side hash equals the Python one
        assert session.table_hash() == hash_answer(table_hash([("a", "x"), ("b", "x")]))
    finally:
        session.close()
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", user="root", password="")
    with conn.cursor() as cur:
        cur.execute("SHOW DATABASES LIKE %s", (db,))
        assert cur.fetchall() == ()
    conn.close()


# --- oracle on the dev split ---------------------------------------------------------------------


def _oracle(db: str | None) -> dict:
    data = need_data()
    config = EvalConfig(tasks=("dbbench",), data_dir=str(data), db=db, concurrency=4)
    return asyncio.run(evaluate(oracle_agent(), config))


def _assert_all_dev_pass(report: dict) -> None:
    fam = report["tasks"]["dbbench"]
    failed = [s for s in report["samples"]["dbbench"] if not s["passed"]]
    assert failed == []
    assert fam["by_category"] == {
        "SELECT": {"total": 20, "passed": 20},
        "INSERT": {"total": 20, "passed": 20},
        "UPDATE": {"total": 20, "passed": 20},
    }
    assert fam["overall_cat_accuracy"] == 1.0 and fam["success_rate"] == 1.0


def test_oracle_dev_split_on_sqlite():
    _assert_all_dev_pass(_oracle(None))


def test_oracle_dev_split_on_mariadb():
    _assert_all_dev_pass(_oracle(need_mysql()))


@pytest.mark.slow  # every dev sample on two backends
def test_every_dev_modification_hash_reproduced_on_both_backends():
    data = need_data()
    samples = [p for p in load_dbbench(data, "dev") if p["type"] in ("INSERT", "UPDATE")]
    assert len(samples) == 40
    backends = [make_backend(None)]
    try:
        backends.append(make_backend(need_mysql()))
    except pytest.skip.Exception:
        pass
    for backend in backends:
        for p in samples:
            session = backend.open(TableSpec.from_payload(p))
            try:
                before = session.table_hash()
                session.execute(p["label"][0])
                after = session.table_hash()
            finally:
                session.close()
            assert after == p["answer_md5"], (backend.name, p["id"])
            assert before != p["answer_md5"], (backend.name, p["id"])
