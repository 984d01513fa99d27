"""``astraflow/AgentBench-ALFWorld-v0``: AgentBench v0.2's ALFWorld task as a multi-turn text env.

Each episode plays one TextWorld-PDDL game (:mod:`.game`) in the wording AgentBench v0.2 used.
The conversation opens as AgentBench's does (instruction, acknowledgement, the task type's one-shot
dialogue, then the task with its available actions; :mod:`.protocol`); ``info["messages"]`` holds it
as chat turns (the ``single_agent`` workflow renders those), the observation is the same text
flattened for consumers that read text only. Each reply is read as AgentBench reads it (the text
after ``ACTION:``, matched to an admissible command by BLEU), the game's answer comes back with the
new available actions. The episode ends as in AgentBench: the game is won or over (``completed``),
a reply without ``ACTION:`` or the same reply three rounds running (``agent invalid action``), or
35 rounds (``task limit reached``). Reward 1 when the game is won, else 0.
"""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.envs.agentbench.alfworld import protocol
from astraflow.envs.agentbench.status import SampleStatus
from astraflow.envs.base import TaskError, TextEnv

#: The two-line protocol for small-context models (the tiny CPU starter policy, a 256-token
#: character-level context): the goal only, no room description, no one-shot dialogue and no lists
#: of available actions. Not AgentBench's prompt.
COMPACT_INSTRUCTIONS = 'Act with "ACTION: <command>", e.g. "ACTION: go to cabinet 1".\n{goal}'


class AgentBenchALFWorldEnv(TextEnv):
    family = "agentbench"
    description = "AgentBench v0.2 ALFWorld (household): play a TextWorld-PDDL game to its goal"
    action_format = (
        "'ACTION: <command>' (optionally after 'THOUGHT: ...'); the command is matched to the "
        "closest available action by BLEU, as AgentBench does"
    )
    reward_doc = (
        "1.0 when the game's goal is reached within 35 rounds (AgentBench's max_step), else 0.0"
    )
    task_fields: ClassVar[dict[str, str]] = {
        "id": "sample id",
        "name": "game folder/trial (e.g. pick_and_place_simple-Mug-None-Desk-308/trial_...)",
        "type": "one-shot dialogue key: put, clean, heat, cool, examine or puttwo",
        "pddl_domain": "the game's PDDL domain (json_2.1.1 wording)",
        "grammar": "the game's TextWorld grammar (json_2.1.1 wording)",
        "pddl_problem": "the game's PDDL problem",
        "example": "optional: the one-shot dialogue (alternating user/agent messages)",
        "walkthrough": "optional: a winning command sequence (the oracle replays it)",
    }

    def __init__(
        self,
        max_turns: int = protocol.MAX_STEP,
        prompt_style: str = "full",
        data_dir: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if prompt_style not in ("full", "compact"):
            raise ValueError(f"prompt_style must be 'full' or 'compact', got {prompt_style!r}")
        self.prompt_style = prompt_style
        self._data_dir = data_dir
        self._game = None
        self._sample_tasks: list[dict[str, Any]] | None = None
        self.admissible: list[str] = []
        self.outputs: list[str] = []
        self.status = SampleStatus.RUNNING

    def sample_task(self, rng) -> dict[str, Any]:
        """A dev game (ALFWorld games are data, not generated): needs the AgentBench data folder."""
        if self._sample_tasks is None:
            from astraflow.envs.agentbench.data import load_alfworld

            try:
                self._sample_tasks = load_alfworld(self._data_dir, "dev")
            except ValueError as exc:
                raise TaskError(f"ALFWorld sample tasks come from the dev games: {exc}") from None
        return self._sample_tasks[int(rng.integers(len(self._sample_tasks)))]

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        from astraflow.envs.agentbench.alfworld.game import open_game

        self.close()
        self._game = open_game(task)
        intro, self.admissible = self._game.reset()
        self.outputs = []
        self.status = SampleStatus.RUNNING
        observation = protocol.opening_observation(intro)
        info: dict[str, Any] = {"sample_id": task.get("id"), "type": task.get("type")}
        if self.prompt_style == "compact":
            return COMPACT_INSTRUCTIONS.format(goal=observation.rsplit("\n", 1)[-1]), info
        messages = protocol.opening_messages(
            list(task.get("example") or []), observation, self.admissible
        )
        info["messages"] = messages
        return "\n\n".join(m["content"].strip("\n") for m in messages), info

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        info: dict[str, Any] = {"sample_id": self.task.get("id"), "type": self.task.get("type")}
        command = protocol.process_action(action, self.admissible)
        if not command:
            return self._finish(SampleStatus.AGENT_INVALID_ACTION, info, won=False)
        feedback, won, done, self.admissible = self._game.step(command)
        self.outputs.append(action)
        info["action"] = command
        if protocol.repeated(self.outputs):
            return self._finish(SampleStatus.AGENT_INVALID_ACTION, info, won=False)
        if done:
            return self._finish(SampleStatus.COMPLETED, info, won=won)
        if self.turn >= self.max_turns:
            return self._finish(SampleStatus.TASK_LIMIT_REACHED, info, won=False)
        observation = protocol.process_ob(feedback)
        if self.prompt_style == "full":
            observation += protocol.available_actions(self.admissible)
        return observation, 0.0, False, info

    def _finish(self, status: SampleStatus, info: dict[str, Any], won: bool):
        self.status = status
        info.update(status=status.value, success=won, won=won, rounds=len(self.outputs))
        self.close()
        return "", 1.0 if won else 0.0, True, info

    def abort(self, status: SampleStatus) -> dict[str, Any]:
        """End the episode from outside (e.g. the agent's context is full) as a failure."""
        info = {"sample_id": self.task.get("id"), "type": self.task.get("type")}
        return self._finish(status, info, won=False)[3]

    def close(self) -> None:
        game, self._game = self._game, None
        if game is not None:
            game.close()
