"""Export a trainer checkpoint as a model any ``from_pretrained`` loads.

A full fine-tune's checkpoint already is one; a LoRA checkpoint holds only the adapter (small,
and what resume needs), so the export loads the base model the adapter names, merges the adapter
into it (peft's ``merge_and_unload``) and saves the result with the tokenizer.
"""

from __future__ import annotations

import shutil
from pathlib import Path

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Write a standalone model (LoRA merged when the checkpoint holds an adapter) to ``out_dir``."""
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    if not checkpoint.is_dir():
        raise ValueError(f"checkpoint {checkpoint} is not a directory")
    if (checkpoint / "adapter_config.json").is_file():
        try:
            from peft import AutoPeftModelForCausalLM
        except ImportError as exc:
            raise ValueError(
                f"{checkpoint} holds a LoRA adapter; merging it needs peft "
                "(`pip install 'astraflow[lora]'`)"
            ) from exc
        model = AutoPeftModelForCausalLM.from_pretrained(str(checkpoint)).merge_and_unload()
    elif (checkpoint / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    else:
        raise ValueError(
            f"{checkpoint} holds neither a model (config.json) nor a LoRA adapter "
            "(adapter_config.json); expected a trainer checkpoint folder (checkpoint-N)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    for name in _TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out_dir / name)
    return out_dir
