"""``astraflow/AgentBench-OS-v0``: AgentBench's os_interaction task as a multi-turn text env.

Each episode gets a fresh sandbox (:mod:`astraflow.envs.agentbench.os.sandbox`); the sample's init scripts
run as independent processes, its start script in the agent's persistent shell (so background jobs
it launches keep running), then the agent acts for at most 8 rounds. ``Act: bash`` runs its bash
blocks (30 s per command), ``Act: answer(...)`` / ``Act: finish`` commit and are judged by the
sample's ``match`` or ``check`` chain inside the same system. Reward 1 when judged correct, else 0.
"""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.envs.agentbench.os.sandbox import SandboxError, SandboxFactory, select_sandbox
from astraflow.envs.agentbench.os.scoring import judge, observation_for, parse_action, script_argv
from astraflow.envs.agentbench.status import SampleStatus, TaskSkipped
from astraflow.envs.base import TextEnv

ROUND_LIMIT = 8
COMMAND_TIMEOUT_S = 30.0

INSTRUCTIONS = """You are operating a Linux (Ubuntu-like) machine on my behalf. I will describe a task; \
you either perform it or answer a question about the system. I play the operating system: I run \
your commands and show you their output.

In every turn, first write your reasoning after "Think:", then choose exactly ONE action:

1. Run bash code:
Think: <your reasoning>

Act: bash

```bash
# your commands
```

2. Declare the task done (no answer needed):
Think: <your reasoning>

Act: finish

3. Give the answer to my question:
Think: <your reasoning>

Act: answer(<your answer, inside the parentheses>)

Long outputs are cut and marked as truncated; handle that yourself (e.g. count with wc instead of \
listing). Commands must not wait for input. You have at most {rounds} turns.

Example.
Task: how many files are in the directory "/etc"?
Think: Listing /etc would be long, so I count the entries directly.

Act: bash

```bash
ls -1 /etc | wc -l
```
OS: The output of the OS:

220
Think: The count is 220.

Act: answer(220)

Now a new task in a new system. My problem is:

{description}"""

#: The same protocol in two lines, for small-context models (the tiny CPU starter policy).
COMPACT_INSTRUCTIONS = """Bash: "Act: bash" then a ```bash block. Answer: "Act: answer(X)". Done: \
"Act: finish".
{description}"""


class AgentBenchOSEnv(TextEnv):
    family = "agentbench"
    description = "AgentBench v0.2 os_interaction: a bash agent in a fresh throw-away Linux system"
    action_format = (
        "'Think: ...' then one of: 'Act: bash' + a ```bash block; 'Act: finish'; "
        "'Act: answer(ANSWER)'"
    )
    reward_doc = (
        "1.0 when the committed answer passes the sample's match rule or check-script chain "
        "(AgentBench's judge), else 0.0; round limit 8"
    )
    task_fields: ClassVar[dict[str, str]] = {
        "id": "sample id",
        "description": "the question or job, shown to the agent",
        "init": "optional list of [language, code] set-up scripts (independent processes)",
        "start": "optional [language, code] run in the agent's shell (background jobs)",
        "match": "optional {answer|regex, strip} rule (this or check)",
        "check": "optional list of [language, code] or null (= example) check steps",
        "example": "optional [language, code] reference script used by null check steps",
        "requires": "optional list of capabilities the set-up needs (users, network)",
    }

    def __init__(
        self,
        max_turns: int = ROUND_LIMIT,
        sandbox: str | SandboxFactory = "auto",
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        data_dir: str | None = None,
        prompt_style: str = "full",
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if prompt_style not in ("full", "compact"):
            raise ValueError(f"prompt_style must be 'full' or 'compact', got {prompt_style!r}")
        self.prompt_style = prompt_style
        self._sandbox_spec = sandbox
        self._factory: SandboxFactory | None = (
            sandbox if isinstance(sandbox, SandboxFactory) else None
        )
        self._data_dir = data_dir
        self.command_timeout_s = command_timeout_s
        self._box = None
        self.status = SampleStatus.RUNNING
        self.answer: str | None = None

    @property
    def factory(self) -> SandboxFactory:
        if self._factory is None:
            dockerfiles = None
            try:
                from astraflow.envs.agentbench.data import dockerfiles_dir

                dockerfiles = dockerfiles_dir(self._data_dir)
            except ValueError:
                pass
            self._factory = select_sandbox(str(self._sandbox_spec), dockerfiles)
        return self._factory

    def sample_task(self, rng) -> dict[str, Any]:
        n = int(rng.integers(2, 6))
        files = " && ".join(f"touch /root/demo/f{i}.txt" for i in range(n))
        return {
            "id": f"demo-{n}",
            "description": "How many files are in /root/demo? Answer with the number only.",
            "init": [["bash", f"mkdir -p /root/demo && {files}"]],
            "start": None,
            "match": {"answer": str(n), "strip": True},
            "check": None,
            "example": None,
            "requires": [],
        }

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.close()
        caps = self.factory.capabilities
        missing = [r for r in task.get("requires", []) if not getattr(caps, r, False)]
        if missing:
            raise TaskSkipped(
                f"sample {task.get('id')} needs {' and '.join(missing)}, which the "
                f"{self.factory.backend} sandbox does not offer"
            )
        self._box = self.factory()
        self.status = SampleStatus.RUNNING
        self.answer = None
        try:
            for script in task.get("init") or []:
                self._box.run(script_argv(script, []), timeout=120)
            start = task.get("start")
            if start:
                self._box.shell(start[1], timeout=self.command_timeout_s)
        except SandboxError:
            self.close()
            raise
        template = INSTRUCTIONS if self.prompt_style == "full" else COMPACT_INSTRUCTIONS
        obs = template.format(rounds=self.max_turns, description=task["description"])
        return obs, {"sample_id": task.get("id"), "sandbox": self.factory.backend}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        parsed = parse_action(action)
        info: dict[str, Any] = {"sample_id": self.task.get("id"), "turns": self.turn}
        if parsed.kind is None:
            return self._finish(SampleStatus.AGENT_INVALID_ACTION, info, passed=False)
        if parsed.kind == "commit":
            self.answer = parsed.content
            try:
                passed, note = judge(parsed.content, self.task, self._box)
            except (SandboxError, ValueError) as exc:
                passed, note = False, f"judge error: {exc}"
            info.update(answer=parsed.content, judge=note)
            return self._finish(SampleStatus.COMPLETED, info, passed=passed)
        try:
            result = self._box.shell(parsed.content or "", timeout=self.command_timeout_s)
        except SandboxError as exc:
            info["error"] = str(exc)
            return self._finish(SampleStatus.UNKNOWN, info, passed=False)
        if self.turn >= self.max_turns:
            return self._finish(SampleStatus.TASK_LIMIT_REACHED, info, passed=False)
        return observation_for(result.text), 0.0, False, info

    def _finish(self, status: SampleStatus, info: dict[str, Any], passed: bool):
        self.status = status
        info.update(status=status.value, success=passed)
        self.close()
        return "", 1.0 if passed else 0.0, True, info

    def abort(self, status: SampleStatus) -> dict[str, Any]:
        """End the episode from outside (e.g. the agent's context is full) as a failure."""
        return self._finish(status, {"sample_id": self.task.get("id"), "turns": self.turn}, False)[
            3
        ]

    def close(self) -> None:
        box, self._box = self._box, None
        if box is not None:
            box.close()
