"""A lossless UTF-8 byte tokenizer with a ChatML chat template, for engines without a model.

Why: a scripted engine (:mod:`.scripted`) must turn any reply (SQL with non-ASCII table names, bash,
JSON) into token ids and back without loss, and must not pull in transformers to do it. One token
per byte does that; the chat template is ChatML (``<|im_start|>role\\n...<|im_end|>\\n``), the format
of Qwen-style instruct models, so prompts rendered by the workflows' ``ChatRenderer`` look like the
ones a real policy sees.
"""

from __future__ import annotations

from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"


class ByteTokenizer:
    """Ids 0-255 are bytes; 256 is ``<|im_end|>`` (end of sequence), 257 is padding."""

    eos_token = IM_END
    eos_token_id = 256
    pad_token = PAD
    pad_token_id = 257
    #: ChatRenderer renders through a template when this is set (the text itself is not used).
    chat_template = "chatml"
    _special = {256: IM_END, 257: PAD}

    def __len__(self) -> int:
        return 258

    @property
    def vocab_size(self) -> int:
        return len(self)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out = bytearray()
        for i in ids:
            if i < 256:
                out.append(i)
            elif i in self._special:
                if not skip_special_tokens:
                    out += self._special[i].encode()
            else:
                raise ValueError(f"token id {i} is outside the byte tokenizer's vocabulary (258)")
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **_: Any,
    ) -> str | list[int]:
        text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
        if add_generation_prompt:
            text += f"{IM_START}assistant\n"
        return self.encode(text) if tokenize else text


def last_message(text: str, role: str = "user") -> str | None:
    """Content of the last ChatML message of ``role`` in a rendered conversation, or None."""
    start = text.rfind(f"{IM_START}{role}\n")
    if start < 0:
        return None
    start += len(IM_START) + len(role) + 1
    end = text.find(IM_END, start)
    return text[start:] if end < 0 else text[start:end]
