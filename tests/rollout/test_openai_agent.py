"""The ``openai_agent`` workflow on a real node-local endpoint: agent code written only with the
``openai`` SDK (tests/rollout/openai_agents/arith_agent.py) calls the built-in tiny policy over
HTTP on loopback, and its calls become token trajectories with behaviour log-probs and versions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the openai SDK is in the test extra")

from astraflow.models import resolve_model  # noqa: E402
from astraflow.protocol import Task  # noqa: E402
from astraflow.recipe import Recipe  # noqa: E402
from astraflow.rollout.engines import SamplingParams  # noqa: E402
from astraflow.rollout.env_runner import EnvRunner  # noqa: E402
from astraflow.rollout.workflows import WorkflowError, default_workflows  # noqa: E402
from astraflow.rollout.workflows.base import RolePolicy  # noqa: E402
from astraflow.rollout.workflows.openai_agent import load_agent  # noqa: E402
from astraflow.rollout.workflows.tokens import ChatRenderer  # noqa: E402

AGENTS = Path(__file__).resolve().parent / "openai_agents" / "arith_agent.py"
EVAL = {"greedy": True}  # evaluation tasks decode greedily: the expected ids are reproducible


def agent(name: str) -> str:
    return f"{AGENTS}:{name}"


def task(question="12+30", answer="42", meta=EVAL) -> Task:
    return Task(
        env="astraflow/Math-v0", payload={"question": question, "answer": answer},
        workflow="openai_agent", meta=dict(meta),
    )  # fmt: skip


def run_episodes(agent_ref: str, tasks: list[Task], roles=("agent",), **kwargs):
    """Run the workflow as a node does: one engine shared by every episode, a real env runner."""
    from astraflow.envs import default_registry

    from astraflow.rollout.engines.transformers_engine import TransformersEngine

    async def main():
        engine = TransformersEngine(resolve_model("builtin:tiny-arith"), device="cpu", version=7)
        registry = default_registry()
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=2)
        workflows = default_workflows()
        spec = workflows.get("openai_agent")
        sampling = SamplingParams(temperature=1.0, max_tokens=12)
        policies = {r: RolePolicy("policy", engine, sampling) for r in roles}
        try:
            episodes = await asyncio.gather(
                *(spec.fn(t, policies, runner.make, agent=agent_ref, **kwargs) for t in tasks),
                return_exceptions=True,
            )
            return episodes, engine
        finally:
            await workflows.aclose()
            runner.shutdown()
            await engine.close()

    return asyncio.run(main())


def greedy(engine_tokens_prompt, max_tokens=12):
    from astraflow.rollout.engines.transformers_engine import TransformersEngine

    async def main():
        engine = TransformersEngine(resolve_model("builtin:tiny-arith"), device="cpu")
        try:
            (gen,) = await engine.generate(
                engine_tokens_prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens)
            )
            return gen
        finally:
            await engine.close()

    return asyncio.run(main())


def chat_ids(tokenizer, question: str) -> list[int]:
    return ChatRenderer(tokenizer).prompt_ids(question)


def test_one_call_is_one_trajectory_with_the_engine_ids_and_logprobs():
    (ep,), engine = run_episodes(agent("solve"), [task()])
    assert not isinstance(ep, BaseException), ep
    (traj,) = ep.trajectories
    prompt = chat_ids(engine.tokenizer, "12+30")
    gen = greedy(prompt)
    assert traj.role == "agent"
    assert traj.tokens == prompt + gen.token_ids
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(gen.token_ids)
    assert traj.logprobs[len(prompt) :] == pytest.approx(gen.logprobs, abs=1e-5)
    assert traj.versions == [-1] * len(prompt) + [7] * len(gen.token_ids)
    # the returned answer was scored by the Math env
    answer = engine.tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
    assert ep.rewards == {"agent": 1.0 if answer == "42" else 0.0}
    assert ep.metrics["calls"] == 1.0


def test_a_conversation_grows_one_sequence_without_retokenizing():
    (ep,), engine = run_episodes(agent("retry_once"), [task("7-10", "-3")])
    assert not isinstance(ep, BaseException), ep
    (traj,) = ep.trajectories
    tok = engine.tokenizer
    prompt = chat_ids(tok, "7-10")
    first = greedy(prompt, 6)
    context = ChatRenderer(tok).observation_ids("7-10", first.token_ids)
    second = greedy(prompt + first.token_ids + context, 6)
    assert traj.tokens == prompt + first.token_ids + context + second.token_ids
    assert sum(traj.loss_mask) == len(first.token_ids) + len(second.token_ids)
    assert traj.num_turns == 2 and ep.metrics["calls"] == 2.0


def test_per_call_rewards_are_kept_per_turn_and_the_return_goes_to_the_last():
    (ep,), _engine = run_episodes(agent("rewarded_turns"), [task("7-10", "-3")])
    assert not isinstance(ep, BaseException), ep
    (traj,) = ep.trajectories
    assert traj.turn_rewards == [0.25, 1.5]  # call 0; the latest call plus the returned 1.0
    assert ep.rewards == {"agent": 1.75}
    (plain,), _ = run_episodes(agent("retry_once"), [task("7-10", "-3")])
    assert plain.trajectories[0].turn_rewards is None  # no per-call rewards: as before
    (bad,), _ = run_episodes(agent("rewards_a_call_it_never_made"), [task()])
    assert isinstance(bad, WorkflowError)
    assert "call 2 is not one of the 1 call(s) to model 'agent'" in str(bad)


def test_completions_calls_continue_their_own_text():
    (ep,), engine = run_episodes(agent("complete_twice"), [task("5+29", "34")])
    assert not isinstance(ep, BaseException), ep
    (traj,) = ep.trajectories
    tok = engine.tokenizer
    prompt = tok.encode("<|user|>5+29<|end|><|assistant|>")
    first = greedy(prompt, 6)
    # only the text the agent added after the returned text is encoded; the first call's ids stay
    # exactly as generated
    added = tok.encode("<|end|><|user|>5+29<|end|><|assistant|>", add_special_tokens=False)
    second = greedy(prompt + first.token_ids + added, 6)
    assert traj.tokens == prompt + first.token_ids + added + second.token_ids
    assert sum(traj.loss_mask) == len(first.token_ids) + len(second.token_ids)
    assert traj.num_turns == 2 and ep.rewards == {"agent": 0.5}


def test_two_model_names_are_two_roles_with_their_own_rewards():
    (ep,), _ = run_episodes(agent("solve_and_check"), [task()], roles=("solver", "checker"))
    assert not isinstance(ep, BaseException), ep
    assert sorted(t.role for t in ep.trajectories) == ["checker", "solver"]
    assert set(ep.rewards) == {"solver", "checker"}
    assert all(sum(t.loss_mask) >= 1 for t in ep.trajectories)


def test_an_agent_that_steps_the_env_is_scored_by_it():
    episodes, _ = run_episodes(agent("with_env"), [task(meta={}) for _ in range(4)])
    for ep in episodes:
        assert not isinstance(ep, BaseException), ep
        assert ep.metrics["env_steps"] == 1.0 and ep.rewards["agent"] in (0.0, 1.0)
        assert ep.finish_reason == "terminated"


def test_a_call_that_breaks_the_conversation_is_refused_with_the_reason():
    (err,), _ = run_episodes(agent("rewrites_history"), [task()])
    import openai

    assert isinstance(err, openai.BadRequestError)
    assert "does not continue the conversation" in str(err)


def test_training_sampling_is_the_policy_s_and_evaluation_is_greedy():
    """Training episodes sample (temperature 1 from the recipe); evaluation episodes are greedy
    whatever the agent asks: the same task gives one answer under eval, several under training."""
    tasks = [task("83+85", "168", meta={}) for _ in range(12)] + [task("83+85", "168")] * 4
    episodes, _ = run_episodes(agent("solve"), tasks)
    train = {tuple(e.trajectories[0].tokens) for e in episodes[:12]}
    evals = {tuple(e.trajectories[0].tokens) for e in episodes[12:]}
    assert len(evals) == 1 and len(train) > 1


def test_unknown_model_names_and_bad_agents_are_clear_errors():
    (err,), _ = run_episodes(agent("solve"), [task()], roles=("solver",))
    import openai

    assert isinstance(err, openai.NotFoundError) and "'solver'" in str(err)
    with pytest.raises(WorkflowError, match="async function"):
        load_agent(agent("not_async"))
    with pytest.raises(WorkflowError, match="no attribute 'nope'"):
        load_agent(agent("nope"))
    with pytest.raises(WorkflowError, match="module:function"):
        load_agent("no_colon_here")
    with pytest.raises(WorkflowError, match="cannot import"):
        load_agent("astraflow_no_such_module:fn")


def test_recipe_requires_an_agent_for_openai_agent():
    def recipe(**workflow):
        policies = {"policy": {"model": "builtin:tiny-arith"}}
        return Recipe.model_validate({"policies": policies, "workflow": workflow})

    with pytest.raises(ValueError, match="needs workflow.agent"):
        recipe(name="openai_agent")
    with pytest.raises(ValueError, match="only with workflow.name"):
        recipe(agent="m:f")
    with pytest.raises(ValueError, match="module:function"):
        recipe(name="openai_agent", agent="m.agents")
    assert recipe(name="openai_agent", agent="m.agents:solve").workflow.agent == "m.agents:solve"
