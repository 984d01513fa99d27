"""Tool latency on any env: a wrapper that delays ``step`` (and optionally ``reset``) calls.

Why: agentic RL spends its wall time waiting on tools (a sandbox, a web search, a judge), whose
latency runs from milliseconds to minutes with a long tail. A math grader answers in microseconds,
so benchmarks and tests of the rollout path put a realistic, I/O-bound delay in front of the real
env: :class:`LatencyWrapper` draws a delay per call from a distribution, waits, then runs the wrapped
env unchanged (its observations, rewards and info are the env's own).

Two calling conventions, one delay stream:

* ``await env.areset(seed=, options=)`` / ``await env.astep(action)`` / ``await env.aclose()``: the
  delay is an ``asyncio.sleep`` (no thread is held while "the tool runs"; thousands of episodes can
  wait at once on one event loop). The wrapped env then runs: its own ``astep``/``areset`` when it
  has them; otherwise its sync call, in a small shared thread pool (``inner="thread"``, the default:
  safe for any env, e.g. a sandboxed code run that takes seconds) or on the event loop itself
  (``inner="inline"``: for envs whose call is microseconds, such as the math grader, where a thread
  hop costs more than the call).
* ``env.reset(...)`` / ``env.step(action)``: the delay is a ``time.sleep``, so the wrapper works in
  any sync caller (a Gymnasium loop, TRL's trainer, a thread pool).

Recipe: ``[tasks.env_latency]`` (:class:`astraflow.recipe.schema.EnvLatencyConfig`), applied by the
rollout service to every env it builds through :class:`LatencyEnvFactory`, which gives each env its
own random stream derived from (seed, node, env number): runs are reproducible, and episodes do not
all replay one delay sequence.

The default is log-normal with median 0.3 s and 99th percentile 5 s
(mu = ln 0.3, sigma = ln(5 / 0.3) / z_0.99). :func:`straggler_bound` says what a lock-step system
pays per step for that tail: the expected maximum of n draws.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import gymnasium as gym
import numpy as np

DISTRIBUTIONS = ("lognormal", "fixed", "uniform", "pareto")
#: Which calls a wrapper can delay: every ``step``, ``reset``, or only ``tool_calls``, the steps
#: whose action is tool calls (a function-calling env such as ``astraflow/Tools-v0``: the tool runs
#: there, while a final answer's grading is not a tool call and is not delayed).
CALLS = ("step", "reset", "tool_calls")
#: z-score of the 99th percentile of a standard normal (2.3263...).
Z99 = NormalDist().inv_cdf(0.99)
_NDTRI = np.vectorize(NormalDist().inv_cdf, otypes=[float])
DEFAULT_P50_S = 0.3
DEFAULT_P99_S = 5.0


# ----------------------------------------------------------------------------- distributions


@dataclass(frozen=True)
class LatencyDistribution:
    """A delay distribution in seconds, with closed-form quantiles.

    ``params`` by ``name``: lognormal ``mu, sigma`` (of the log, seconds); fixed ``value_s``;
    uniform ``low_s, high_s``; pareto ``scale_s`` (the minimum) and ``alpha`` (tail index).
    ``max_s`` caps every draw (a tool timeout), applied to samples and quantiles alike.
    Build one from medians and tails with :meth:`from_config`.
    """

    name: str = "lognormal"
    params: Mapping[str, float] = field(
        default_factory=lambda: {
            "mu": math.log(DEFAULT_P50_S),
            "sigma": math.log(DEFAULT_P99_S / DEFAULT_P50_S) / Z99,
        }
    )
    max_s: float | None = None

    def __post_init__(self) -> None:
        if self.name not in DISTRIBUTIONS:
            raise ValueError(
                f"latency distribution {self.name!r} is unknown; expected one of "
                f"{', '.join(DISTRIBUTIONS)}"
            )
        need = {
            "lognormal": ("mu", "sigma"),
            "fixed": ("value_s",),
            "uniform": ("low_s", "high_s"),
            "pareto": ("scale_s", "alpha"),
        }[self.name]
        missing = [k for k in need if k not in self.params]
        if missing:
            raise ValueError(f"{self.name} latency needs {', '.join(need)}; missing {missing}")
        p = self.params
        if self.name == "lognormal" and not p["sigma"] > 0:
            raise ValueError(f"lognormal sigma must be > 0, got {p['sigma']}")
        if self.name == "fixed" and p["value_s"] < 0:
            raise ValueError(f"fixed value_s must be >= 0, got {p['value_s']}")
        if self.name == "uniform" and not 0 <= p["low_s"] <= p["high_s"]:
            raise ValueError(f"uniform needs 0 <= low_s <= high_s, got {p['low_s']}, {p['high_s']}")
        if self.name == "pareto" and not (p["scale_s"] > 0 and p["alpha"] > 0):
            raise ValueError(f"pareto needs scale_s > 0 and alpha > 0, got {dict(p)}")
        if self.max_s is not None and self.max_s <= 0:
            raise ValueError(f"max_s must be > 0, got {self.max_s}")

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Any = None) -> LatencyDistribution:
        """From a ``[tasks.env_latency]`` table (a mapping or the pydantic model).

        Each distribution takes its own parameters or, except ``fixed``, the pair ``p50_s`` and
        ``p99_s`` (median and 99th percentile); ``fixed`` takes ``value_s`` or ``p50_s``.
        """
        if config is None:
            config = {}
        if hasattr(config, "model_dump"):
            config = config.model_dump()
        cfg = {k: v for k, v in dict(config).items() if v is not None}
        name = cfg.get("distribution", "lognormal")
        p50, p99 = cfg.get("p50_s"), cfg.get("p99_s")
        if (p50 is None) != (p99 is None) and name != "fixed":
            raise ValueError(f"{name} latency: give both p50_s and p99_s, or neither")
        if p50 is not None and p99 is not None and not 0 < p50 < p99:
            raise ValueError(f"latency needs 0 < p50_s < p99_s, got p50_s={p50}, p99_s={p99}")
        own = {
            "lognormal": ("mu", "sigma"),
            "fixed": ("value_s",),
            "uniform": ("low_s", "high_s"),
            "pareto": ("scale_s", "alpha"),
        }.get(name)
        if own is None:
            raise ValueError(
                f"latency distribution {name!r} is unknown; expected one of "
                f"{', '.join(DISTRIBUTIONS)}"
            )
        given = {k: float(cfg[k]) for k in own if k in cfg}
        if given and p50 is not None and name != "fixed":
            raise ValueError(
                f"{name} latency: give either p50_s/p99_s or {'/'.join(own)}, not both"
            )
        if name == "lognormal" and not given:
            p50, p99 = p50 or DEFAULT_P50_S, p99 or DEFAULT_P99_S
            given = {"mu": math.log(p50), "sigma": math.log(p99 / p50) / Z99}
        elif name == "fixed" and not given:
            if p50 is None:
                raise ValueError("fixed latency needs value_s (or p50_s)")
            given = {"value_s": float(p50)}
        elif name == "uniform" and not given and p50 is not None:
            # median = (a + b) / 2, p99 = a + 0.99 (b - a)  =>  b - a = (p99 - p50) / 0.49
            width = (p99 - p50) / 0.49
            given = {"low_s": p50 - width / 2, "high_s": p50 + width / 2}
            if given["low_s"] < 0:
                raise ValueError(
                    f"uniform latency with p50_s={p50}, p99_s={p99} would go below 0 s "
                    f"(low {given['low_s']:.3f}); give low_s/high_s instead"
                )
        elif name == "pareto" and not given and p50 is not None:
            # quantile(q) = scale (1 - q)^(-1/alpha): p99 / p50 = 50^(1/alpha)
            alpha = math.log(50.0) / math.log(p99 / p50)
            given = {"scale_s": p50 * 0.5 ** (1.0 / alpha), "alpha": alpha}
        return cls(name, given, cfg.get("max_s"))

    # --- maths ------------------------------------------------------------------------------
    def _raw_quantile(self, q: float) -> float:
        p = self.params
        if self.name == "lognormal":
            if q <= 0:
                return 0.0
            if q >= 1:
                return math.inf
            return math.exp(p["mu"] + p["sigma"] * NormalDist().inv_cdf(q))
        if self.name == "fixed":
            return p["value_s"]
        if self.name == "uniform":
            return p["low_s"] + q * (p["high_s"] - p["low_s"])
        if q >= 1:
            return math.inf
        return p["scale_s"] * (1.0 - q) ** (-1.0 / p["alpha"])

    def quantile(self, q: float) -> float:
        """Delay at cumulative probability ``q`` (the inverse CDF), capped at ``max_s``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile needs 0 <= q <= 1, got {q}")
        x = self._raw_quantile(q)
        return x if self.max_s is None else min(x, self.max_s)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] | None = None):
        """Draws in seconds (a float, or an array of ``size``), by inverse transform."""
        p = self.params
        if self.name == "lognormal":
            x = rng.lognormal(p["mu"], p["sigma"], size)
        elif self.name == "fixed":
            x = np.full(size, p["value_s"]) if size is not None else p["value_s"]
        elif self.name == "uniform":
            x = rng.uniform(p["low_s"], p["high_s"], size)
        else:
            x = p["scale_s"] * (1.0 - rng.random(size)) ** (-1.0 / p["alpha"])
        if self.max_s is not None:
            x = np.minimum(x, self.max_s)
        return float(x) if size is None else np.asarray(x, dtype=float)

    def mean(self) -> float:
        """Expected delay (closed form; infinite for a pareto with alpha <= 1 and no cap)."""
        if self.max_s is not None:
            return self.expected_max(1)
        p = self.params
        if self.name == "lognormal":
            return math.exp(p["mu"] + p["sigma"] ** 2 / 2)
        if self.name == "fixed":
            return p["value_s"]
        if self.name == "uniform":
            return (p["low_s"] + p["high_s"]) / 2
        a = p["alpha"]
        return math.inf if a <= 1 else a * p["scale_s"] / (a - 1)

    def median_max(self, n: int) -> float:
        """Median of the largest of ``n`` independent draws: F^-1(0.5^(1/n))."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return self.quantile(0.5 ** (1.0 / n))

    def expected_max(self, n: int, points: int = 20_000) -> float:
        """Mean of the largest of ``n`` independent draws.

        E[max] = integral over u in (0, 1) of F^-1(u^(1/n)) du (the max of n uniforms is U^(1/n)),
        by the midpoint rule on a grid that is dense near u = 1, where the tail lives. Infinite
        when the distribution's mean is (an uncapped pareto with alpha <= 1).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self.name == "pareto" and self.max_s is None and self.params["alpha"] <= 1:
            return math.inf
        if self.name == "fixed":
            return self.quantile(0.5)
        # u = 1 - t^8 puts most grid points where 1 - u is small (du = 8 t^7 dt), which keeps the
        # integrand smooth even for heavy (pareto) tails.
        t = (np.arange(points) + 0.5) / points
        one_minus_u = t**8
        q = np.exp(np.log1p(-one_minus_u) / n)  # u^(1/n) without rounding 1 - tiny to 1
        xs = self._quantiles(q)
        return float(np.sum(xs * 8 * t**7) / points)

    def _quantiles(self, q: np.ndarray) -> np.ndarray:
        p = self.params
        q = np.clip(q, 0.0, np.nextafter(1.0, 0.0))
        if self.name == "lognormal":
            q = np.clip(q, 1e-300, None)
            x = np.exp(p["mu"] + p["sigma"] * _NDTRI(q))
        elif self.name == "uniform":
            x = p["low_s"] + q * (p["high_s"] - p["low_s"])
        elif self.name == "fixed":
            x = np.full_like(q, p["value_s"])
        else:
            x = p["scale_s"] * (1.0 - q) ** (-1.0 / p["alpha"])
        return x if self.max_s is None else np.minimum(x, self.max_s)

    def describe(self) -> dict[str, Any]:
        return {
            "distribution": self.name,
            "params": dict(self.params),
            "max_s": self.max_s,
            "p50_s": self.quantile(0.5),
            "p99_s": self.quantile(0.99),
            "mean_s": self.mean(),
        }


def straggler_bound(
    dist: LatencyDistribution,
    batch: int,
    turns: int = 1,
    *,
    active: Iterable[int] | None = None,
) -> dict[str, Any]:
    """What a lock-step rollout pays per step for the tail of ``dist``.

    A system that steps every episode of a ``batch`` together, turn by turn (TRL's generate-then-
    call-tools loop), waits at each turn for the slowest call: E[max of n_t draws] per turn, where
    n_t episodes are still active at turn t (``active``; all ``batch`` at every turn when not
    given, the bound for episodes that use every turn). An asynchronous system pays the mean per
    call instead, as long as enough episodes are in flight to cover the wait.
    """
    counts = list(active) if active is not None else [batch] * turns
    per_turn = [dist.expected_max(n) if n > 0 else 0.0 for n in counts]
    mean = dist.mean()
    return {
        "batch": batch,
        "turns": len(counts),
        "active_per_turn": counts,
        "mean_s": mean,
        "median_max_s": dist.median_max(batch),
        "expected_max_s": dist.expected_max(batch),
        "lockstep_wait_per_step_s": float(sum(per_turn)),
        "async_wait_per_call_s": mean,
        "tail_ratio": (dist.expected_max(batch) / mean) if mean and mean > 0 else None,
    }


# ----------------------------------------------------------------------------- sampler


class LatencySampler:
    """Draws delays for one env from its own random stream (so two envs never share one)."""

    def __init__(self, dist: LatencyDistribution, seed: int | np.random.SeedSequence | None = None):
        self.dist = dist
        self.rng = np.random.default_rng(seed)

    def draw(self) -> float:
        return float(self.dist.sample(self.rng))

    def draws(self, n: int) -> np.ndarray:
        return self.dist.sample(self.rng, n)


# ----------------------------------------------------------------------------- wrapper


def is_tool_call_action(action: Any) -> bool:
    """Whether an env action is tool calls (what ``astraflow/Tools-v0`` runs as tools) rather
    than text or any other action."""
    if isinstance(action, str):
        return False
    from astraflow.envs.tools.env import tool_calls_of  # lazy: the wrapper serves every env family

    try:
        return tool_calls_of(action) is not None
    except TypeError:  # not a function-calling action at all
        return False


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
#: Threads of the shared pool that runs wrapped sync envs after an async delay. Small on purpose:
#: the delay itself holds no thread, so this only bounds how many inner calls run at once.
POOL_WORKERS = 8


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(POOL_WORKERS, thread_name_prefix="latency-env")
        return _POOL


class LatencyWrapper(gym.Wrapper):
    """Delays the wrapped env's calls by draws from a :class:`LatencyDistribution`.

    ``on``: which calls are delayed, a subset of ("step", "reset", "tool_calls"); step only by
    default (a tool call per action; starting an episode is usually cheap). ``tool_calls`` delays
    only the steps whose action is tool calls (:func:`is_tool_call_action`). ``inner``: how the wrapped env's sync
    call runs after an async delay, "thread" (shared pool, default) or "inline" (on the loop).
    ``seed``: the stream of delays (int or ``numpy.random.SeedSequence``).
    ``scale``: a callable giving the factor on each delay now (a load that changes mid-run).
    Counters ``calls``, ``delayed_s`` and the list ``delays`` (the last 10,000) are kept for
    measurement.
    """

    #: holds no episode state: the wrapped env's ``state_dict`` saves the episode (a resumed
    #: episode draws fresh delays)
    state_passthrough = True

    def __init__(
        self,
        env: gym.Env,
        distribution: LatencyDistribution | str | Mapping[str, Any] | None = None,
        *,
        seed: int | np.random.SeedSequence | None = None,
        on: Iterable[str] = ("step",),
        inner: str = "thread",
        scale: Callable[[], float] | None = None,
        **params: Any,
    ):
        super().__init__(env)
        if isinstance(distribution, LatencyDistribution):
            if params:
                raise TypeError(f"unexpected parameters with a distribution object: {params}")
            dist = distribution
        elif isinstance(distribution, Mapping):
            dist = LatencyDistribution.from_config({**distribution, **params})
        else:
            dist = LatencyDistribution.from_config(
                {"distribution": distribution or "lognormal", **params}
            )
        on = tuple(on)
        bad = [c for c in on if c not in CALLS]
        if bad:
            raise ValueError(f"latency `on` accepts {list(CALLS)}, got {bad}")
        if inner not in ("thread", "inline"):
            raise ValueError(f"latency `inner` must be 'thread' or 'inline', got {inner!r}")
        self.on = frozenset(on)
        self.inner = inner
        #: the load's factor now (a schedule of phases, see :class:`LatencySchedule`); 1 if None
        self.scale = scale
        self.sampler = LatencySampler(dist, seed)
        self.calls = 0
        self.delayed_s = 0.0
        self.delays: list[float] = []

    @property
    def distribution(self) -> LatencyDistribution:
        return self.sampler.dist

    def next_delay(self, call: str) -> float:
        """The delay of the next ``call`` ("step", "reset" or "tool_calls"): 0 when that call is
        not delayed."""
        if call not in self.on:
            return 0.0
        d = self.sampler.draw()
        if self.scale is not None:
            d *= self.scale()
        self.calls += 1
        self.delayed_s += d
        if len(self.delays) < 10_000:
            self.delays.append(d)
        return d

    # --- sync API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        delay = self.next_delay("reset")
        if delay > 0:
            time.sleep(delay)
        return self.env.reset(seed=seed, options=options)

    def step_delay(self, action: Any) -> float:
        """The delay of a step taking ``action``: every step under ``on = ["step"]``, only the
        tool calls under ``on = ["tool_calls"]``."""
        if "step" not in self.on and is_tool_call_action(action):
            return self.next_delay("tool_calls")
        return self.next_delay("step")

    def step(self, action):
        delay = self.step_delay(action)
        if delay > 0:
            time.sleep(delay)
        return self.env.step(action)

    # --- async API ----------------------------------------------------------------------------
    async def _inner(self, native_name: str, sync_call: Callable[..., Any], *args, **kwargs):
        """The wrapped env's call after the delay: its own coroutine when it has one, else the
        sync call in the shared pool ("thread") or on the loop ("inline")."""
        native = getattr(self.env, native_name, None)
        if native is not None and inspect.iscoroutinefunction(native):
            return await native(*args, **kwargs)
        if self.inner == "inline":
            return sync_call(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_pool(), functools.partial(sync_call, *args, **kwargs))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        delay = self.next_delay("reset")
        if delay > 0:
            await asyncio.sleep(delay)
        return await self._inner("areset", self.env.reset, seed=seed, options=options)

    async def astep(self, action):
        delay = self.step_delay(action)
        if delay > 0:
            await asyncio.sleep(delay)
        return await self._inner("astep", self.env.step, action)

    async def aclose(self) -> None:
        native = getattr(self.env, "aclose", None)
        if native is not None and inspect.iscoroutinefunction(native):
            await native()
        else:
            self.env.close()


# ----------------------------------------------------------------------------- factory


@dataclass(frozen=True)
class LatencySchedule:
    """A load that changes during a run: ``phases`` are (from_step, scale) in step order; at a
    step before the first phase the scale is 1. ``step`` says where the run is (on a node: the
    newest weight version it has heard of, which is the trainer's step count), so every node,
    one started late included, is in the same phase at the same point of training."""

    phases: tuple[tuple[int, float], ...]
    step: Callable[[], int]

    def __call__(self) -> float:
        now, factor = self.step(), 1.0
        for from_step, scale in self.phases:
            if now < from_step:
                break
            factor = scale
        return factor


def stream_id(name: str | int) -> int:
    """A stable 32-bit id for a stream name (a node name), the same in every process."""
    return int(name) if isinstance(name, int) else zlib.crc32(str(name).encode())


class LatencyEnvFactory:
    """Wraps every env that ``make_env(env_id, kwargs)`` builds in a :class:`LatencyWrapper`.

    Env number k of stream ``stream`` (e.g. the node's name) gets the delay stream
    ``SeedSequence(seed, spawn_key=(stream_id(stream), k))``: reproducible for a given seed and
    creation order, distinct for every env and every node.
    With ``phases`` in the config and a ``step`` callable (where the run is), every delay is
    scaled by the phase the run is in (:class:`LatencySchedule`).
    """

    def __init__(
        self,
        make_env: Callable[[str, dict[str, Any]], gym.Env],
        config: Any,
        *,
        seed: int,
        stream: str | int = 0,
        step: Callable[[], int] | None = None,
    ):
        if hasattr(config, "model_dump"):
            config = config.model_dump()
        config = dict(config or {})
        self.make_env = make_env
        phases = tuple(
            (int(ph["from_step"]), float(ph["scale"])) for ph in config.get("phases") or ()
        )
        self.schedule = LatencySchedule(phases, step) if phases and step is not None else None
        self.on = tuple(config.get("on") or ("step",))
        self.inner = config.get("inner") or "thread"
        if config.get("seed") is not None:
            seed = int(config["seed"])
        self.dist = LatencyDistribution.from_config(
            {k: v for k, v in config.items() if k not in ("on", "inner", "seed", "phases")}
        )
        self.seed = int(seed)
        self.stream = stream_id(stream)
        self._count = 0
        self._lock = threading.Lock()

    def seed_for(self, k: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(self.seed, spawn_key=(self.stream, k))

    def __call__(self, env_id: str, kwargs: dict[str, Any]) -> LatencyWrapper:
        with self._lock:
            k = self._count
            self._count += 1
        env = self.make_env(env_id, kwargs)
        return LatencyWrapper(
            env, self.dist, seed=self.seed_for(k), on=self.on, inner=self.inner,
            scale=self.schedule,
        )  # fmt: skip
