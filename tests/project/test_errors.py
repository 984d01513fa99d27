"""Every exception class the project defines derives from ``astraflow.errors.AstraFlowError``.

The test imports every module of the project's packages and checks each exception class defined
there, so a new module's exception without the root fails here, named with its module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from astraflow.errors import AstraFlowError

PACKAGES = ("astraflow", "envs", "tasks", "cli")


def _project_exceptions() -> tuple[list[type[BaseException]], list[str]]:
    found, unimportable = [], []
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            try:
                module = importlib.import_module(info.name)
            except ImportError as exc:
                unimportable.append(f"{info.name}: {exc}")
                continue
            for obj in vars(module).values():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                ):
                    found.append(obj)
    return found, unimportable


def test_every_project_exception_has_the_astraflow_root():
    found, unimportable = _project_exceptions()
    # an unimportable module would hide its classes from the check
    assert not unimportable, unimportable
    assert len(found) >= 45  # the walk really reaches the packages' modules
    missing = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, AstraFlowError)
    )
    assert not missing, f"exception classes without AstraFlowError in their bases: {missing}"


@pytest.mark.parametrize(
    ("path", "builtin"),
    [
        ("astraflow.recipe.loader.RecipeError", ValueError),
        ("astraflow.registry.UnknownNameError", KeyError),
        ("astraflow.protocol.client.ServiceUnreachable", RuntimeError),
        ("astraflow.tasks.data.DataFileMissing", FileNotFoundError),
        ("astraflow.trainer.source.SourceExhausted", Exception),
    ],
)
def test_the_builtin_base_is_kept(path, builtin):
    """``except ValueError`` (etc.) handlers written before the root still catch these."""
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, AstraFlowError) and issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("x")
