"""Names of the built-in models and how a recipe's ``model`` value becomes a loadable path.

``builtin:NAME`` names a checkpoint shipped inside the package (committed, so the quickstart needs
no build step); any other value is passed through untouched as a Hugging Face model id or a local
path, for transformers or vLLM to resolve.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from astraflow.errors import AstraFlowError

BUILTIN_PREFIX = "builtin:"
BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str

    @property
    def path(self) -> Path:
        return BUILTIN_ROOT / self.name


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "tiny-arith": BuiltinModel(
        name="tiny-arith",
        description=(
            "1.1M-parameter Llama causal LM (untied embeddings) with a character-level tokenizer, warm-started on "
            "level-2 arithmetic so RL starts from a weak but non-zero policy (CPU quickstart)."
        ),
    ),
    "tiny-tools": BuiltinModel(
        name="tiny-tools",
        description=(
            "The tiny Llama (512-token context) warm-started to call a `calculator` tool in the "
            "hermes format on 3-digit products and answer with its result; about a third of "
            "its sampled first turns are the right call, the rest answer without the tool or make "
            "bad calls (recipes/tools_calculator.toml, docs/tools.md)."
        ),
    ),
}


class UnknownModelError(AstraFlowError, ValueError):
    """A ``builtin:`` name that is not shipped with this build."""


def resolve_model(name: str) -> str:
    """Path for ``builtin:NAME``; any other value (hub id or local path) is returned as is."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"model must be a non-empty string, got {name!r}")
    if not name.startswith(BUILTIN_PREFIX):
        return name
    key = name[len(BUILTIN_PREFIX) :]
    model = BUILTIN_MODELS.get(key)
    if model is None:
        known = ", ".join(BUILTIN_PREFIX + k for k in sorted(BUILTIN_MODELS))
        raise UnknownModelError(f"unknown built-in model {name!r}; available: {known}")
    if not (model.path / "config.json").is_file():
        raise FileNotFoundError(
            f"built-in model {name!r} has no checkpoint at {model.path}; "
            f"run `astraflow models build {key}` to create it"
        )
    return str(model.path)
