"""Built-in starter policies and helpers to resolve and load models.

Importing this package is cheap: torch/transformers load only when a model or tokenizer does.
"""

from astraflow.models.loading import load_model, load_tokenizer
from astraflow.models.registry import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    BuiltinModel,
    UnknownModelError,
    resolve_model,
)

__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PREFIX",
    "BuiltinModel",
    "UnknownModelError",
    "load_model",
    "load_tokenizer",
    "resolve_model",
]
