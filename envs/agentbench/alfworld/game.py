"""One ALFWorld game running in TextWorld, set up as AgentBench v0.2 evaluates it.

AgentBench builds ALFWorld's ``AlfredTWEnv`` for evaluation: TextWorld's PDDL engine with the
``AlfredDemangler`` wrapper (object ids -> "mug 1", "cabinet 3", never shuffled when evaluating)
and the infos ``won`` and ``admissible_commands``. This module builds the same stack from a task
payload's game text (no file needed: TextWorld's ``PddlEnv`` loads a dict).

``alfworld`` and ``textworld[pddl]`` are an optional extra (``pip install 'astraflow[alfworld]'``);
:func:`require_textworld` says exactly what is missing.
"""

from __future__ import annotations

from typing import Any

INSTALL_HINT = "pip install 'astraflow[alfworld]' (alfworld==0.4.2 and textworld[pddl]; builds with g++ and cmake)"


def require_textworld() -> str:
    """The versions in use ("alfworld 0.4.2, textworld 1.7.0"); ImportError with the fix if absent."""
    try:
        import alfworld.info
        import fast_downward  # noqa: F401  (textworld[pddl]'s planner library)
        import nltk  # noqa: F401  (AgentBench matches replies to commands by BLEU)
        import textworld
    except ImportError as exc:
        raise ImportError(
            f"the ALFWorld env needs the packages alfworld, textworld[pddl] and nltk ({exc}); "
            f"install them with: {INSTALL_HINT}"
        ) from None
    return f"alfworld {alfworld.info.__version__}, textworld {textworld.__version__}"


class Game:
    """A running game: :meth:`reset` gives the intro and the admissible commands, :meth:`step`
    the feedback, whether the goal is reached, whether the game is over, the new commands."""

    def __init__(self, game: dict[str, Any]):
        require_textworld()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv

        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        self._env = AlfredDemangler(shuffle=False)(PddlEnv(infos))
        self._env.load(
            {k: game[k] for k in ("pddl_domain", "grammar", "pddl_problem")}
            | {"walkthrough": list(game.get("walkthrough") or [])}
        )

    def reset(self) -> tuple[str, list[str]]:
        state = self._env.reset()
        return state.feedback, list(state["admissible_commands"])

    def step(self, command: str) -> tuple[str, bool, bool, list[str]]:
        state, _score, done = self._env.step(command)
        return state.feedback, bool(state["won"]), bool(done), list(state["admissible_commands"])

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.close()


def open_game(task: dict[str, Any]) -> Game:
    return Game(task)
