"""The latency wrapper (``envs/wrappers/latency.py``): delays follow the configured distribution,
the async path does not block the event loop, the recipe section is validated with clear errors,
and the straggler bound matches a Monte Carlo estimate."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
from astraflow.envs import make_env
from astraflow.envs.wrappers.latency import (
    LatencyDistribution,
    LatencyEnvFactory,
    LatencySampler,
    LatencyWrapper,
    straggler_bound,
)
from pydantic import ValidationError

from astraflow.recipe import load_recipe
from astraflow.recipe.schema import EnvLatencyConfig

TASK = {"question": "2+3", "answer": "5"}


def _quantiles(dist: LatencyDistribution, n: int = 200_000, seed: int = 0) -> np.ndarray:
    draws = LatencySampler(dist, seed).draws(n)
    return np.quantile(draws, [0.5, 0.99])


@pytest.mark.parametrize(
    "config",
    [
        {},  # default: lognormal, p50 0.3 s, p99 5 s
        {"distribution": "lognormal", "p50_s": 0.05, "p99_s": 2.0},
        {"distribution": "pareto", "p50_s": 0.3, "p99_s": 5.0},
        {"distribution": "uniform", "p50_s": 1.0, "p99_s": 1.4},
    ],
)
def test_draws_follow_the_configured_quantiles(config):
    dist = LatencyDistribution.from_config(config)
    p50, p99 = config.get("p50_s", 0.3), config.get("p99_s", 5.0)
    assert dist.quantile(0.5) == pytest.approx(p50, rel=1e-9)
    assert dist.quantile(0.99) == pytest.approx(p99, rel=1e-9)
    got50, got99 = _quantiles(dist)
    assert got50 == pytest.approx(p50, rel=0.02)
    assert got99 == pytest.approx(p99, rel=0.08)


def test_default_is_lognormal_p50_03_p99_5():
    dist = LatencyDistribution.from_config(EnvLatencyConfig())
    assert dist.name == "lognormal"
    assert dist.params["mu"] == pytest.approx(math.log(0.3))
    assert dist.params["sigma"] == pytest.approx(math.log(5 / 0.3) / 2.3263, rel=1e-4)


def test_own_parameters_and_cap():
    dist = LatencyDistribution.from_config({"distribution": "uniform", "low_s": 1, "high_s": 3})
    draws = LatencySampler(dist, 1).draws(50_000)
    assert draws.min() >= 1 and draws.max() <= 3
    assert dist.mean() == pytest.approx(2.0)
    capped = LatencyDistribution.from_config({"max_s": 1.0})
    assert LatencySampler(capped, 2).draws(50_000).max() == pytest.approx(1.0)
    assert capped.quantile(0.999) == 1.0
    fixed = LatencyDistribution.from_config({"distribution": "fixed", "value_s": 0.25})
    assert set(LatencySampler(fixed, 0).draws(10)) == {0.25}


@pytest.mark.parametrize(
    "config", [{}, {"distribution": "pareto", "p50_s": 0.3, "p99_s": 5.0, "max_s": 30.0}]
)
def test_straggler_bound_matches_monte_carlo(config):
    dist = LatencyDistribution.from_config(config)
    rng = np.random.default_rng(3)
    for n in (1, 16, 128):
        maxima = dist.sample(rng, (20_000, n)).max(axis=1)
        assert dist.expected_max(n) == pytest.approx(maxima.mean(), rel=0.03)
        assert dist.median_max(n) == pytest.approx(np.median(maxima), rel=0.03)
    bound = straggler_bound(dist, batch=128, turns=3)
    assert bound["lockstep_wait_per_step_s"] == pytest.approx(3 * dist.expected_max(128))
    assert bound["async_wait_per_call_s"] == pytest.approx(dist.mean())
    assert straggler_bound(dist, 128, active=[128, 0])["lockstep_wait_per_step_s"] == (
        pytest.approx(dist.expected_max(128))
    )


def test_uncapped_heavy_pareto_has_no_finite_bound():
    dist = LatencyDistribution("pareto", {"scale_s": 0.1, "alpha": 0.9})
    assert dist.mean() == math.inf and dist.expected_max(4) == math.inf


def test_sync_api_sleeps_and_returns_the_inner_envs_results():
    env = LatencyWrapper(
        make_env("astraflow/MathMultiTurn-v0", max_turns=2), "fixed", value_s=0.05, seed=0
    )
    t0 = time.perf_counter()
    obs, _ = env.reset(options={"task": TASK})  # reset is not delayed by default
    assert time.perf_counter() - t0 < 0.04
    assert obs == "2+3"
    t0 = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step("4")
    assert time.perf_counter() - t0 >= 0.05
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "incorrect" in obs
    _, reward, terminated, *_ = env.step("5")
    assert reward == 1.0 and terminated
    assert env.calls == 2 and env.delayed_s == pytest.approx(0.1)


def test_astep_does_not_block_the_event_loop():
    """N episodes each waiting 0.2 s at once finish in about 0.2 s, not N x 0.2 s."""
    n = 32

    async def episode(i: int, inner: str):
        env = LatencyWrapper(
            make_env("astraflow/MathMultiTurn-v0"),
            "fixed",
            value_s=0.2,
            seed=i,
            on=("step", "reset"),
            inner=inner,
        )
        obs, _ = await env.areset(options={"task": TASK})
        _, reward, terminated, *_ = await env.astep("5")
        await env.aclose()
        return obs, reward, terminated

    for inner in ("thread", "inline"):
        t0 = time.perf_counter()
        results = asyncio.run(_gather(episode(i, inner) for i in range(n)))
        took = time.perf_counter() - t0
        assert results == [("2+3", 1.0, True)] * n
        assert 0.4 <= took < 0.4 + 1.5, took  # reset + step delays, not 2 x 32 x 0.2 s


async def _gather(coros):
    return await asyncio.gather(*coros)


def test_astep_prefers_the_inner_envs_own_coroutine():
    inner = LatencyWrapper(make_env("astraflow/Math-v0"), "fixed", value_s=0.0, seed=0)
    calls = []
    original = inner.astep

    async def spy(action):
        calls.append(action)
        return await original(action)

    inner.astep = spy  # an env with its own astep
    outer = LatencyWrapper(inner, "fixed", value_s=0.01, seed=0)

    async def run():
        await outer.areset(options={"task": TASK})
        return await outer.astep("5")

    _, reward, *_ = asyncio.run(run())
    assert calls == ["5"] and reward == 1.0


def test_factory_gives_each_env_its_own_reproducible_stream():
    cfg = EnvLatencyConfig(p50_s=0.3, p99_s=5.0)

    def factory(stream):
        return LatencyEnvFactory(
            lambda env_id, kw: make_env(env_id, **kw), cfg, seed=7, stream=stream
        )

    a, b = factory("node-0"), factory("node-0")
    ea = [a("astraflow/Math-v0", {}) for _ in range(3)]
    eb = [b("astraflow/Math-v0", {}) for _ in range(3)]
    seq = lambda e: [e.sampler.draw() for _ in range(5)]  # noqa: E731
    first = [seq(e) for e in ea]
    assert first == [seq(e) for e in eb]  # same seed, node and creation order: same delays
    assert len({tuple(s) for s in first}) == 3  # but every env has its own stream
    other = factory("node-1")("astraflow/Math-v0", {})
    assert seq(other) not in first
    seeded = LatencyEnvFactory(
        lambda env_id, kw: make_env(env_id, **kw),
        EnvLatencyConfig(seed=1),
        seed=7,
        stream="node-0",
    )
    assert seeded.seed == 1  # the section's own seed wins over the run seed


def test_phases_scale_the_delays_by_where_training_is():
    """A load that changes mid-run: the factory's envs scale each draw by the phase of the step
    the node has heard of, the same draws otherwise (one stream, one seed)."""
    cfg = EnvLatencyConfig(
        distribution="fixed",
        value_s=0.3,
        phases=[{"from_step": 10, "scale": 10.0}, {"from_step": 20, "scale": 1.0}],
    )
    step = [0]
    factory = LatencyEnvFactory(
        lambda env_id, kw: make_env(env_id, **kw), cfg, seed=0, stream="n", step=lambda: step[0]
    )
    env = factory("astraflow/Math-v0", {})
    delays = []
    for at in (0, 9, 10, 19, 20, 50):
        step[0] = at
        delays.append(round(env.next_delay("step"), 6))
    assert delays == [0.3, 0.3, 3.0, 3.0, 0.3, 0.3]
    # without a step to follow (a caller outside a node), the phases do not apply
    plain = LatencyEnvFactory(lambda env_id, kw: make_env(env_id, **kw), cfg, seed=0)
    assert plain("astraflow/Math-v0", {}).scale is None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"p50_s": 1.0}, "give both p50_s and p99_s"),
        ({"p50_s": 2.0, "p99_s": 1.0}, "must be greater than p50_s"),
        ({"distribution": "pareto"}, "pareto latency needs scale_s and alpha"),
        ({"distribution": "fixed", "mu": 0.1}, "fixed latency does not take ['mu']"),
        ({"distribution": "lognormal", "mu": 0.1}, "needs all of mu, sigma"),
        ({"mu": 0.1, "sigma": 1.0, "p50_s": 1.0, "p99_s": 2.0}, "not both"),
        ({"distribution": "uniform", "p50_s": 0.1, "p99_s": 5.0}, "below 0 s"),
        ({"distribution": "weibull"}, "'lognormal', 'fixed', 'uniform' or 'pareto'"),
        ({"on": ["close"]}, "'step', 'reset' or 'tool_calls'"),
        ({"p50_s": -1.0, "p99_s": 2.0}, "greater than 0"),
        ({"sleep": 1}, "Extra inputs are not permitted"),
        ({"phases": [{"from_step": 5, "scale": 2}, {"from_step": 5, "scale": 1}]}, "increasing"),
        ({"phases": [{"from_step": 1, "scale": 0}]}, "greater than 0"),
    ],
)
def test_recipe_validation_errors(table, message):
    with pytest.raises(ValidationError) as err:
        EnvLatencyConfig(**table)
    assert message in str(err.value)


def test_recipe_section_loads_and_names_the_key(tmp_path):
    base = '[policies.policy]\nmodel = "builtin:tiny-arith"\n'
    good = tmp_path / "good.toml"
    good.write_text(base + '[tasks.env_latency]\ndistribution = "pareto"\np50_s = 0.2\np99_s = 3\n')
    recipe = load_recipe(good)
    assert recipe.tasks.env_latency.distribution == "pareto"
    assert load_recipe(good, ["tasks.env_latency.p99_s=4"]).tasks.env_latency.p99_s == 4
    bad = tmp_path / "bad.toml"
    bad.write_text(base + "[tasks.env_latency]\np50_s = 0.2\n")
    with pytest.raises(Exception) as err:
        load_recipe(bad)
    text = str(err.value)
    assert "env_latency" in text and "give both p50_s and p99_s" in text


def test_wrapper_rejects_bad_arguments():
    env = make_env("astraflow/Math-v0")
    with pytest.raises(ValueError, match="unknown"):
        LatencyWrapper(env, "weibull")
    with pytest.raises(ValueError, match="`on` accepts"):
        LatencyWrapper(env, on=("render",))
    with pytest.raises(ValueError, match="inner"):
        LatencyWrapper(env, inner="process")


def test_tool_calls_delays_only_the_steps_that_call_tools():
    """``on = ["tool_calls"]`` on a function-calling env: the calculator call waits its delay
    (counted), the final answer's grading does not (sync and async paths alike)."""
    from astraflow.tools.calls import ToolCall

    def make():
        env = make_env(
            "astraflow/Tools-v0", tools=["astraflow.tasks.calculator:calculator"], max_turns=2
        )
        return LatencyWrapper(env, "fixed", value_s=0.05, seed=0, on=("tool_calls",))

    call = [ToolCall("calculator", {"expression": "347*582"}, id="c1")]
    env = make()
    env.reset(options={"task": {"question": "347*582", "answer": "201954"}})
    obs, *_ = env.step(call)
    assert obs == "201954" and env.calls == 1 and env.delayed_s == pytest.approx(0.05)
    _, reward, terminated, *_ = env.step("201954")
    assert (reward, terminated) == (1.0, True)
    assert env.calls == 1  # the answer was not delayed

    async def episode():
        env = make()
        await env.areset(options={"task": {"question": "347*582", "answer": "201954"}})
        await env.astep(call)
        await env.astep("201954")
        return env.calls

    assert asyncio.run(episode()) == 1
    cfg = EnvLatencyConfig(on=["tool_calls"])
    assert LatencyEnvFactory(lambda *_: None, cfg, seed=0).on == ("tool_calls",)
