"""Check a recipe's task sets against its env before anything starts (``astraflow recipe check``).

Why: a task set whose rows do not fit the env (a JSONL file with ``prompt`` where the env wants
``question``, a plugin set paired with the wrong env) used to pass the recipe check and fail only
when the first episode ran, inside a rollout node's log. Here every set is resolved, a few rows are
loaded, and each is validated against the env class; the error names the set, the row and the
missing fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astraflow.tasks.base import Payload, TaskSetRegistry


@dataclass(frozen=True)
class SetCheck:
    """One task set of the recipe: where it is in the recipe and what it loaded."""

    where: str  # "tasks.sets[0]" or "evaluation.task_set"
    name: str
    split: str
    rows: int  # rows checked (0 when it failed to load)
    error: str | None = None


def required_fields(env_cls: type) -> list[str]:
    """The payload fields ``env_cls`` requires: its ``task_fields`` not marked optional."""
    fields: dict[str, str] = getattr(env_cls, "task_fields", {}) or {}
    return [k for k, doc in fields.items() if "optional" not in doc.lower()]


def row_error(env_cls: type, env_id: str, payload: Any) -> str | None:
    """Why ``payload`` does not fit ``env_cls`` (None when it does).

    Missing fields come from the class's ``task_fields``. Type checks come from the env's own
    ``validate_task``, run on an instance that was never initialised: ``validate_task`` reads only
    class attributes, and constructing the env could start a sandbox or open a database just to
    check a dict. An env whose validator needs its instance state is checked for fields only.
    """
    if not isinstance(payload, dict):
        return f"the row is a {type(payload).__name__}, not a JSON object"
    missing = [k for k in required_fields(env_cls) if k not in payload]
    if missing:
        fields = getattr(env_cls, "task_fields", {})
        return (
            f"missing field(s) {', '.join(repr(m) for m in missing)}; env {env_id} expects "
            + ", ".join(f"{k} ({v})" for k, v in fields.items())
        )
    validate = getattr(env_cls, "validate_task", None)
    if validate is None:
        return None
    try:
        validate(env_cls.__new__(env_cls), payload)
    except AttributeError:  # the validator needs a constructed env: fields were checked above
        return None
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def check_sets(
    recipe: Any,
    *,
    rows: int = 3,
    task_sets: TaskSetRegistry | None = None,
    envs: Any = None,
) -> list[SetCheck]:
    """Resolve the env and every task set of ``recipe`` (training and evaluation), load ``rows``
    rows of each and validate them against the env class. One :class:`SetCheck` per set."""
    from astraflow.envs.registry import default_registry
    from astraflow.tasks.catalog import default_task_sets

    task_sets = task_sets or default_task_sets()
    envs = envs or default_registry()
    env_id = recipe.tasks.env
    try:
        env_cls = envs.get(env_id).load_class()
    except (KeyError, ImportError) as exc:
        return [SetCheck("tasks.env", env_id, "", 0, str(exc))]

    wanted = [
        (f"tasks.sets[{i}]", s.name, s.split, s.kwargs) for i, s in enumerate(recipe.tasks.sets)
    ]
    ev = recipe.evaluation
    if ev.every_steps > 0:  # resolved as the dataflow service does (evaluations.py)
        name = ev.task_set or recipe.tasks.sets[0].name
        kwargs = next((s.kwargs for s in recipe.tasks.sets if s.name == name), {})
        wanted.append(("evaluation", name, ev.split, kwargs))

    out: list[SetCheck] = []
    training_rows: dict[str, list[Payload]] = {}
    for where, name, split, kwargs in wanted:
        label = f"{where} {name!r} (split {split!r})"
        try:
            items: list[Payload] = task_sets.load(
                name, split, seed=recipe.run.seed, limit=rows, **kwargs
            )
        except Exception as exc:  # unknown set, bad split, missing file, bad kwargs: all named
            out.append(SetCheck(where, name, split, 0, f"{label}: {type(exc).__name__}: {exc}"))
            continue
        if not items:
            out.append(SetCheck(where, name, split, 0, f"{label}: has no tasks"))
            continue
        error = None
        if where == "evaluation" and items == training_rows.get(name):
            error = (
                f"{label}: is the training data (the same rows as the training set {name!r}); "
                "the evaluation would measure memorisation. Point evaluation.task_set or "
                "evaluation.split at held-out rows, or set evaluation.every_steps = 0"
            )
        elif where != "evaluation":
            training_rows.setdefault(name, items)
        for i, payload in enumerate(items):
            if error:
                break
            why = row_error(env_cls, env_id, payload)
            if why is not None:
                pid = payload.get("id") if isinstance(payload, dict) else None
                ident = f"row {i}" + (f" (id {pid!r})" if pid is not None else "")
                error = f"{label} {ident}: {why}"
                break
        out.append(SetCheck(where, name, split, len(items), error))
    return out
