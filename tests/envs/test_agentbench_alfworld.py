"""AgentBench ALFWorld: the wording is put back exactly, the payloads, AgentBench's reading of
replies, the env on real TextWorld games (protocol, endings, scoring), the chat opening through the
workflow, and `astraflow eval agentbench --tasks alfworld` with the oracle winning every dev game."""

from __future__ import annotations

import json

import pytest
from agentbench_helpers import need_alfworld, need_alfworld_data
from astraflow.envs.agentbench.alfworld import protocol
from astraflow.envs.agentbench.alfworld.wording import (
    HELP_ACTION_PDDL,
    HELP_GRAMMAR,
    WordingError,
    to_v02,
    to_v212,
)

MINI_V211 = {
    "pddl_domain": "(define (domain alfred)\n (:action GotoLocation)\n)\n",
    "grammar": (
        'action GotoLocation { feedback :: "You arrive at {lend.name}. #x#"; }\n'
        'action PutObject { template :: "put {o} in/on {r}"; }\n'
        '"rhs": "You put the {o.name} in/on the {r.name}."\n'
    ),
    "pddl_problem": "(define (problem p))",
    "walkthrough": ["go to desk 1", "put mug 1 in/on desk 1"],
}


def _patched(game):
    """ALFWorld's own patch (scripts/patch_tw-pddl.py), applied to a json_2.1.1 game."""
    out = dict(game, **to_v212(game))
    out["walkthrough"] = [
        c.replace("put ", "move ", 1).replace(" in/on ", " to ") for c in game["walkthrough"]
    ]
    return out


def test_wording_patch_is_undone_exactly():
    patched = _patched(MINI_V211)
    assert "move {o} to {r}" in patched["grammar"] and "action help" in patched["pddl_domain"]
    back = to_v02(patched, "mini")
    assert {k: back[k] for k in MINI_V211} == MINI_V211
    # a game already in the old wording passes unchanged
    assert to_v02(MINI_V211) == MINI_V211


@pytest.mark.parametrize(
    "broken, message",
    [
        (
            lambda g: dict(g, grammar=g["grammar"][: -len(HELP_GRAMMAR)]),
            "PDDL domain has the 2.1.2",
        ),
        (
            lambda g: dict(g, pddl_domain=g["pddl_domain"].replace(HELP_ACTION_PDDL, "")),
            "grammar has the 2.1.2",
        ),
        (lambda g: dict(g, pddl_domain=g["pddl_domain"] + ")"), "not where ALFWorld's patch"),
        (lambda g: {"grammar": g["grammar"]}, "needs the text field 'pddl_domain'"),
    ],
)
def test_wording_refuses_what_it_cannot_invert(broken, message):
    with pytest.raises(WordingError, match=message):
        to_v02(broken(_patched(MINI_V211)), "mini")


def test_every_shared_game_round_trips_to_agentbench_wording():
    data = need_alfworld_data()
    root = data / "alfworld"
    paths = [p for split in ("dev", "train") for ps in json.loads((root / f"{split}.json").read_text()).values() for p in ps]  # fmt: skip
    assert len(paths) == 320
    for rel in paths:
        game = json.loads((root / "games" / rel).read_text())
        old = to_v02(game, rel)
        assert to_v212(old) == {k: game[k] for k in ("pddl_domain", "grammar")}
        assert "put {o} in/on {r}" in old["grammar"] and "move {o} to {r}" not in old["grammar"]
        assert "You arrive at {lend.name}." in old["grammar"]
        assert not any(c.startswith("move ") for c in old["walkthrough"])
        assert len(old["walkthrough"]) == len(game["walkthrough"])


def test_payloads_carry_the_whole_task():
    from astraflow.envs.agentbench.data import DataError, load_alfworld
    from astraflow.tasks.catalog import default_task_sets

    data = need_alfworld_data()
    dev = load_alfworld(data, "dev")
    assert len(dev) == 20 and len({p["id"] for p in dev}) == 20
    assert {p["type"] for p in dev} == {"put", "clean", "heat", "cool", "examine", "puttwo"}
    prompts = json.loads(
        (data / "alfworld" / "prompts" / protocol.DEFAULT_PROMPTS).read_text(encoding="utf-8")
    )
    for p in dev:
        assert p["example"] == prompts[p["type"]]
        assert (
            p["name"]
            .split("/")[0]
            .startswith(next(k for k, v in protocol.PREFIXES.items() if v == p["type"]))
        )
        assert p["walkthrough"] and not any(c.startswith("move ") for c in p["walkthrough"])
    assert sum(c.startswith("put ") and " in/on " in c for p in dev for c in p["walkthrough"]) == 18
    assert len(load_alfworld(data, "train")) == 300
    with pytest.raises(DataError, match="standard.json"):
        load_alfworld(data, "standard")
    with pytest.raises(DataError, match="must be one of dev, train, standard"):
        load_alfworld(data, "test")
    info = default_task_sets().info("agentbench_alfworld")
    assert info.default_env == "astraflow/AgentBench-ALFWorld-v0" and "train" in info.splits


def test_replies_are_read_as_agentbench_reads_them():
    pytest.importorskip("nltk", reason="nltk is part of the alfworld extra")
    choices = ["go to cabinet 1", "go to cabinet 2", "open drawer 1", "take mug 1 from desk 1"]
    read = protocol.process_action
    assert read("THOUGHT: find it.\n ACTION: go to cabinet 2\n", choices) == "go to cabinet 2"
    assert read("ACTION:  Open Drawer 1", choices) == "open drawer 1"
    assert read("ACTION: take the mug 1 from the desk 1", choices) == "take mug 1 from desk 1"
    assert read("ACTION: fly away", choices) == "fly away"  # no overlap: passed on as is
    assert read("go to cabinet 1", choices) is None
    assert read("ACTION:   ", choices) == ""
    assert protocol.process_ob("You arrive at loc 12. On the desk 1, you see a mug 1.") == (
        "On the desk 1, you see a mug 1."
    )
    assert not protocol.repeated(["a", "a", "a"]) and protocol.repeated(["b", "a", "a", "a"])


def _env(**kwargs):
    from astraflow.envs.agentbench.alfworld.env import AgentBenchALFWorldEnv

    return AgentBenchALFWorldEnv(**kwargs)


def _dev(data, type_="put"):
    from astraflow.envs.agentbench.data import load_alfworld

    return next(p for p in load_alfworld(data, "dev") if p["type"] == type_)


def test_env_opens_like_agentbench_and_the_walkthrough_wins():
    need_alfworld()
    data = need_alfworld_data()
    task = _dev(data, "put")
    env = _env()
    obs, info = env.reset(options={"task": task})
    messages = info["messages"]
    assert [m["role"] for m in messages[:3]] == ["user", "assistant", "user"]
    assert messages[0]["content"] == protocol.INSTRUCTION
    assert messages[1]["content"] == protocol.ACKNOWLEDGEMENT
    assert messages[2]["content"] == "Here is one example.\n" + task["example"][0]
    assert [m["content"] for m in messages[3:-1]] == task["example"][1:]
    last = messages[-1]["content"]
    assert last.startswith("Here is your task. You are in the middle of a room.")
    assert "Welcome to TextWorld" not in last and "\nYour task is to: put " in last
    assert " AVAILABLE ACTIONS: " in last and "\ngo to toilet 1\n" in last and "help" not in last
    assert obs.startswith(protocol.INSTRUCTION.strip("\n")) and obs.endswith(last.strip("\n"))
    steps = task["walkthrough"]
    for i, command in enumerate(steps):
        obs, reward, terminated, truncated, info = env.step(f"THOUGHT: next.\n ACTION: {command}")
        assert info["action"] == command
        if i < len(steps) - 1:
            assert not terminated and reward == 0.0
            assert not obs.startswith("You arrive at") and " AVAILABLE ACTIONS: " in obs
        if command.startswith("put "):
            assert terminated
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["status"] == "completed" and info["success"] is True


def test_env_endings_invalid_repeated_and_round_limit():
    need_alfworld()
    data = need_alfworld_data()
    task = _dev(data, "clean")
    env = _env()
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step("I will look around first.")
    assert terminated and reward == 0.0 and info["status"] == "agent invalid action"

    env.reset(options={"task": task})
    for _ in range(3):
        assert not env.step("ACTION: look")[2]
    _, reward, terminated, _, info = env.step("ACTION: look")
    assert terminated and info["status"] == "agent invalid action" and info["rounds"] == 4

    env = _env(max_turns=4)
    env.reset(options={"task": task})
    for reply in ("ACTION: look", "ACTION: inventory", "ACTION: look"):
        obs, _, terminated, _, _ = env.step(reply)
        assert not terminated
    assert "Nothing happens." not in obs
    _, reward, terminated, truncated, info = env.step("ACTION: inventory")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["status"] == "task limit reached" and not info["success"]


@pytest.mark.nightly  # needs the alfworld extra (built by .ci/nightly)
def test_compact_prompt_and_abort():
    need_alfworld()
    from astraflow.envs.agentbench.status import SampleStatus

    env = _env(prompt_style="compact")
    obs, info = env.reset(options={"task": _dev(need_alfworld_data(), "heat")})
    assert "messages" not in info and obs.startswith('Act with "ACTION: <command>"')
    assert obs.endswith("\nYour task is to: put a hot cup in cabinet.") and len(obs) < 150
    obs = env.step("ACTION: inventory")[0]
    assert "AVAILABLE ACTIONS" not in obs
    info = env.abort(SampleStatus.AGENT_CONTEXT_LIMIT)
    assert info["status"] == "agent context limit" and info["success"] is False


@pytest.mark.nightly  # needs the alfworld extra (built by .ci/nightly)
def test_workflow_renders_the_opening_as_chat_turns():
    """single_agent renders info["messages"] with the chat template, so the one-shot dialogue's
    agent replies are assistant turns, exactly as AgentBench's session holds them."""
    import asyncio

    need_alfworld()
    data = need_alfworld_data()
    from astraflow.envs.agentbench import ALFWORLD_ENV_ID
    from astraflow.envs.agentbench.oracle import OracleEpisode
    from astraflow.envs.registry import make_env

    from astraflow.protocol import Task
    from astraflow.rollout.engines.base import SamplingParams
    from astraflow.rollout.engines.scripted import ScriptedEngine
    from astraflow.rollout.env_runner import EnvRunner
    from astraflow.rollout.workflows import RolePolicy
    from astraflow.rollout.workflows.single_agent import single_agent

    task = _dev(data, "cool")
    engine = ScriptedEngine(OracleEpisode("alfworld", task).reply)  # ChatML byte tokenizer
    role = RolePolicy("oracle", engine, SamplingParams(temperature=0.0, max_tokens=256))
    runner = EnvRunner(lambda env_id, kw: make_env(env_id, **kw), workers=1)

    async def run():
        try:
            return await single_agent(
                Task(env=ALFWORLD_ENV_ID, payload=task),
                {"agent": role},
                runner.make,
                max_turns=35,
                max_total_tokens=1 << 20,  # a byte tokenizer: one token per character
            )
        finally:
            runner.shutdown()

    episode = asyncio.run(run())
    assert episode.finish_reason == "terminated" and episode.rewards["agent"] == 1.0
    env = _env()
    _, info = env.reset(options={"task": task})
    tok = engine.tokenizer
    opening = tok.apply_chat_template(info["messages"], tokenize=False, add_generation_prompt=True)
    tokens = episode.trajectories[0].tokens
    ids = tok.encode(opening, add_special_tokens=False)
    assert tokens[: len(ids)] == ids
    assert episode.trajectories[0].num_turns == len(task["walkthrough"])


@pytest.mark.nightly  # needs the alfworld extra (built by .ci/nightly)
def test_eval_agentbench_oracle_wins_every_dev_game(tmp_path):
    """`astraflow eval agentbench --agent oracle --tasks alfworld`: the walkthroughs, replayed in
    AgentBench's reply format through the training workflow, win all 20 dev games."""
    need_alfworld()
    data = need_alfworld_data()
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    out = tmp_path / "alfworld.json"
    args = ["eval", "agentbench", "--agent", "oracle", "--tasks", "alfworld",
            "--data", str(data), "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "AgentBench alfworld" in result.output and "puttwo" in result.output
    fam = json.loads(out.read_text())["tasks"]["alfworld"]
    assert (fam["total"], fam["passed"], fam["skipped"], fam["success_rate"]) == (20, 20, 0, 1.0)
    assert fam["status"] == {"completed": 20}
    assert sum(v["total"] for v in fam["by_type"].values()) == 20
    assert all(v["passed"] == v["total"] for v in fam["by_type"].values())


@pytest.mark.nightly  # needs the alfworld extra (built by .ci/nightly)
def test_games_in_threads_share_a_bounded_pool_of_planner_libraries():
    """Games loaded from several threads at once all play correctly (TextWorld is not thread-safe:
    without the lock, grammars fail to parse), and closed games' planner libraries are reused."""
    from concurrent.futures import ThreadPoolExecutor

    need_alfworld()
    from astraflow.envs.agentbench.alfworld.game import PLANNER_LIBRARIES, Game
    from astraflow.envs.agentbench.data import load_alfworld

    tasks = load_alfworld(need_alfworld_data(), "dev")[:3]

    def play(task):
        game = Game(task)
        try:
            game.reset()
            results = [game.step(c) for c in task["walkthrough"]]
            return id(game._lib), results[-1][1]
        finally:
            game.close()

    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(play, tasks))
    assert [won for _, won in outcomes] == [True, True, True]
    pooled = len(PLANNER_LIBRARIES.free)
    assert pooled >= 1
    lib_id, won = play(tasks[0])
    assert won and len(PLANNER_LIBRARIES.free) == pooled  # taken from the pool, given back
    assert lib_id in {id(lib) for lib in PLANNER_LIBRARIES.free}
