"""``astraflow/AgentBench-DB-v0``: AgentBench's dbbench task as a multi-turn text env.

Each episode loads the sample's table into a fresh database (SQLite by default, or MySQL/MariaDB via
``db="mysql://..."``). The agent runs SQL (``Action: Operation`` + a ```` ```sql ```` block; at most 15
operations) and ends with ``Action: Answer`` + ``Final Answer: [...]``. The episode is scored as
AgentBench scores it (:mod:`astraflow.envs.agentbench.dbbench.scoring`): reward 1 when correct, else 0.
"""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.envs.agentbench.dbbench.backends import TableSpec, make_backend
from astraflow.envs.agentbench.dbbench.scoring import MODIFYING_TYPES, parse_reply, score
from astraflow.envs.agentbench.status import SampleStatus
from astraflow.envs.base import TextEnv

MAX_ROUND = 15

INSTRUCTIONS = """You will answer a question by working with a {engine} database through SQL. Explain \
your reasoning and plan before acting. In each turn you either run one SQL statement or give your \
final answer.

To run SQL, write exactly:
Action: Operation
```sql
SELECT * FROM table WHERE condition;
```
Put the SQL in a ```sql block with nothing else in it, on one line. Only one statement per turn: \
I run the statement of the first ```sql block and reply with its raw {engine} output, which you must \
interpret yourself.

When you are sure of the answer, write exactly:
Action: Answer
Final Answer: ["ANSWER1", "ANSWER2", ...]
Do not use this pattern before you are sure: the answer must match the correct answer exactly. If \
the question asks you to modify the database, perform the modification first; the final answer \
can then be anything.
A reply that follows neither pattern ends the task as a failure. You may run at most {rounds} \
statements.

{description}
{add_description}"""

#: The same protocol in two lines, for small-context models (the tiny CPU starter policy).
COMPACT_INSTRUCTIONS = """SQL: "Action: Operation" then a ```sql block. Done: "Action: Answer" then \
"Final Answer: [...]".
{description}"""


class AgentBenchDBEnv(TextEnv):
    family = "agentbench"
    description = "AgentBench v0.2 dbbench: answer or modify a table with SQL (SQLite or MySQL)"
    action_format = (
        "'Action: Operation' + one ```sql block (one statement), or 'Action: Answer' + "
        "'Final Answer: [\"A\", ...]'"
    )
    reward_doc = (
        "1.0 when correct as AgentBench scores it (SELECT types: answer list vs label, numeric "
        "for single values, else set equality; INSERT/UPDATE: table hash vs answer_md5), else 0.0"
    )
    task_fields: ClassVar[dict[str, str]] = {
        "id": "sample id",
        "description": "the question or instruction",
        "add_description": "optional table description (name and headers)",
        "type": "AgentBench type: INSERT, UPDATE, DELETE or a SELECT kind (counting, other, ...)",
        "table_name": "table name",
        "columns": "list of column names (all created as TEXT)",
        "rows": "list of rows (lists of strings)",
        "label": "gold answers (SELECT types) or gold SQL (modifications)",
        "answer_md5": "optional: table-hash result string (required for INSERT/UPDATE/DELETE)",
    }

    def __init__(
        self,
        max_turns: int = MAX_ROUND + 1,
        db: str | None = None,
        max_round: int = MAX_ROUND,
        prompt_style: str = "full",
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if prompt_style not in ("full", "compact"):
            raise ValueError(f"prompt_style must be 'full' or 'compact', got {prompt_style!r}")
        self.prompt_style = prompt_style
        self.backend = make_backend(db)
        self.max_round = max_round
        self.session = None
        self.rounds = 0
        self.status = SampleStatus.RUNNING

    def sample_task(self, rng) -> dict[str, Any]:
        n = int(rng.integers(2, 6))
        rows = [[f"item{i}", str(int(rng.integers(1, 100)))] for i in range(n)]
        return {
            "id": f"demo-{n}",
            "description": "How many rows does the table have?",
            "add_description": "The name of this table is demo, and the headers of this table are name,value.",
            "type": "counting",
            "table_name": "demo",
            "columns": ["name", "value"],
            "rows": rows,
            "label": [str(n)],
        }

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.close()
        if task["type"] in MODIFYING_TYPES and "answer_md5" not in task:
            from astraflow.envs.base import TaskError

            raise TaskError(f"{task.get('id')}: {task['type']} samples need 'answer_md5'")
        self.session = self.backend.open(TableSpec.from_payload(task))
        self.rounds = 0
        self.status = SampleStatus.RUNNING
        template = INSTRUCTIONS if self.prompt_style == "full" else COMPACT_INSTRUCTIONS
        obs = template.format(
            engine="SQLite" if self.backend.name == "sqlite" else "MySQL",
            rounds=self.max_round,
            description=task["description"],
            add_description=task.get("add_description", ""),
        ).rstrip("\n")
        info = {"sample_id": task.get("id"), "type": task["type"], "db": self.backend.name}
        if self.session.load_error:
            info["load_error"] = self.session.load_error
        return obs, info

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        parsed = parse_reply(action)
        info: dict[str, Any] = {"sample_id": self.task.get("id"), "type": self.task["type"]}
        if self.session.load_error:  # repeated per step: a workflow reports only the last info
            info["load_error"] = self.session.load_error
        if parsed.kind == "operation" and self.rounds < self.max_round:
            if parsed.sql is None:
                return self._finish(SampleStatus.AGENT_VALIDATION_FAILED, "", info)
            result = self.session.execute(parsed.sql)
            self.rounds += 1
            info["rounds"] = self.rounds
            if self.turn >= self.max_turns:  # the env's own turn budget ran out first
                return self._finish(SampleStatus.TASK_LIMIT_REACHED, "", info)
            return result, 0.0, False, info
        # Anything else (an answer, no action, or an operation past the limit) ends the episode.
        answer = parsed.answer
        status = (
            SampleStatus.COMPLETED if answer is not None else SampleStatus.AGENT_VALIDATION_FAILED
        )
        if self.rounds >= self.max_round and not answer:
            status = SampleStatus.TASK_LIMIT_REACHED
        return self._finish(status, answer or "", info)

    def _finish(self, status: SampleStatus, answer: str, info: dict[str, Any]):
        self.status = status
        if self.task["type"] in MODIFYING_TYPES:
            answer = self.session.table_hash()
        passed = score(self.task, answer)
        info.update(status=status.value, answer=answer, success=passed, rounds=self.rounds)
        self.close()
        return "", 1.0 if passed else 0.0, True, info

    def abort(self, status: SampleStatus) -> dict[str, Any]:
        """End the episode from outside (e.g. the agent's context is full); scored as it stands."""
        info: dict[str, Any] = {"sample_id": self.task.get("id"), "type": self.task.get("type")}
        if self.session is None:
            return {**info, "status": self.status.value, "success": False}
        return self._finish(status, "", info)[3]

    def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()
