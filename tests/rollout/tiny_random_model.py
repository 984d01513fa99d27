"""A random tiny Qwen2 checkpoint with a character-level tokenizer, for engine tests and benchmarks.

Why random weights scaled up: with the default small init every logit is nearly equal, so greedy
choices hinge on float noise and batched-vs-single comparisons become flaky. A larger init gives
peaked, well-separated distributions, which is what a trained model looks like to the engine.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>"]
CHARS = list(string.digits + string.ascii_letters + " +-*/=?.,:;!()\n")


def build_char_tokenizer():
    """A PreTrainedTokenizerFast that maps every character to one token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="?",
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return tokenizer


def build_random_tiny_model(
    path: str | Path,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    init_scale: float = 0.3,
    tie_word_embeddings: bool = False,
) -> Path:
    """Save a random tiny ``Qwen2ForCausalLM`` and its tokenizer under ``path``; return the path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        # head_dim 32: vLLM's CPU attention kernels do not support smaller heads.
        num_attention_heads=max(1, hidden_size // 32),
        num_key_value_heads=max(1, hidden_size // 64),
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        initializer_range=init_scale,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
