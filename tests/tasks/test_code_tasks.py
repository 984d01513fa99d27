"""HumanEval and MBPP loaders, and their reference solutions through the real code env.

The full HumanEval run (164 canonical solutions) is repeated on each real backend available here
(docker, bwrap); tasks run 4 at a time, each in its own sandbox.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from astraflow.envs.code.env import CodeEnv
from astraflow.envs.sandbox import SandboxError, make_backend
from astraflow.tasks.code import MBPP_SPLITS, humaneval, mbpp, normalize_body

FIELDS = {"id", "prompt", "entry_point", "tests", "canonical_solution"}
REAL_BACKENDS = ["docker", "bwrap"]


def require_backend(name: str) -> None:
    try:
        make_backend(name).close()
    except SandboxError as exc:
        pytest.skip(f"{name} sandbox unavailable here: {exc}")


def fastest_backend() -> str:
    """bwrap starts in milliseconds, a container in about half a second: bulk checks use bwrap."""
    for name in ("bwrap", "docker", "process"):
        try:
            make_backend(name).close()
            return name
        except SandboxError:
            continue
    raise AssertionError("the process backend is always available")


def run_all(tasks, body_of, sandbox: str, **env_kwargs) -> dict[str, dict]:
    """Submit ``prompt + body_of(task)`` for every task; task id -> step info."""

    def one(task):
        env = CodeEnv(sandbox=sandbox, **env_kwargs)
        try:
            env.reset(options={"task": task})
            _, reward, *_, info = env.step(f"```python\n{task['prompt']}{body_of(task)}\n```")
            return task["id"], info
        finally:
            env.close()

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, tasks))


def failures(results: dict[str, dict]) -> list[str]:
    return [
        f"{tid}: {info['passed']}/{info['n_tests']} {info['error'] or ''}"
        f"{[t['error'] for t in info['tests'] if not t['passed']][:2]}"
        for tid, info in results.items()
        if info["pass_fraction"] != 1.0
    ]


def test_humaneval_loader():
    items = humaneval()
    assert len(items) == 164
    assert all(set(it) == FIELDS for it in items)
    assert items[0]["id"] == "HumanEval/0" and items[0]["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in items[0]["tests"]
    with pytest.raises(ValueError, match="only the split 'test'"):
        humaneval(split="train")


def test_mbpp_loader_splits(shared_data):
    sizes = {split: len(mbpp(split, data_dir=shared_data)) for split in MBPP_SPLITS}
    assert sizes == {"prompt": 7, "test": 257, "validation": 43, "train": 120}
    test = mbpp("test", data_dir=shared_data)
    assert all(set(it) == FIELDS for it in test)
    assert all(11 <= int(it["id"].split("/")[1]) <= 510 for it in test)
    # train is shuffled by seed, evaluation splits keep file order
    assert [t["id"] for t in mbpp("train", seed=1, data_dir=shared_data)] != [
        t["id"] for t in mbpp("train", seed=2, data_dir=shared_data)
    ]
    assert mbpp("test", seed=1, data_dir=shared_data) == test
    with pytest.raises(ValueError, match="no split 'dev'"):
        mbpp("dev", data_dir=shared_data)


def test_mbpp_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="mbpp_sanitized.jsonl"):
        mbpp("test", data_dir=tmp_path)


def test_normalize_body_reindents_to_the_prompt():
    body = "  x = 1\n  if x:\n      return x\n"
    out = normalize_body(body)
    assert out.splitlines()[0] == "    x = 1"
    ns: dict = {}
    exec("def f():\n    '''doc'''\n" + out, ns)
    assert ns["f"]() == 1


@pytest.mark.nightly  # the HumanEval/MBPP data does not change between submissions
@pytest.mark.parametrize("backend", REAL_BACKENDS)
def test_humaneval_canonical_solutions_all_pass(backend):
    require_backend(backend)
    results = run_all(humaneval(), lambda t: t["canonical_solution"], backend)
    assert len(results) == 164
    assert not failures(results), failures(results)
    assert {info["sandbox"]["backend"] for info in results.values()} == {backend}


@pytest.mark.nightly  # the HumanEval/MBPP data does not change between submissions
def test_humaneval_wrong_solutions_fail():
    results = run_all(humaneval(), lambda t: "    return None\n", fastest_backend())
    passing = [tid for tid, info in results.items() if info["pass_fraction"] == 1.0]
    assert not passing, f"a `return None` body passed: {passing}"


@pytest.mark.nightly  # the HumanEval/MBPP data does not change between submissions
def test_mbpp_canonical_pass_and_wrong_fail(shared_data):
    tasks = [t for split in MBPP_SPLITS for t in mbpp(split, data_dir=shared_data)]
    assert len(tasks) == 427
    good = run_all(
        tasks,
        lambda t: t["canonical_solution"],
        fastest_backend(),
        test_timeout_s=60,
        timeout_s=120,
    )
    assert not failures(good), failures(good)
    wrong = run_all(tasks[::4], lambda t: "    return None\n", fastest_backend())
    passing = [tid for tid, info in wrong.items() if info["pass_fraction"] == 1.0]
    assert not passing, f"a `return None` body passed: {passing}"
