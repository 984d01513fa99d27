"""AgentBench v0.2's ALFWorld protocol: the conversation it opens with, how it reads the agent's
reply, and how it cleans the game's answers (``src/server/tasks/alfworld/task.py`` and ``utils.py``).

The texts are AgentBench's, character for character (typos included), because the score of a model
depends on them. The conversation is: the instruction (user), a fixed acknowledgement (agent), the
task type's one-shot dialogue (alternating user/agent, its first message prefixed "Here is one
example."), then "Here is your task. " + the game's opening + the available actions (user).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

#: AgentBench v0.2's ``get_task_instruction()``.
INSTRUCTION = (
    "Interact with a household to solve a task. Imagine you are an intelligent agent in a "
    "household environment and your target is to perform actions to complete the task goal. At "
    "the beginning of your interactions, you will be given the detailed description of the current "
    "environment and your goal to accomplish. For each of your turn, you will be given a list of "
    'actions which you can choose one to perform in this turn. You should choose from two actions: "'
    'THOUGHT" or "ACTION". If you choose "THOUGHT", you should first think about the current '
    "condition and plan for your future actions, and then output your action in this turn. Your "
    'output must strictly follow this format:"THOUGHT: your thoughts.\n ACTION: your next action\n"'
    '; If you choose "ACTION", you should directly output the action in this turn. Your output '
    'must strictly follow this format:"ACTION: your next action\n". After your each turn, the '
    "environment will give you immediate feedback based on which you plan your next few steps. if "
    'the environment output "Nothing happened", that means the previous action is invalid and you '
    "should try more options.\n Reminder: \n1. the action must be chosen from the given available "
    "actions. Any actions except provided available actions will be regarded as illegal. \n2. Think "
    "when necessary, try to act directly more in the process.\n\n"
)
ACKNOWLEDGEMENT = "OK. I'll follow your instructions and try my best to solve the task."
EXAMPLE_PREFIX = "Here is one example.\n"
TASK_PREFIX = "Here is your task. "
#: AgentBench v0.2's ``alfworld.yaml``: ``max_step: 35`` (the task's own default is 50).
MAX_STEP = 35
#: ALFWorld task-type folder prefix -> key of the one-shot dialogue in the prompts file.
PREFIXES = {
    "pick_and_place": "put",
    "pick_clean_then_place": "clean",
    "pick_heat_then_place": "heat",
    "pick_cool_then_place": "cool",
    "look_at_obj": "examine",
    "pick_two_obj": "puttwo",
}
#: The prompts file AgentBench v0.2's config names (``alfworld_multiturn_plan_first.json``).
DEFAULT_PROMPTS = "alfworld_multiturn_plan_first.json"
#: A reply's action must score above this BLEU against its closest admissible command.
BLEU_LIMIT = 0.01

_ACTION = re.compile("ACTION:(.*)")
_ARRIVE = "You arrive at loc "


def prompt_key(game_name: str) -> str:
    """The one-shot dialogue for a game folder (``pick_and_place_simple-Mug-...`` -> ``put``)."""
    for prefix, key in PREFIXES.items():
        if game_name.startswith(prefix):
            return key
    raise ValueError(
        f"unsupported ALFWorld game {game_name!r}: its folder must start with one of "
        f"{', '.join(PREFIXES)}"
    )


def opening_messages(example: list[str], observation: str, admissible: list[str]):
    """The whole conversation up to the agent's first action, as chat messages."""
    messages = [
        {"role": "user", "content": INSTRUCTION},
        {"role": "assistant", "content": ACKNOWLEDGEMENT},
    ]
    for i, text in enumerate(example):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": (EXAMPLE_PREFIX + text) if i == 0 else text})
    messages.append({"role": "user", "content": task_message(observation, admissible)})
    return messages


def task_message(observation: str, admissible: list[str]) -> str:
    return TASK_PREFIX + observation + available_actions(admissible)


def available_actions(admissible: list[str]) -> str:
    return " AVAILABLE ACTIONS: " + "\n".join(admissible) + "\n"


def opening_observation(intro: str) -> str:
    """The game's intro without its "-= Welcome to TextWorld, ALFRED! =-" banner."""
    return "\n".join(intro.split("\n\n")[1:])


def process_ob(observation: str) -> str:
    """Drop the "You arrive at loc N. " prefix of a "go to" answer (json_2.1.1 wording)."""
    if observation.startswith(_ARRIVE):
        observation = observation[observation.find(". ") + 2 :]
    return observation


def process_action(output: str, choices: list[str], limit: float = BLEU_LIMIT) -> str | None:
    """The command a reply means, as AgentBench reads it; None when it has no ``ACTION:``.

    The text after the first ``ACTION:`` (to the end of that line), stripped and lower-cased, is
    taken as is when admissible; otherwise the admissible command with the highest sentence BLEU
    (NLTK, smoothing method 4) when that exceeds ``limit``; otherwise the text itself (which the
    game answers with "Nothing happens."). An empty action is returned as "" (AgentBench treats
    it as invalid too).
    """
    match = _ACTION.search(output)
    if not match:
        return None
    action = match.group(1).strip().lower().split("\n")[0]
    if not action or not choices or action in choices:
        return action
    scores = [bleu_score(choice, action) for choice in choices]
    best = max(range(len(scores)), key=scores.__getitem__)  # first maximum, as numpy's argmax
    return choices[best] if scores[best] > limit else action


def bleu_score(reference: str, candidate: str) -> float:
    from nltk.translate.bleu_score import sentence_bleu

    return float(
        sentence_bleu([reference.split()], candidate.split(), smoothing_function=_smoothing())
    )


@lru_cache(maxsize=1)
def _smoothing() -> Any:
    from nltk.translate.bleu_score import SmoothingFunction

    return SmoothingFunction().method4


def repeated(outputs: list[str], window: int = 3) -> bool:
    """AgentBench's failure test: more than ``window`` rounds and the last ``window`` replies equal."""
    return len(outputs) > window and len(set(outputs[-window:])) == 1
