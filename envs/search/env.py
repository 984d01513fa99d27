"""``astraflow/Search-v0``: multi-turn retrieval with a local BM25 index, then an answer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from astraflow.envs.base import TaskError, TextEnv
from astraflow.envs.search.corpus import CorpusError, normalise_answers
from astraflow.envs.search.index import SearchIndex, index_for_file
from astraflow.envs.search.scoring import best_scores

_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)

DEFAULT_PROMPT = (
    "Answer the question. You may search a local corpus as often as you need by writing "
    "<search>query</search>; the results come back between <information> and </information>. "
    "When you know the answer, write it as <answer>...</answer> (a few words, no explanation).\n"
    "Question: {question}"
)
INVALID_ACTION = (
    "Invalid action: write <search>query</search> to search, or <answer>...</answer> to answer."
)


def format_hits(hits) -> str:
    """Search-R1's layout: numbered passages with their titles inside <information> tags."""
    if not hits:
        return "<information>No results.</information>"
    docs = "\n".join(
        f"Doc {i} (Title: {h.passage.title}) {h.passage.text}" for i, h in enumerate(hits, start=1)
    )
    return f"<information>{docs}</information>"


class SearchEnv(TextEnv):
    """Question answering with a search tool over a local corpus (default: stdlib docstrings)."""

    family: ClassVar[str] = "search"
    description: ClassVar[str] = "Multi-turn QA with <search> over a local BM25 index"
    action_format: ClassVar[str] = (
        "Each turn contains <search>query</search> (get the top_k passages as "
        "<information>Doc i (Title: t) text ...</information>) or <answer>text</answer> (ends the "
        "episode). The first complete tag in the turn counts; text around it is ignored. A turn "
        "with neither tag gets an 'Invalid action' observation."
    )
    reward_doc: ClassVar[str] = (
        "On <answer>: exact match (reward='em', default) or token F1 (reward='f1') against the gold "
        "answers after SQuAD normalisation (lower case, no punctuation/articles), best over the "
        "golds. 0.0 for searches and invalid turns; 0.0 and success False when max_turns pass "
        "without an answer. info: em, f1, searches, answer, success."
    )
    task_fields: ClassVar[dict[str, str]] = {
        "question": "question text (str)",
        "answer": "gold answer: a string or a list of acceptable strings",
        "id": "optional task id",
    }

    def __init__(
        self,
        max_turns: int = 4,
        corpus: str = "stdlib",
        top_k: int = 3,
        reward: str = "em",
        prompt_template: str | None = DEFAULT_PROMPT,
        render_mode: str | None = None,
    ):
        """``corpus`` is ``"stdlib"`` (generated and cached, see :mod:`astraflow.envs.search.stdlib_corpus`)
        or the path of a JSONL corpus of ``{"title", "text"}``. ``prompt_template`` must contain
        ``{question}``; None shows the question alone."""
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if prompt_template is not None and "{question}" not in prompt_template:
            raise ValueError(
                f"prompt_template must contain '{{question}}', got {prompt_template!r:.120}"
            )
        if corpus != "stdlib" and not Path(corpus).is_file():
            raise CorpusError(f"corpus {corpus!r} is neither 'stdlib' nor an existing JSONL file")
        self.corpus = corpus
        self.top_k = top_k
        self.reward = reward
        self.prompt_template = prompt_template
        self._index: SearchIndex | None = None
        self._golds: list[str] = []
        self._searches = 0

    @property
    def index(self) -> SearchIndex:
        if self._index is None:
            if self.corpus == "stdlib":
                from astraflow.envs.search.stdlib_corpus import ensure_stdlib_set

                path = ensure_stdlib_set().corpus_path
            else:
                path = Path(self.corpus)
            self._index = index_for_file(path)
        return self._index

    def sample_task(self, rng) -> dict[str, Any]:
        if self.corpus != "stdlib":  # a user corpus has no built-in questions: ask about a title
            passage = self.index.passages[int(rng.integers(0, len(self.index)))]
            return {
                "id": f"sample-{passage.id}",
                "question": passage.text[:200],
                "answer": [passage.title],
            }
        from astraflow.envs.search.stdlib_corpus import stdlib_questions

        questions = stdlib_questions("test")
        q = questions[int(rng.integers(0, len(questions)))]
        return {"id": q["id"], "question": q["question"], "answer": q["answer"]}

    def validate_task(self, task: dict[str, Any]) -> None:
        super().validate_task(task)
        name = type(self).__name__
        if not isinstance(task["question"], str) or not task["question"].strip():
            raise TaskError(
                f"{name}: task field 'question' must be a non-empty string, got {task['question']!r:.80}"
            )
        try:
            normalise_answers(task["answer"], f"{name}: task")
        except CorpusError as exc:
            raise TaskError(str(exc)) from None

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._golds = normalise_answers(task["answer"], "task")
        self._searches = 0
        self.index  # noqa: B018 - build or fetch the index now, not inside the first step
        question = task["question"]
        obs = (
            self.prompt_template.replace("{question}", question)
            if self.prompt_template
            else question
        )
        return obs, {"task_id": task.get("id")}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        match = _TAG.search(action)
        info: dict[str, Any] = {"turn": self.turn, "searches": self._searches}
        if match is None:
            info["invalid"] = True
            return INVALID_ACTION, 0.0, False, info
        kind, content = match.group(1).lower(), match.group(2).strip()
        if kind == "search":
            self._searches += 1
            info["searches"] = self._searches
            info["query"] = content
            return format_hits(self.index.search(content, self.top_k)), 0.0, False, info
        em, f1 = best_scores(content, self._golds)
        info.update(answer=content, em=em, f1=f1, success=em == 1.0)
        return "", (em if self.reward == "em" else f1), True, info
