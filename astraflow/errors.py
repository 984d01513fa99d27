"""The root of every exception AstraFlow raises on purpose.

Why one root: a caller (a launcher, a plugin's host, a test) can catch "anything AstraFlow
reported" with ``except AstraFlowError`` and still tell it apart from a bug (``TypeError`` from a
typo, ``KeyError`` from a missing dict entry). Each project exception keeps the builtin base that
says what kind of failure it is (``class RecipeError(AstraFlowError, ValueError)``), so existing
``except ValueError`` handlers keep working. ``tests/project/test_errors.py`` walks the packages
and fails on an exception class without this root.

This module imports nothing: every layer may use it.
"""

from __future__ import annotations


class AstraFlowError(Exception):
    """Base of the project's exceptions; subclasses add a builtin base saying what kind."""
