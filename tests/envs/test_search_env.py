"""Search env: the generated stdlib corpus and QA set, BM25 retrieval, SQuAD scoring, episodes,
user corpus / QA file loaders and their errors."""

from __future__ import annotations

import json

import pytest
from astraflow.envs.base import TaskError
from astraflow.envs.registry import default_registry
from astraflow.envs.search.corpus import CorpusError, Passage, load_corpus_jsonl, load_qa_file
from astraflow.envs.search.index import SearchIndex
from astraflow.envs.search.scoring import best_scores, exact_match, f1_score, normalize_answer
from astraflow.envs.search.stdlib_corpus import (
    collect_passages,
    ensure_stdlib_set,
    make_questions,
    stdlib_questions,
)


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def test_squad_normalisation_and_scores():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match("the eiffel tower", "Eiffel Tower.") == 1.0
    assert exact_match("eiffel", "Eiffel Tower") == 0.0
    assert f1_score("eiffel", "Eiffel Tower") == pytest.approx(2 / 3)
    assert f1_score("a", "the") == 1.0  # both normalise to nothing
    assert best_scores("Paris", ["London", "paris"]) == (1.0, 1.0)


def test_bm25_retrieval_ranks_the_relevant_passage_first():
    index = SearchIndex([
        Passage("1", "Eiffel Tower", "A wrought-iron lattice tower in Paris, France."),
        Passage("2", "Big Ben", "The clock tower at the north end of the Palace of Westminster in London."),
        Passage("3", "Colosseum", "An elliptical amphitheatre in the centre of Rome, Italy."),
    ])  # fmt: skip
    hits = index.search("which tower stands in Paris", k=2)
    assert hits[0].passage.title == "Eiffel Tower"
    assert all(h.score > 0 for h in hits) and len(hits) <= 2
    assert index.search("quantum chromodynamics") == []  # no shared words: no results
    assert index.search("   ") == []


def test_stdlib_set_is_deterministic_and_answerable(tmp_path):
    first = ensure_stdlib_set(tmp_path / "a")
    second = ensure_stdlib_set(tmp_path / "b")
    assert first.corpus_path.read_bytes() == second.corpus_path.read_bytes()
    assert first.qa_path.read_bytes() == second.qa_path.read_bytes()
    passages = load_corpus_jsonl(first.corpus_path)
    titles = {p.title for p in passages}
    assert {"json.dumps", "difflib.get_close_matches", "math.sqrt"} <= titles
    questions = stdlib_questions(root=tmp_path / "a")
    assert 300 <= len(questions) <= 2000  # small enough for CPU training
    assert {q["split"] for q in questions} == {"train", "test"}
    for q in questions:  # every gold answer is stated by the passage the question is about
        module = q["answer"][0] if q["kind"] == "module" else q["answer"][1].rpartition(".")[0]
        assert any(t.startswith(f"{module}.") for t in titles), q


def test_module_questions_are_unambiguous():
    passages = collect_passages(("json", "pickle"))
    questions = make_questions(passages)
    asked = {q["question"] for q in questions if q["kind"] == "module"}
    assert not any("`dumps`" in q for q in asked)  # json.dumps and pickle.dumps: ambiguous
    assert "Which Python standard library module provides the function `JSONDecoder`?" not in asked


def test_retrieval_finds_the_passage_for_most_questions():
    index = SearchIndex(load_corpus_jsonl(ensure_stdlib_set().corpus_path))
    questions = stdlib_questions("test")
    found = 0
    for q in questions:
        target = q["answer"][1] if q["kind"] == "function" else None
        titles = [h.passage.title for h in index.search(q["question"], k=3)]
        if target is None:
            name = q["question"].split("`")[1]
            found += any(t == f"{q['answer'][0]}.{name}" for t in titles)
        else:
            found += target in titles
    assert found / len(questions) > 0.6


def test_episode_search_then_answer(registry):
    env = registry.make("astraflow/Search-v0", max_turns=3)
    task = {
        "id": "q1",
        "question": "Which Python standard library module provides the function `get_close_matches`?",
        "answer": ["difflib"],
    }
    obs, _ = env.reset(options={"task": task})
    assert obs.endswith(task["question"]) and "<search>" in obs
    obs, reward, terminated, truncated, info = env.step(
        "I will look. <search>get_close_matches</search>"
    )
    assert obs.startswith("<information>") and obs.endswith("</information>")
    assert "(Title: difflib.get_close_matches)" in obs
    assert (reward, terminated, truncated, info["searches"]) == (0.0, False, False, 1)
    obs, reward, terminated, truncated, info = env.step("<answer>Difflib.</answer>")
    assert (reward, terminated, info["success"], info["em"]) == (1.0, True, True, 1.0)


def test_invalid_actions_truncation_and_f1(registry):
    env = registry.make("astraflow/Search-v0", max_turns=2, reward="f1")
    env.reset(
        options={"task": {"question": "Where is the Eiffel Tower?", "answer": "Paris, France"}}
    )
    obs, reward, terminated, truncated, info = env.step("just thinking")
    assert obs.startswith("Invalid action") and info["invalid"] and not (terminated or truncated)
    _, reward, terminated, truncated, info = env.step("<answer>Paris</answer>")
    assert reward == pytest.approx(2 / 3) and info["em"] == 0.0 and not info["success"]
    env.reset(options={"task": {"question": "q?", "answer": "x"}})
    env.step("<search>a</search>")
    _, reward, terminated, truncated, info = env.step("<search>b</search>")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


def test_user_corpus_and_qa_files(tmp_path, registry):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        json.dumps({"title": "Mount Kilimanjaro", "text": "The highest mountain in Africa, in Tanzania."}) + "\n"
        + json.dumps({"title": "Mont Blanc", "text": "The highest mountain of the Alps."}) + "\n"
    )  # fmt: skip
    nq = tmp_path / "nq.jsonl"
    nq.write_text(
        json.dumps(
            {
                "question": "highest mountain in africa",
                "answer": ["Kilimanjaro", "Mount Kilimanjaro"],
            }
        )
        + "\n"
    )
    hotpot = tmp_path / "hotpot.json"
    hotpot.write_text(
        json.dumps(
            [{"_id": "h1", "question": "Which range holds Mont Blanc?", "answer": "the Alps"}]
        )
    )
    assert load_qa_file(hotpot) == [
        {"id": "h1", "question": "Which range holds Mont Blanc?", "answer": ["the Alps"]}
    ]
    task = load_qa_file(nq)[0]
    env = registry.make("astraflow/Search-v0", corpus=str(corpus), top_k=1, prompt_template=None)
    obs, _ = env.reset(options={"task": task})
    assert obs == "highest mountain in africa"
    obs, *_ = env.step("<search>highest mountain Africa</search>")
    assert "Kilimanjaro" in obs and "Mont Blanc" not in obs
    _, reward, *_ = env.step("<answer>Kilimanjaro</answer>")
    assert reward == 1.0


def test_bad_files_and_payloads_are_named(tmp_path, registry):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "ok", "text": "fine"}\n{"title": "no text"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: expected an object with a string 'text'"):
        load_corpus_jsonl(bad)
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "q", "answers": []}\n')
    with pytest.raises(
        CorpusError, match=r"qa.jsonl:1: 'answer' must be a string or a non-empty list"
    ):
        load_qa_file(qa)
    env = registry.make("astraflow/Search-v0")
    with pytest.raises(TaskError, match="missing 'answer'"):
        env.reset(options={"task": {"question": "q"}})
    with pytest.raises(TaskError, match="'answer' must be a string or a non-empty list"):
        env.reset(options={"task": {"question": "q", "answer": 3.5j}})
    with pytest.raises(CorpusError, match="neither 'stdlib' nor an existing JSONL file"):
        registry.make("astraflow/Search-v0", corpus=str(tmp_path / "missing.jsonl")).reset(seed=0)
