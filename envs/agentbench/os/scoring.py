"""AgentBench os_interaction rules: action parsing, output truncation and the match/check judge.

Behaviour follows AgentBench v0.2 (``src/server/tasks/os_interaction/task.py``):

* actions: the *last* ``Act:`` line that names a known action wins; ``bash`` takes every
  ```` ```bash ```` block of the reply (joined by a blank line); ``finish`` commits no answer;
  ``answer(...)`` commits the text between the first ``(`` and the last ``)``;
* command output longer than 800 characters keeps 780 and a truncation notice;
* ``match``: the (stripped, when ``strip``) answer equals ``answer``, or ``regex`` is found in it;
* ``check``: a chain of scripts run as independent processes; step *i* receives the answer and the
  outputs of steps 0..i-1 as arguments; a ``null`` step runs the example script; every step must
  exit 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

OUTPUT_LIMIT = 800
OUTPUT_KEEP = 780
TRUNCATION_NOTICE = "\n[truncated because the output is too long]"

_ACT = re.compile(r"Act:\s*(.+)")
_THINK = re.compile(r"Think:\s*(.+)")
_BASH_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class OSAction:
    kind: str | None  # "bash", "commit" or None (no valid action)
    content: str | None = None
    thought: str = ""


def parse_action(reply: str) -> OSAction:
    thought = "\n".join(_THINK.findall(reply))
    for act in reversed(_ACT.findall(reply)):
        low = act.lower()
        if low.startswith("bash"):
            return OSAction("bash", "\n\n".join(_BASH_BLOCK.findall(reply)), thought)
        if low.startswith("finish"):
            return OSAction("commit", None, thought)
        if low.startswith("answer"):
            rest = act[6:].strip()
            left, right = rest.find("("), rest.rfind(")")
            if left == -1 or right == -1:
                continue
            return OSAction("commit", rest[left + 1 : right], thought)
    return OSAction(None, None, thought)


def truncate_output(text: str) -> str:
    if len(text) > OUTPUT_LIMIT:
        return text[:OUTPUT_KEEP] + TRUNCATION_NOTICE
    return text


def observation_for(output: str) -> str:
    out = truncate_output(output)
    return ("The output of the OS:\n\n" + out) if out else "The output of the OS is empty."


def script_argv(script: list[str] | tuple[str, str], params: list[str]) -> list[str]:
    """argv that runs an AgentBench script object with ``params`` (as AgentBench invokes it)."""
    language, code = script
    if language == "bash":
        return ["bash", "-c", code, *(["--", *params] if params else [])]
    if language == "python":
        return ["python3", "-c", code, *params]
    raise ValueError(f"unsupported script language {language!r} (expected bash or python)")


def judge(answer: str | None, payload: dict[str, Any], sandbox) -> tuple[bool, str]:
    """(passed, note) for a committed ``answer`` in the task's still-running ``sandbox``."""
    match = payload.get("match")
    if match:
        if isinstance(answer, str) and match.get("strip", False):
            answer = answer.strip()
        if "answer" in match:
            return answer == match["answer"], "match"
        if "regex" in match:
            ok = answer is not None and re.search(match["regex"], answer) is not None
            return ok, "regex"
        return False, "match without answer or regex"
    check = payload.get("check")
    if not check:
        return False, "no evaluation"
    params = [str(answer)]
    for i, step in enumerate(check):
        script = payload.get("example") if step is None else step
        if script is None:
            return False, f"check step {i} is null and there is no example"
        result = sandbox.run(script_argv(script, params), timeout=60)
        if result.exit_code != 0:
            return False, f"check step {i} exited {result.exit_code}"
        params.append(result.text)
    return True, "check"
