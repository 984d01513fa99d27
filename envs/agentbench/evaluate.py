"""Evaluation runner behind ``astraflow eval agentbench``: agents, concurrent episodes, reports.

Two agents drive the envs:

* :class:`OracleAgent` replays each sample's reference solution (dbbench: the gold answers or the gold
  SQL; os_interaction: the example script, then the expected answer) to validate the harness itself:
  on a correct harness it passes every sample whose reference is right;
* :class:`PolicyAgent` drives an inference engine (``astraflow.rollout.engines``). The conversation is
  one growing token sequence: the first observation is rendered with the tokenizer's chat template,
  each generation is appended as generated and each observation is rendered once and appended, so
  history is never re-tokenized (the same tokens a trainer would see).

Episodes run concurrently (``concurrency``); env calls are blocking (database, sandbox) and run in
worker threads while generation is awaited on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.agentbench.status import SampleStatus, TaskSkipped

FAMILIES = ("dbbench", "os")


@dataclass
class SampleResult:
    family: str
    sample_id: str
    status: str
    passed: bool
    skipped: bool = False
    reason: str = ""
    turns: int = 0
    type: str = ""
    answer: str | None = None
    seconds: float = 0.0
    #: The agent's replies (each cut at 2000 characters), for reading failures.
    replies: list[str] = field(default_factory=list)


@dataclass
class EvalConfig:
    tasks: tuple[str, ...] = FAMILIES
    split: str = "dev"
    data_dir: str | None = None
    db: str | None = None
    sandbox: str = "auto"
    concurrency: int = 4
    limit: int | None = None


# --- agents -------------------------------------------------------------------------------------


class OracleAgent:
    """Replays reference solutions (see module doc); never needs a model."""

    name = "oracle"

    def start(self, family: str, payload: dict[str, Any]) -> _OracleEpisode:
        return _OracleEpisode(family, payload)

    async def close(self) -> None:
        return None


class _OracleEpisode:
    def __init__(self, family: str, payload: dict[str, Any]):
        self.family = family
        self.payload = payload
        self.turn = 0

    async def act(self, observation: str) -> str | None:
        self.turn += 1
        return self._db(observation) if self.family == "dbbench" else self._os(observation)

    def _db(self, observation: str) -> str:
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
                code = "python3 -c " + _sh_quote(code)
            return f"Think: Run the reference script.\n\nAct: bash\n\n```bash\n{code}\n```"
        if p.get("check") and any(step is None for step in p["check"]):
            prefix = "The output of the OS:\n\n"
            output = observation[len(prefix) :] if observation.startswith(prefix) else ""
            return f"Think: The output is the answer.\n\nAct: answer({output.strip()})"
        return "Think: The job is done.\n\nAct: finish"


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class PolicyAgent:
    """Generates replies with an :class:`~astraflow.rollout.engines.base.Engine`.

    ``overflow``: ``limit`` (AgentBench: a conversation that outgrows the model's context ends with
    status *agent context limit*) or ``truncate`` (keep the most recent tokens that fit; for
    small-context models, not AgentBench-faithful).
    """

    def __init__(
        self,
        engine: Any,
        *,
        name: str = "policy",
        max_tokens: int = 512,
        temperature: float = 0.0,
        max_context: int | None = None,
        overflow: str = "limit",
    ):
        from astraflow.rollout.engines.base import SamplingParams

        if overflow not in ("limit", "truncate"):
            raise ValueError(f"overflow must be 'limit' or 'truncate', got {overflow!r}")
        self.engine = engine
        self.name = name
        self.overflow = overflow
        self.max_context = max_context or int(getattr(engine, "max_context", 0) or 1 << 30)
        self.params = SamplingParams(temperature=temperature, max_tokens=max_tokens)

    def start(self, family: str, payload: dict[str, Any]) -> _PolicyEpisode:
        return _PolicyEpisode(self)

    async def close(self) -> None:
        await self.engine.close()


class _PolicyEpisode:
    def __init__(self, agent: PolicyAgent):
        from astraflow.rollout.workflows.tokens import ChatRenderer

        self.agent = agent
        self.renderer = ChatRenderer(agent.engine.tokenizer)
        self.tokens: list[int] = []
        self.last_generated: list[int] = []

    async def act(self, observation: str) -> str | None:
        from dataclasses import replace

        r = self.renderer
        if not self.tokens:
            self.tokens = r.prompt_ids(observation)
        else:
            self.tokens += r.observation_ids(observation, self.last_generated)
        room = self.agent.max_context - len(self.tokens)
        prompt = self.tokens
        if room < 2:
            if self.agent.overflow == "limit":
                return None
            keep = max(1, self.agent.max_context - min(self.agent.params.max_tokens, 64))
            prompt = self.tokens[-keep:]
            room = self.agent.max_context - len(prompt)
        params = replace(
            self.agent.params, max_tokens=max(1, min(self.agent.params.max_tokens, room - 1))
        )
        (gen,) = await self.agent.engine.generate(prompt, params)
        self.last_generated = list(gen.token_ids)
        self.tokens += self.last_generated
        return self.agent.engine.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


# --- episodes -----------------------------------------------------------------------------------


def make_env(family: str, config: EvalConfig, sandbox_factory=None):
    if family == "dbbench":
        from envs.agentbench.dbbench.env import AgentBenchDBEnv

        return AgentBenchDBEnv(db=config.db)
    from envs.agentbench.os.env import AgentBenchOSEnv

    return AgentBenchOSEnv(sandbox=sandbox_factory or config.sandbox, data_dir=config.data_dir)


async def run_episode(
    agent, family: str, payload: dict[str, Any], env, pool: ThreadPoolExecutor | None = None
) -> SampleResult:
    """One sample from reset to score; blocking env calls run in ``pool`` (or asyncio's default)."""
    loop = asyncio.get_running_loop()

    def call(fn, *args, **kwargs):
        return loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    started = time.perf_counter()
    result = SampleResult(
        family,
        str(payload.get("id")),
        SampleStatus.UNKNOWN.value,
        False,
        type=str(payload.get("type", "")),
    )
    try:
        try:
            obs, reset_info = await call(env.reset, options={"task": payload})
        except TaskSkipped as exc:
            result.status, result.skipped, result.reason = (
                SampleStatus.SKIPPED.value,
                True,
                str(exc),
            )
            return result
        episode = agent.start(family, payload)
        info: dict[str, Any] = {}
        while True:
            reply = await episode.act(obs)
            if reply is None:
                info = await call(env.abort, SampleStatus.AGENT_CONTEXT_LIMIT)
                break
            result.replies.append(reply[:2000])
            obs, _reward, terminated, truncated, info = await call(env.step, reply)
            if terminated or truncated:
                if truncated and not terminated:
                    info = await call(env.abort, SampleStatus.TASK_LIMIT_REACHED)
                break
        result.status = str(info.get("status", SampleStatus.UNKNOWN.value))
        result.passed = bool(info.get("success", False))
        result.answer = None if info.get("answer") is None else str(info.get("answer"))
        result.reason = str(info.get("judge", info.get("error", "")))
        if reset_info.get("load_error"):  # e.g. MySQL refused the table (AgentBench runs on)
            result.reason = f"table not loaded: {reset_info['load_error']}"
        result.turns = int(env.turn)
    except Exception as exc:  # one broken sample must not stop the evaluation
        result.status, result.reason = SampleStatus.TASK_ERROR.value, f"{type(exc).__name__}: {exc}"
    finally:
        await call(env.close)
        result.seconds = round(time.perf_counter() - started, 3)
    return result


def load_family(family: str, config: EvalConfig) -> list[dict[str, Any]]:
    from envs.agentbench import data

    items = (data.load_dbbench if family == "dbbench" else data.load_os)(
        config.data_dir, config.split
    )
    return items[: config.limit] if config.limit else items


async def evaluate(
    agent,
    config: EvalConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_result: Callable[[SampleResult], None] | None = None,
) -> dict[str, Any]:
    """Run every requested family and return the JSON report (see :func:`build_report`)."""
    unknown = [t for t in config.tasks if t not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; expected some of {', '.join(FAMILIES)}")
    started = time.time()
    results: dict[str, list[SampleResult]] = {}
    meta: dict[str, Any] = {"agent": agent.name, "split": config.split, "data": config.data_dir}
    for family in config.tasks:
        payloads = load_family(family, config)
        sandbox = None
        if family == "os":
            from envs.agentbench.data import dockerfiles_dir
            from envs.agentbench.os.sandbox import select_sandbox

            sandbox = select_sandbox(config.sandbox, dockerfiles_dir(config.data_dir))
            meta["sandbox"] = sandbox.backend
        else:
            from envs.agentbench.dbbench.backends import make_backend

            meta["db"] = make_backend(config.db).describe()
        if on_start:
            on_start(family, len(payloads))
        gate = asyncio.Semaphore(max(1, config.concurrency))
        # one thread per episode in flight: a command waiting 30 s must not hold up the others
        pool = ThreadPoolExecutor(max_workers=max(1, config.concurrency), thread_name_prefix="ab")

        async def one(payload, family=family, sandbox=sandbox, gate=gate, pool=pool):
            async with gate:
                env = make_env(family, config, sandbox)
                res = await run_episode(agent, family, payload, env, pool)
            if on_result:
                on_result(res)
            return res

        try:
            results[family] = list(await asyncio.gather(*(one(p) for p in payloads)))
        finally:
            pool.shutdown(wait=False)
    meta["wall_s"] = round(time.time() - started, 2)
    return build_report(results, meta)


# --- report -------------------------------------------------------------------------------------


def build_report(results: dict[str, list[SampleResult]], meta: dict[str, Any]) -> dict[str, Any]:
    """Per family: total, passed, skipped, success_rate (over samples not skipped), statuses,
    average turns; dbbench adds by_type, AgentBench's categories and overall_cat_accuracy."""
    report: dict[str, Any] = {"meta": meta, "tasks": {}, "samples": {}}
    for family, items in results.items():
        ran = [r for r in items if not r.skipped]
        passed = sum(r.passed for r in ran)
        fam: dict[str, Any] = {
            "total": len(items),
            "passed": passed,
            "skipped": len(items) - len(ran),
            "success_rate": round(passed / len(ran), 4) if ran else 0.0,
            "status": dict(Counter(r.status for r in items)),
            "avg_turns": round(sum(r.turns for r in ran) / len(ran), 3) if ran else 0.0,
        }
        if family == "dbbench":
            by_type: dict[str, dict[str, int]] = {}
            for r in ran:
                slot = by_type.setdefault(r.type, {"total": 0, "passed": 0})
                slot["total"] += 1
                slot["passed"] += int(r.passed)
            fam["by_type"] = dict(sorted(by_type.items()))
            cats: dict[str, dict[str, int]] = {}
            for r in ran:
                cat = r.type if r.type in ("INSERT", "UPDATE", "DELETE") else "SELECT"
                slot = cats.setdefault(cat, {"total": 0, "passed": 0})
                slot["total"] += 1
                slot["passed"] += int(r.passed)
            fam["by_category"] = cats
            accs = [
                cats[c]["passed"] / cats[c]["total"]
                for c in ("SELECT", "INSERT", "UPDATE")
                if c in cats and cats[c]["total"]
            ]
            fam["overall_cat_accuracy"] = round(sum(accs) / len(accs), 4) if accs else 0.0
        report["tasks"][family] = fam
        report["samples"][family] = [asdict(r) for r in items]
    return report


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def render_tables(report: dict[str, Any]) -> list[Any]:
    """rich tables: one per family (summary, per-type accuracy for dbbench, status histogram)."""
    from rich.table import Table

    tables = []
    for family, fam in report["tasks"].items():
        t = Table(
            title=f"AgentBench {family} ({report['meta'].get('split')}, agent "
            f"{report['meta'].get('agent')})",
            show_lines=False,
        )
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("samples", str(fam["total"]))
        t.add_row("skipped", str(fam["skipped"]))
        t.add_row("passed", str(fam["passed"]))
        t.add_row("success rate", f"{fam['success_rate']:.1%}")
        t.add_row("average turns", f"{fam['avg_turns']:.2f}")
        if family == "dbbench":
            t.add_row("overall_cat_accuracy", f"{fam['overall_cat_accuracy']:.1%}")
            for typ, slot in fam["by_type"].items():
                acc = slot["passed"] / slot["total"] if slot["total"] else 0.0
                t.add_row(f"  {typ}", f"{slot['passed']}/{slot['total']} ({acc:.0%})")
        for status, count in sorted(fam["status"].items()):
            t.add_row(f"status: {status}", str(count))
        tables.append(t)
    return tables
