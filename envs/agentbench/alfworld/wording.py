"""Undo ALFWorld's json_2.1.2 text patch, so games speak AgentBench v0.2's wording.

Why: AgentBench v0.2 ran ALFWorld's json_2.1.1 games, and its one-shot prompts use their wording
(``put X in/on Y``, "You put the X in/on the Y.", "You arrive at loc N. ..."). ALFWorld later
patched every game file (``scripts/patch_tw-pddl.py``, json_2.1.2): the place command became
``move X to Y``, "go to" answers "You arrive at cabinet 1. ...", and a ``help`` action appeared.
A model prompted with v0.2's examples but answered in the new wording would be scored on a
different game, so scores would not compare with AgentBench's.

The patch is pure text substitution, so it is undone here exactly: the ``help`` action is cut from
the PDDL domain and from the grammar, the three grammar strings are swapped back, and ``move X to
Y`` in the walkthrough becomes ``put X in/on Y``. :func:`to_v02` checks that re-applying the patch
to its result gives back the input, so a game it cannot invert exactly is refused, never
half-converted.
"""

from __future__ import annotations

import re
from typing import Any

from astraflow.errors import AstraFlowError

#: Text ALFWorld's patch inserts before the domain's last ")" (verbatim from the patch script).
HELP_ACTION_PDDL = """\
(:action help
    :parameters (?a - agent)
    :precondition
        ()
    :effect
        (and
            (checked ?a)
        )
)
"""

#: Text ALFWorld's patch appends to the grammar (verbatim from the patch script).
HELP_GRAMMAR = """
action help {
    template :: "help";
    feedback :: "
Available commands:
  look:                             look around your current location
  inventory:                        check your current inventory
  go to (receptacle):               move to a receptacle
  open (receptacle):                open a receptacle
  close (receptacle):               close a receptacle
  take (object) from (receptacle):  take an object from a receptacle
  move (object) to (receptacle):  place an object in or on a receptacle
  examine (something):              examine a receptacle or an object
  use (object):                     use an object
  heat (object) with (receptacle):  heat an object using a receptacle
  clean (object) with (receptacle): clean an object using a receptacle
  cool (object) with (receptacle):  cool an object using a receptacle
  slice (object) with (object):     slice an object using a sharp object
";
}
"""

#: The patch's grammar substitutions as (json_2.1.1 text, json_2.1.2 text).
GRAMMAR_SWAPS = (
    ("You arrive at {lend.name}.", "You arrive at {r.name}."),
    ("put {o} in/on {r}", "move {o} to {r}"),
    ("You put the {o.name} in/on the {r.name}.", "You move the {o.name} to the {r.name}."),
)

_MOVE = re.compile(r"^move (?P<obj>.+?) to (?P<recep>.+)$")


class WordingError(AstraFlowError, ValueError):
    """A game whose text is neither ALFWorld's json_2.1.1 wording nor exactly its 2.1.2 patch."""


def is_patched(game: dict[str, Any]) -> bool:
    """True for a game in the json_2.1.2 wording (it carries the patch's ``help`` action)."""
    return str(game.get("grammar", "")).endswith(HELP_GRAMMAR)


def to_v02(game: dict[str, Any], where: str = "game") -> dict[str, Any]:
    """``game`` (a ``game.tw-pddl`` dict) in json_2.1.1 wording, as AgentBench v0.2 played it.

    A game already in that wording is returned unchanged (a copy). Raises :class:`WordingError`
    naming ``where`` when the game carries only part of the patch or cannot be inverted exactly.
    """
    for key in ("pddl_domain", "grammar", "pddl_problem"):
        if not isinstance(game.get(key), str):
            raise WordingError(f"{where}: a game.tw-pddl needs the text field {key!r}")
    out = dict(game)
    domain, grammar = game["pddl_domain"], game["grammar"]
    has_help_action = HELP_ACTION_PDDL in domain
    if not is_patched(game):
        if has_help_action:
            raise WordingError(
                f"{where}: the PDDL domain has the 2.1.2 help action, the grammar not"
            )
        out["walkthrough"] = list(game.get("walkthrough") or [])
        return out
    if not has_help_action:
        raise WordingError(f"{where}: the grammar has the 2.1.2 help action, the PDDL domain not")
    cut = domain.rfind(HELP_ACTION_PDDL + ")")
    after = domain[cut + len(HELP_ACTION_PDDL) + 1 :]
    if cut < 0 or ")" in after:
        raise WordingError(f"{where}: the help action is not where ALFWorld's patch puts it")
    out["pddl_domain"] = domain[:cut] + ")" + after
    grammar = grammar[: -len(HELP_GRAMMAR)]
    for old, new in GRAMMAR_SWAPS:
        grammar = grammar.replace(new, old)
    out["grammar"] = grammar
    out["walkthrough"] = [walkthrough_command_v02(c) for c in game.get("walkthrough") or []]
    if to_v212(out) != {k: game[k] for k in ("pddl_domain", "grammar")}:
        raise WordingError(f"{where}: the 2.1.2 wording cannot be inverted exactly")
    return out


def to_v212(game: dict[str, Any]) -> dict[str, str]:
    """ALFWorld's patch applied to a json_2.1.1 game's domain and grammar (the round-trip check)."""
    before, after = game["pddl_domain"].rsplit(")", 1)
    grammar = game["grammar"]
    for old, new in GRAMMAR_SWAPS:
        grammar = grammar.replace(old, new)
    return {"pddl_domain": f"{before}{HELP_ACTION_PDDL}){after}", "grammar": grammar + HELP_GRAMMAR}


def walkthrough_command_v02(command: str) -> str:
    """``move X to Y`` -> ``put X in/on Y``; every other command is worded the same in both."""
    m = _MOVE.match(command)
    return f"put {m['obj']} in/on {m['recep']}" if m else command
