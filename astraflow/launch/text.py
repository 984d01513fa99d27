"""Text that came from elsewhere, made safe for the operator's terminal: :func:`safe_text`.

Rollout nodes are not trusted. Their names, regions, episode errors, env and tool output and task
text reach the launcher's live view, ``astraflow status``, the stall message, ``astraflow
transcripts``, eval reports and logs. Rich reads a ``str`` as markup, so a node named ``[/]`` (a
closing tag with nothing open) raises ``MarkupError`` and takes the view down; and Rich passes
ESC through, so ``\\x1b]52;...`` (OSC 52: write the clipboard), ``\\x1b[2J`` (clear the screen) or
a bare ``\\r`` would act on the operator's terminal. Every renderer passes such text through
:func:`safe_text` first; nothing else in the launcher or the CLI sanitizes text on its own.
"""

from __future__ import annotations

import re

from rich.markup import escape

__all__ = ["safe_text"]

#: ESC sequences (7-bit): CSI (``ESC [ ... final``), OSC/DCS/SOS/PM/APC strings up to their
#: terminator (BEL or ST) or the end of the text, and two-character escapes (``ESC c``, ``ESC 7``)
_ESC_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # nF / Fp / Fe / Fs escapes (and a lone ESC)
    # the same in their 8-bit (C1) forms
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
)
#: what is left after the sequences: C0 but \t \n \r (handled below), DEL, C1, and the Unicode
#: bidirectional overrides and isolates (they reorder what the operator reads: "Trojan Source")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NEWLINES = re.compile(r"\r\n?|\n")


def safe_text(
    value: object, limit: int | None = 200, *, markup: bool = True, multiline: bool = False
) -> str:
    """``value`` as text fit for a terminal renderer.

    - ``str(value)`` (``None`` is ``""``);
    - terminal escape sequences (CSI, OSC, DCS, ..., 7-bit and C1 forms) are removed whole, then
      every other control character: C0, DEL, C1 and the bidi overrides/isolates;
    - single-line (default): ``\\t``, ``\\r`` and ``\\n`` become spaces; ``multiline=True`` keeps
      line breaks (``\\r\\n`` and a bare ``\\r`` become ``\\n``; ``\\t`` stays);
    - at most ``limit`` characters (``None``: no bound), the last one ``…`` when cut;
    - ``markup=True`` (for a ``str`` that Rich parses: ``console.print``, table cells, panel
      titles, ``Text.from_markup``): Rich markup is escaped, so ``[/]`` prints as ``[/]``.
      ``markup=False`` for a ``rich.text.Text`` (never parsed), a ``markup=False`` print, a log
      line or a file: the text is only cleaned, not escaped.
    """
    text = "" if value is None else value if isinstance(value, str) else str(value)
    text = _CONTROL.sub("", _ESC_SEQUENCE.sub("", text))
    if multiline:
        text = _NEWLINES.sub("\n", text)
    else:
        text = text.replace("\r\n", " ").translate(_SPACES)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 0)] + "…"
    return escape(text) if markup else text


_SPACES = str.maketrans({"\t": " ", "\n": " ", "\r": " "})
