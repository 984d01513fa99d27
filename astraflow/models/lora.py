"""LoRA adapters as policies: the one definition of an adapter's weights that trainers, engines
and the weight store share.

An adapter policy (``policies.NAME.base`` + ``lora``) is trained by a trainer and served by a
node's engine, each holding it inside a ``peft`` model. What travels between them is the
adapter's state in peft's own saved form (:func:`adapter_state`: ``get_peft_model_state_dict``,
keys without the adapter's name, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.
weight``), so a version's snapshot is exactly an ``adapter_model.safetensors`` and its sparse
delta covers the adapter only.

Why :func:`init_adapter_`: peft draws ``lora_A`` from the global RNG, so a trainer and a node
would start from different A matrices and the first delta would not apply (its parent digest
differs). Both sides instead draw A from a generator seeded by the run seed and the policy name:
version 0 is the same bytes everywhere, and deltas apply from the first step.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from astraflow.recipe.schema import LoraConfig

#: peft's adapter name inside a trainer (one adapter per trainer model)
TRAINER_ADAPTER = "default"
#: the adapter name that selects the bare base model in a mixed batch (peft's own)
BASE_ADAPTER = "__base__"


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter policy as an engine needs it: its name, its LoRA shape and the seed of its
    version-0 weights (:func:`adapter_seed`)."""

    policy: str
    lora: LoraConfig
    seed: int


def adapter_specs(recipe: Any, policies: list[str]) -> list[AdapterSpec]:
    """The :class:`AdapterSpec` of each adapter policy of ``recipe`` named in ``policies``."""
    return [
        AdapterSpec(name, recipe.policies[name].lora, adapter_seed(recipe.run.seed, name))
        for name in policies
    ]


def peft_lora_config(lora: LoraConfig) -> Any:
    """The ``peft.LoraConfig`` of a recipe's LoRA section (causal LM, no bias)."""
    try:
        import peft
    except ImportError as exc:
        raise ValueError(
            "LoRA needs peft, which is not installed; install it with "
            "`pip install 'astraflow[lora]'` (or `pip install peft`)"
        ) from exc
    return peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def engine_adapter_name(policy: str) -> str:
    """The peft adapter name an engine gives ``policy``: peft warns about (and may mis-load)
    names that are a substring of its ``lora_`` prefix, such as a policy called ``a``."""
    return f"adapter_{policy}"


def adapter_state(model: Any, adapter: str) -> dict[str, Any]:
    """``adapter``'s tensors in ``model`` (a peft model), keyed as peft saves them.

    The tensors are the live parameters (state_dict entries share their storage), so writing into
    them in place (a weight update) changes the adapter the model runs."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
    if not state:
        raise ValueError(f"the model has no LoRA weights for adapter {adapter!r}")
    return dict(state)


def adapter_seed(run_seed: int, policy: str) -> int:
    """The seed of ``policy``'s initial adapter in a run (same on every trainer and node)."""
    digest = hashlib.sha256(f"astraflow-lora/{run_seed}/{policy}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_adapter_(state: dict[str, Any], seed: int) -> None:
    """Initialise an adapter's state in place: every ``lora_A`` uniform in +-1/sqrt(fan_in)
    (peft's default, kaiming-uniform with a = sqrt(5)) from a CPU generator seeded by ``seed``,
    drawn in sorted key order; every ``lora_B`` zero, so the adapter starts as the base model."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for key in sorted(state):
            tensor = state[key]
            if ".lora_A." in key:
                bound = 1.0 / math.sqrt(tensor.shape[1])
                values = torch.empty(tuple(tensor.shape), dtype=torch.float32)
                values.uniform_(-bound, bound, generator=generator)
                tensor.copy_(values)
            elif ".lora_B." in key:
                tensor.zero_()
            else:
                raise ValueError(
                    f"adapter tensor {key!r} is neither lora_A nor lora_B; only plain LoRA on "
                    "linear layers is supported for adapter policies"
                )
