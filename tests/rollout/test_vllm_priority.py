"""The vLLM engine passes each request's priority (oldest group first) and starts its server with
``--scheduling-policy priority``. vLLM cannot run here, so the server is a recording stand-in
(``fake_vllm_server.py``) that the engine starts exactly as it starts vLLM, over real HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from astraflow.models.registry import resolve_model
from astraflow.rollout.engines import SamplingParams
from astraflow.rollout.engines.vllm_engine import VllmEngine

FAKE = Path(__file__).with_name("fake_vllm_server.py")


def _records(path: Path) -> tuple[list[str], list[dict]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return lines[0]["argv"], [r["body"] for r in lines[1:] if r["path"] == "/v1/completions"]


def _generate_all(engine: VllmEngine, priorities: list[float]) -> None:
    async def main() -> None:
        try:
            await engine.wait_ready()
            for priority in priorities:
                await engine.generate([1, 2, 3], SamplingParams(max_tokens=1, priority=priority))
        finally:
            await engine.close()

    asyncio.run(main())


def test_priority_reaches_the_server_and_the_server_schedules_by_it(tmp_path):
    record = tmp_path / "record.jsonl"
    engine = VllmEngine(
        resolve_model("builtin:tiny-arith"), python=str(FAKE), env={"FAKE_VLLM_RECORD": str(record)},
        workdir=tmp_path / "work", startup_timeout=60,
    )  # fmt: skip
    # two groups: one started at t=100.0 s, a younger one at t=100.25 s (monotonic seconds)
    _generate_all(engine, [100.25, 100.0])
    argv, bodies = _records(record)
    at = argv.index("--scheduling-policy")
    assert argv[at + 1] == "priority"
    assert [b["priority"] for b in bodies] == [100250, 100000]  # ms, lower is served first


def test_no_priority_for_a_server_without_the_priority_policy(tmp_path):
    record = tmp_path / "record.jsonl"
    engine = VllmEngine(
        resolve_model("builtin:tiny-arith"), python=str(FAKE), env={"FAKE_VLLM_RECORD": str(record)},
        workdir=tmp_path / "work", startup_timeout=60,
        extra_args=["--scheduling-policy", "fcfs"],
    )  # fmt: skip
    _generate_all(engine, [5.0])
    argv, bodies = _records(record)
    assert argv.count("--scheduling-policy") == 1 and "priority" not in argv
    assert "priority" not in bodies[0]  # vLLM refuses a non-zero priority under fcfs
