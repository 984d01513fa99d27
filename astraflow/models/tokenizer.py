"""Character-level tokenizer of the built-in tiny policies.

Why character level: arithmetic is learnt far more easily when every digit is its own token, and a
closed alphabet keeps the embedding tables (and so the checkpoint) tiny. Every printable ASCII
character, newline and tab is a single token; any other character falls back to its UTF-8 bytes
(``<0xNN>`` tokens), so observations from any environment tokenize and decode losslessly.

The tokenizer is built with the ``tokenizers`` library as a BPE model whose vocabulary is exactly
the alphabet and which has no merges, then wrapped in :class:`PreTrainedTokenizerFast` (loading it
through ``AutoTokenizer`` could let transformers substitute a pre-tokenizer of its own).
"""

from __future__ import annotations

import string
from pathlib import Path

#: Special tokens, in id order (ids 0..len-1).
PAD, UNK, BOS, END = "<|pad|>", "<|unk|>", "<|bos|>", "<|end|>"
ROLE_TOKENS = {r: f"<|{r}|>" for r in ("system", "user", "assistant", "tool")}
SPECIAL_TOKENS = [PAD, UNK, BOS, END, *ROLE_TOKENS.values()]

#: Single-token characters: printable ASCII (space included) plus newline and tab.
ALPHABET = [c for c in string.printable if c not in "\r\x0b\x0c"]

#: Multi-turn chat template. ``add_generation_prompt`` opens an assistant turn; the model ends
#: every turn with ``<|end|>`` (the EOS token).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role'] + "
    "' (expected system, user, assistant or tool)') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

#: Chat template of ``builtin:tiny-tools``: :data:`CHAT_TEMPLATE` plus function calling. Tools
#: (``apply_chat_template(..., tools=...)``, OpenAI or bare function schemas) open the conversation
#: as one short system turn, ``tools: NAME(PARAM, ...); ...``: a character-level model with a
#: 512-token context cannot afford whole JSON schemas. An assistant turn's ``tool_calls`` are
#: written after its content in the hermes format
#: (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, exactly what the model
#: generates, so a resent turn renders to the tokens that produced it); ``content`` may be null;
#: tool results are ``tool`` turns.
TOOLS_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>tools: ' }}"
    "{% for tool in tools %}"
    "{% set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{{ fn['name'] + '(' + ((fn['parameters'] or {})['properties'] or {}) | list | join(', ') + ')' }}"
    "{% if not loop.last %}{{ '; ' }}{% endif %}"
    "{% endfor %}{{ '<|end|>' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role'] + "
    "' (expected system, user, assistant or tool)') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>{\"name\": ' + fn['name'] | tojson + ', \"arguments\": ' }}"
    "{{ fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson }}"
    "{{ '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer(chat_template: str = CHAT_TEMPLATE, model_max_length: int = 256):
    """A fresh :class:`PreTrainedTokenizerFast` over :data:`ALPHABET` with byte fallback."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in [*SPECIAL_TOKENS, *ALPHABET, *(f"<0x{b:02X}>" for b in range(256))]:
        vocab.setdefault(tok, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, byte_fallback=True))
    core.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=END,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        chat_template=chat_template,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path):
    """Load a tokenizer directory as :class:`PreTrainedTokenizerFast` (never swapping its parts).

    For directories without a ``tokenizer.json`` (e.g. slow-only hub models) this falls back to
    ``AutoTokenizer``.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))
