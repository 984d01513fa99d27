"""Every check a recipe can pass or fail before any service starts: the one list that
``astraflow recipe check`` prints and ``astraflow train`` runs first.

Why one function: each of these used to be found out only after the run had started, on a
rollout node (an engine argument the engine did not take, a workflow name typo, a model absent
from the host), or in the dataflow service (a task set's file missing). ``recipe check`` grew the
checks one by one; ``train`` must refuse the same recipes, so both call :func:`preflight`.

What is checked, per problem kind (:data:`ProblemKind`):

- ``engine_args``: each policy's ``engine_args`` against its engine kind's declared arguments
  (:mod:`astraflow.rollout.engines.args`; the recipe schema checks them too, this covers a
  recipe changed after loading);
- ``model`` / ``model_missing``: each policy's ``model`` (and a ``base`` that is a model) as the
  engine will load it: ``builtin:NAME``, a local checkpoint or run directory, or a Hugging Face id
  in the local HF cache (:mod:`astraflow.rollout.engines.local_models`; nothing is downloaded).
  ``model_missing`` is a model that is simply not on this machine yet, with the command that
  fetches it; ``model`` is a name that cannot work (an unknown built-in, a folder without a
  checkpoint). ``openai`` policies name a model served elsewhere and are not looked up;
- ``workflow`` / ``agent``: ``workflow.name`` resolves, ``workflow.agent`` imports and asks only
  for role names;
- ``tasks`` / ``data_missing``: every task set (training and evaluation) loads a few rows that fit
  the env (:func:`astraflow.tasks.check.check_sets`); ``data_missing`` is a data file absent
  from ``$ASTRAFLOW_DATA_DIR`` (its message names the file and the variable).

The ``*_missing`` kinds are what a fresh machine lacks rather than what the recipe gets wrong:
callers may treat them apart (the test over ``recipes/gpu`` does), but both fail the check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from astraflow.recipe.loader import RecipeError

if TYPE_CHECKING:
    from astraflow.recipe.schema import Recipe

ProblemKind = Literal[
    "engine_args", "model", "model_missing", "workflow", "agent", "tasks", "data_missing"
]

#: The kinds that name something absent from this machine (a download, a data folder), not a
#: mistake in the recipe.
ABSENT_KINDS: tuple[ProblemKind, ...] = ("model_missing", "data_missing")


@dataclass(frozen=True)
class Problem:
    """One failed check: the recipe key it is about, its kind, and what is wrong and what to do."""

    where: str
    kind: ProblemKind
    message: str

    def __str__(self) -> str:
        if self.message.startswith(self.where):  # a task set's message names its place itself
            return self.message
        return f"{self.where}: {self.message}"


@dataclass
class PreflightReport:
    """What :func:`preflight` found: ``problems`` fail the check, ``warnings`` do not."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class PreflightError(RecipeError):
    """A recipe that failed :func:`preflight`; the message lists every problem, one a line."""

    def __init__(self, source: str, report: PreflightReport):
        self.report = report
        count = len(report.problems)
        lines = [f"{source}: {count} problem{'s' * (count != 1)} before start"]
        lines += [f"  {p}" for p in report.problems]
        super().__init__("\n".join(lines))


def preflight(
    recipe: Recipe,
    recipe_path: str | Path | None = None,
    *,
    tasks: bool = True,
    rows: int = 3,
    models: bool = True,
) -> PreflightReport:
    """Run every check on a loaded ``recipe`` (``recipe_path``: only for messages) and return
    all problems, never stopping at the first. ``tasks=False`` skips loading task rows,
    ``models=False`` skips looking models up (for a recipe whose data or models live on other
    hosts). Starts nothing, downloads nothing."""
    report = PreflightReport()
    report.problems += _engine_args(recipe)
    if models:
        report.problems += _models(recipe)
    report.problems += _workflow(recipe)
    if tasks:
        problems, warnings = _tasks(recipe, rows)
        report.problems += problems
        report.warnings += warnings
    return report


def preflight_or_raise(
    recipe: Recipe, recipe_path: str | Path | None = None, **options: bool | int
) -> PreflightReport:
    """:func:`preflight`, raising :class:`PreflightError` (every problem listed) when it finds
    any; the report (its warnings) otherwise. ``astraflow train`` calls this before it starts a
    service."""
    report = preflight(recipe, recipe_path, **options)  # type: ignore[arg-type]
    if not report.ok:
        raise PreflightError(str(recipe_path or "<recipe>"), report)
    return report


def _engine_args(recipe: Recipe) -> list[Problem]:
    from astraflow.rollout.engines.args import EngineArgsError, parse_engine_args

    out = []
    for name, policy in recipe.policies.items():
        try:
            parse_engine_args(policy.engine, policy.engine_args)
        except EngineArgsError as exc:
            for key, message, value in exc.problems:
                where = f"policies.{name}.engine_args" + (f".{key}" if key else "")
                shown = f"got {value!r}; " if key else ""
                out.append(Problem(where, "engine_args", shown + message))
    return out


def _models(recipe: Recipe) -> list[Problem]:
    from astraflow.models.registry import UnknownModelError
    from astraflow.rollout.engines.local_models import ModelNotCached, local_checkpoint

    out = []
    for name, policy in recipe.policies.items():
        if policy.engine == "openai":  # a model served elsewhere: a name, not a checkpoint
            continue
        for key in ("model", "base"):
            model = getattr(policy, key)
            if model is None or (key == "base" and model in recipe.policies):
                continue  # a base that is a policy: that policy's model is checked itself
            where = f"policies.{name}.{key}"
            try:
                local_checkpoint(model)
            except ModelNotCached as exc:
                out.append(Problem(where, "model_missing", str(exc)))
            except (UnknownModelError, FileNotFoundError, ValueError) as exc:
                out.append(Problem(where, "model", str(exc)))
    return out


def _workflow(recipe: Recipe) -> list[Problem]:
    """Resolve ``workflow.name`` and import ``workflow.agent`` as every rollout node will: a typo
    there otherwise fails every episode of the run (the node pushes them as errors and the run
    stops as stalled), and check the model names the agent writes out against the roles."""
    from astraflow.rollout.workflows import default_workflows

    try:
        default_workflows().get(recipe.workflow.name)
    except Exception as exc:
        return [Problem("workflow.name", "workflow", str(exc))]
    if not recipe.workflow.agent:
        return []
    from astraflow.rollout.workflows.base import WorkflowError
    from astraflow.rollout.workflows.openai_agent import literal_model_names, load_agent

    try:
        fn, _ = load_agent(recipe.workflow.agent)
    except WorkflowError as exc:
        return [Problem("workflow.agent", "agent", str(exc))]
    roles = sorted(recipe.workflow.roles)
    unknown = sorted(literal_model_names(fn) - set(roles))
    if unknown:
        return [
            Problem(
                "workflow.agent",
                "agent",
                f"{recipe.workflow.agent!r} asks for model(s) {', '.join(map(repr, unknown))}, "
                f"but the model names an agent may use are the workflow roles: {', '.join(roles)} "
                "(map more roles to policies in [workflow.roles], or call model=ROLE)",
            )
        ]
    return []


#: How :func:`astraflow.tasks.check.check_sets` names a load that failed for an absent file.
_ABSENT_FILE_ERRORS = (": DataFileMissing:", ": FileNotFoundError:")
#: An absolute path in an error message (ends at whitespace, quotes, brackets or a comma).
_PATH = re.compile(r"(?<![\w.])(/[^\s,;'\"()\[\]]+)")
#: Where the data of the built-in task sets lives, for a message that does not say so itself.
DATA_HINT = (
    "put the data there, or point $ASTRAFLOW_DATA_DIR (math, code) or "
    "$ASTRAFLOW_AGENTBENCH_DATA (AgentBench) at the folder holding it (docs/recipes.md, 'Data')"
)


def data_absent(error: str) -> bool:
    """Whether a task set failed to load because a file is not on this machine: named so by its
    exception, or the message names an absolute path that does not exist."""
    if any(marker in error for marker in _ABSENT_FILE_ERRORS):
        return True
    return any(not Path(p.rstrip(".")).exists() for p in _PATH.findall(error))


def _tasks(recipe: Recipe, rows: int) -> tuple[list[Problem], list[str]]:
    """Resolve every task set of ``recipe`` and validate a few rows against its env."""
    from astraflow.tasks.catalog import default_task_sets
    from astraflow.tasks.check import check_sets

    sets = default_task_sets()
    warnings = [error for _name, error in sorted(sets.errors.items())]
    problems = []
    for c in check_sets(recipe, rows=rows, task_sets=sets):
        if not c.error:
            continue
        if data_absent(c.error):
            hint = "" if "ASTRAFLOW_" in c.error else f"; {DATA_HINT}"
            problems.append(Problem(c.where, "data_missing", c.error + hint))
        else:
            problems.append(Problem(c.where, "tasks", c.error))
    return problems, warnings
