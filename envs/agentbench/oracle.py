"""Reference replies for AgentBench samples: what a perfect agent would say, turn by turn.

Why it exists: replaying each sample's reference solution (dbbench: the gold answers or the gold SQL;
os_interaction: the example script, then the expected answer; alfworld: the game's walkthrough, one
command per round) validates the harness itself. On a correct harness every sample whose reference is
right passes, so the dev-split figures (dbbench 60/60, os_interaction 25/26, alfworld 20/20) are a
check of the envs, the data loading and AgentBench's scoring.

This module only knows the data: it turns a payload and the latest observation into reply text. The
evaluation drives it through a scripted inference engine and the same workflow as training, so the
replies travel the same path a policy's tokens do.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

FAMILIES = ("dbbench", "os", "alfworld")
_OS_OUTPUT = "The output of the OS:\n\n"


class OracleEpisode:
    """The reference replies of one sample; call :meth:`reply` once per turn."""

    def __init__(self, family: str, payload: dict[str, Any]):
        if family not in FAMILIES:
            raise ValueError(f"unknown AgentBench family {family!r}; expected one of {FAMILIES}")
        self.family = family
        self.payload = payload
        self.turn = 0

    def reply(self, observation: str) -> str:
        """The reference reply to ``observation`` (the env's latest observation text)."""
        self.turn += 1
        if self.family == "alfworld":
            return self._alfworld()
        return self._db() if self.family == "dbbench" else self._os(observation)

    def _alfworld(self) -> str:
        """The walkthrough's next command in AgentBench's reply format (json_2.1.1 wording)."""
        steps = self.payload.get("walkthrough") or []
        if self.turn > len(steps):
            return "THOUGHT: The walkthrough is over.\n ACTION: look"
        return f"ACTION: {steps[self.turn - 1]}"

    def _db(self) -> str:
        p = self.payload
        if p["type"] in ("INSERT", "UPDATE", "DELETE"):
            if self.turn == 1:
                return (
                    "Running the reference SQL.\nAction: Operation\n```sql\n"
                    + p["label"][0]
                    + "\n```"
                )
            return 'Done.\nAction: Answer\nFinal Answer: ["done"]'
        return "Action: Answer\nFinal Answer: " + json.dumps(list(p["label"]), ensure_ascii=False)

    def _os(self, observation: str) -> str:
        p = self.payload
        if p.get("match") and "answer" in p["match"]:
            return f"Think: I know the answer.\n\nAct: answer({p['match']['answer']})"
        solution = p.get("solution")
        if solution is None:
            return "Think: I have no reference solution.\n\nAct: finish"
        if self.turn == 1:
            language, code = solution
            if language == "python":
                code = "python3 -c " + shlex.quote(code)
            return f"Think: Run the reference script.\n\nAct: bash\n\n```bash\n{code}\n```"
        if p.get("check") and any(step is None for step in p["check"]):
            output = observation[len(_OS_OUTPUT) :] if observation.startswith(_OS_OUTPUT) else ""
            return f"Think: The output is the answer.\n\nAct: answer({output.strip()})"
        return "Think: The job is done.\n\nAct: finish"
