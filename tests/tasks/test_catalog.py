"""Task sets: GSM8K and MATH-500 from the real files, the generated search QA set, file loaders,
lazily registered code sets, and errors that say what is wrong."""

from __future__ import annotations

import importlib.util
import json

import pytest
from astraflow.envs.registry import default_registry
from astraflow.tasks.base import UnknownTaskSetError
from astraflow.tasks.catalog import default_task_sets, load_task_set
from astraflow.tasks.data import DATA_DIR_ENV, DataFileMissing, data_dir
from astraflow.tasks.math_sets import TaskFormatError, gsm8k_final_answer

DATA = data_dir()
needs_data = pytest.mark.skipif(
    not (DATA / "math" / "gsm8k_test.jsonl").is_file(),
    reason=f"real math data not found at {DATA} (shared/data beside the repository)",
)


@needs_data
def test_gsm8k_real_files(monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(DATA))
    test = load_task_set("gsm8k", "test")
    train = load_task_set("gsm8k", "train", limit=50)
    assert len(test) == 1319 and len(train) == 50
    assert test[0]["answer"] == "18" and test[0]["question"].startswith("Janet")
    assert len({t["id"] for t in test}) == len(test)
    assert all(t["answer"].lstrip("-").replace(".", "").isdigit() for t in test)  # no commas
    raw = [json.loads(line) for line in (DATA / "math" / "gsm8k_test.jsonl").open()][:100]
    env = default_registry().make("astraflow/Math-v0")
    for row, task in zip(raw, test, strict=False):  # the reference solution earns full reward
        env.reset(options={"task": task})
        assert env.step(row["answer"])[1] == 1.0, task


@needs_data
def test_math500_real_file(monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(DATA))
    tasks = load_task_set("math500", "test")
    assert len(tasks) == 500
    first = tasks[0]
    assert first["id"] == "test/precalculus/807.json"
    assert first["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)" and first["level"] == 2
    assert {t["level"] for t in tasks} == {1, 2, 3, 4, 5}
    env = default_registry().make("astraflow/Math-v0")
    env.reset(options={"task": first})
    assert env.step("The point is \\boxed{(3, \\pi/2)}")[1] == 1.0  # symbolic, not string, match


def test_missing_data_dir_gives_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(
        DataFileMissing, match=rf"GSM8K test: file not found: .*gsm8k_test.jsonl.*{DATA_DIR_ENV}"
    ):
        load_task_set("gsm8k", "test")
    with pytest.raises(DataFileMissing, match="check the path= kwarg"):
        load_task_set("math500", "test", path=tmp_path / "nope.json")


def test_gsm8k_final_answer_parsing():
    assert gsm8k_final_answer("a\nb\n#### 1,234") == "1234"
    with pytest.raises(TaskFormatError, match="no '#### N' final line"):
        gsm8k_final_answer("no marker")


def test_unknown_set_and_split():
    with pytest.raises(UnknownTaskSetError, match="did you mean gsm8k"):
        load_task_set("gsm8", "test")
    with pytest.raises(ValueError, match="has no split 'train'; splits: test"):
        load_task_set("math500", "train")


def test_stdlib_qa_splits_are_disjoint_and_fit_the_search_env():
    train = load_task_set("stdlib_qa", "train")
    test = load_task_set("stdlib_qa", "test")
    assert train and test and not {t["id"] for t in train} & {t["id"] for t in test}
    assert load_task_set("stdlib_qa", "test") == test
    env = default_registry().make("astraflow/Search-v0")
    env.reset(options={"task": test[0]})
    _, reward, *_ = env.step(f"<answer>{test[0]['answer'][0]}</answer>")
    assert reward == 1.0


def test_file_task_sets(tmp_path):
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"id": "p1", "problem": "1+1", "solution": "2"}) + "\n")
    got = load_task_set(
        "math_file", "train", path=problems, question_field="problem", answer_field="solution"
    )
    assert got == [{"id": "p1", "question": "1+1", "answer": "2"}]
    with pytest.raises(TaskFormatError, match=r"missing field\(s\) \['question', 'answer'\]"):
        load_task_set("math_file", "train", path=problems)
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "q", "answer": ["a", "b"]}) + "\n")
    assert load_task_set("qa_file", "test", path=qa) == [
        {"id": "qa-1", "question": "q", "answer": ["a", "b"]}
    ]
    with pytest.raises(ValueError, match="pass path="):
        load_task_set("qa_file", "test")


def test_sets_name_registered_envs():
    env_ids = {s.id for s in default_registry().specs()}
    reg = default_task_sets()
    for name in reg.names():
        # generic: any env (the ecosystem sets suit whichever PREFIX:ID the recipe names)
        if name in ("jsonl", "skyrl_parquet", "verifiers", "textarena", "gym_seeds"):
            assert reg.info(name).default_env == ""
            continue
        assert reg.info(name).default_env in env_ids or reg.info(name).default_env.startswith(
            "astraflow/Code"
        )
    has_code = importlib.util.find_spec("astraflow.tasks.code") is not None
    assert ("humaneval" in reg.names()) == has_code and ("mbpp" in reg.names()) == has_code
