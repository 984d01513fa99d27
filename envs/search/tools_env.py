"""``astraflow/SearchTools-v0``: the search env with function calling instead of tags.

The same corpus, index, questions and scoring as ``astraflow/Search-v0``, but the model gets two
tools, ``search(query)`` and ``open(doc_id)``, through its chat template (OpenAI tool schemas) and
calls them the way its family does (the policy's ``tool_parser``); a turn without calls is the
answer. Run it with ``workflow.name = "tool_agent"`` (or an ``openai_agent`` that passes
``env``'s tools).
"""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.envs.search.env import SearchEnv
from astraflow.envs.search.scoring import best_scores
from astraflow.envs.tools.env import ToolEnv

DEFAULT_PROMPT = (
    "Answer the question. Use the search tool to find passages in a local corpus and open to read "
    "one; then reply with the answer alone (a few words).\nQuestion: {question}"
)


class SearchToolsEnv(ToolEnv):
    """Question answering over a local corpus with ``search`` and ``open`` tools."""

    family: ClassVar[str] = "search"
    description: ClassVar[str] = "Multi-turn QA with search(query) and open(doc_id) tools (BM25)"
    reward_doc: ClassVar[str] = (
        "On the answer (a turn without tool calls): exact match (reward='em') or token F1 "
        "('f1') against the gold answers, as Search-v0. 0.0 for tool turns and when max_turns "
        "pass without an answer. info: em, f1, searches, answer, success."
    )
    task_fields: ClassVar[dict[str, str]] = SearchEnv.task_fields

    def __init__(self, max_turns: int = 4, render_mode: str | None = None, **search: Any):
        """``search``: Search-v0's settings (``corpus``, ``top_k``, ``reward``,
        ``prompt_template``); the prompt defaults to one that names the tools."""
        search.setdefault("prompt_template", DEFAULT_PROMPT)
        self.search_env = SearchEnv(max_turns=max_turns, **search)
        super().__init__(
            tools=[self.search, self.open], max_turns=max_turns, render_mode=render_mode
        )
        self.searches = 0

    # ------------------------------------------------------------------ the tools
    def search(self, query: str) -> str:
        """Search the corpus; returns the best passages with their ids.

        Args:
            query: words to look for
        """
        self.searches += 1
        hits = self.search_env.index.search(query, self.search_env.top_k)
        if not hits:
            return "No results."
        return "\n".join(
            f"[{h.passage.id}] {h.passage.title}: {h.passage.text[:200]}" for h in hits
        )

    def open(self, doc_id: str) -> str:
        """Read one passage in full.

        Args:
            doc_id: the id a search result shows in brackets
        """
        for passage in self.search_env.index.passages:
            if passage.id == str(doc_id):
                return f"{passage.title}\n{passage.text}"
        return f"error: no passage with id {doc_id!r}"

    # ------------------------------------------------------------------ episode
    def sample_task(self, rng) -> dict[str, Any]:
        return self.search_env.sample_task(rng)

    def validate_task(self, task: dict[str, Any]) -> None:
        self.search_env.validate_task(task)

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        obs, info = self.search_env._reset_task(task)
        self.searches = 0
        self.tool_calls = 0
        return obs, {**info, "tools": self.tool_schemas}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "searches": int(self.searches)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.searches = self._saved_count(state, "searches")

    def _score(self, answer: str) -> tuple[float, dict[str, Any]]:
        em, f1 = best_scores(answer, self.search_env._golds)
        reward = em if self.search_env.reward == "em" else f1
        info = {"answer": answer, "em": em, "f1": f1, "searches": self.searches}
        return reward, {**info, "success": em == 1.0}
