"""One ALFWorld game running in TextWorld, set up as AgentBench v0.2 evaluates it.

AgentBench builds ALFWorld's ``AlfredTWEnv`` for evaluation: TextWorld's PDDL engine with the
``AlfredDemangler`` wrapper (object ids -> "mug 1", "cabinet 3", never shuffled when evaluating)
and the infos ``won`` and ``admissible_commands``. This module builds the same stack from a task
payload's game text (no file needed: TextWorld's ``PddlEnv`` loads a dict).

``alfworld`` and ``textworld[pddl]`` are an optional extra (``pip install 'astraflow[alfworld]'``);
:func:`require_textworld` says exactly what is missing.

Thread safety: envs run in a rollout node's thread pool, but TextWorld's PDDL stack is not
thread-safe (two games loading at once fail to parse their grammars: the parser and the planner's
translator keep module-level state). Every call into it holds :data:`TEXTWORLD_LOCK`. It costs no
parallelism: the work is pure Python under the GIL. Each running game needs a private copy of the
planner library (``fast_downward.load_lib`` copies the ``.so`` before loading it, since the
planner keeps its task in C globals), and TextWorld loads a new copy per game and never unloads it:
one leaked library per episode. Unloading (``dlclose``) crashes the process at exit (the library's
thread-exit destructors outlive it), so a closed game hands its copy back to a pool
(:class:`PlannerLibraries`) and the next game reuses it: as many copies as games ever ran at once.
"""

from __future__ import annotations

import threading
from typing import Any

#: Serialises every call into TextWorld/ALFWorld in this process (see the module docstring).
TEXTWORLD_LOCK = threading.RLock()


class PlannerLibraries:
    """Loaded copies of fast-downward's library not in use by a game (guarded by the lock)."""

    def __init__(self) -> None:
        self.free: list[Any] = []

    def take(self) -> Any:
        import fast_downward

        with TEXTWORLD_LOCK:
            return self.free.pop() if self.free else fast_downward.load_lib()

    def give_back(self, lib: Any) -> None:
        with TEXTWORLD_LOCK:
            self.free.append(lib)


#: The process's pool: the libraries are process-wide resources, like the lock.
PLANNER_LIBRARIES = PlannerLibraries()

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

        self._lib: Any = None
        self._env: Any = None
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        data = {k: game[k] for k in ("pddl_domain", "grammar", "pddl_problem")}
        data["walkthrough"] = list(game.get("walkthrough") or [])
        with TEXTWORLD_LOCK:
            self._lib = PLANNER_LIBRARIES.take()
            try:
                self._env = AlfredDemangler(shuffle=False)(_pddl_env(infos, self._lib))
                self._env.load(data)
            except BaseException:
                self.close()
                raise

    def reset(self) -> tuple[str, list[str]]:
        with TEXTWORLD_LOCK:
            state = self._env.reset()
        return state.feedback, list(state["admissible_commands"])

    def step(self, command: str) -> tuple[str, bool, bool, list[str]]:
        with TEXTWORLD_LOCK:
            state, _score, done = self._env.step(command)
        return state.feedback, bool(state["won"]), bool(done), list(state["admissible_commands"])

    def close(self) -> None:
        """Hand this game's planner library back to the pool (idempotent)."""
        lib, self._lib, self._env = self._lib, None, None
        if lib is not None:
            PLANNER_LIBRARIES.give_back(lib)


def _pddl_env(infos: Any, lib: Any) -> Any:
    """TextWorld's ``PddlEnv`` on a given planner library (its own ``__init__`` loads a new copy;
    the rest of that ``__init__`` is the base class's)."""
    import textworld
    from textworld.envs.pddl import PddlEnv

    env = PddlEnv.__new__(PddlEnv)
    textworld.Environment.__init__(env, infos)
    env.downward_lib = lib
    return env


def open_game(task: dict[str, Any]) -> Game:
    return Game(task)
