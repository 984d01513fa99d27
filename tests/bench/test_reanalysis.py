"""Issue 43: the declared headline of the agentic bench (``agentic.Declared``, its hash, the
sustained race, the ladder, equal wall clock, equal samples), the re-analysis of stored JSON
files, the journal's failed runs, LoRA ratios of medians, and how ``bench/results.py`` shows
them (declared figure first, censoring both ways, a dirty tree refused for a headline)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _records  # noqa: E402
import _results  # noqa: E402

REPO = BENCH.parent


@pytest.fixture(scope="module")
def agentic():
    import agentic as module

    return module


@pytest.fixture(scope="module")
def results():
    import results as module

    return module


def _run(system: str, seed: int, accs: list[tuple[float, float]], ok: bool = True):
    res = _results.PolicyResult("policy", steps=8, trained_samples=512, train_s=accs[-1][0],
                                samples_per_s=512 / accs[-1][0])  # fmt: skip
    res.evals = [_records.EvalPoint(4 * i, t, a) for i, (t, a) in enumerate(accs)]
    run = _results.RunResult(system, seed, ok, accs[-1][0] + 5, t0=0.0)
    run.policies["policy"] = res
    if not ok:
        run.error = "killed after 1320s\nTraceback ..."
    return run


def _runs():
    """Two seeds. Seed 0: async sustains 0.23 at 10 s, TRL at 80 s, sync at 60 s. Seed 1:
    TRL sustains 0.23 at 100 s, async only crosses it once (0.24 then 0.21): censored against
    async, which a first-crossing table would count in async's favour or drop."""
    return [
        _run("trl", 0, [(0, 0.20), (40, 0.24), (80, 0.25)]),
        _run("astraflow_sync", 0, [(0, 0.20), (30, 0.23), (60, 0.25)]),
        _run("astraflow_async", 0, [(0, 0.20), (5, 0.24), (10, 0.26)]),
        _run("trl", 1, [(0, 0.20), (50, 0.23), (100, 0.24)]),
        _run("astraflow_sync", 1, [(0, 0.20), (40, 0.22), (80, 0.22)]),
        _run("astraflow_async", 1, [(0, 0.20), (8, 0.24), (16, 0.21)]),
    ]


def test_declared_settings_have_a_stable_hash_that_any_change_moves(agentic):
    d = agentic.DECLARED
    assert d.digest() == agentic.Declared().digest() and len(d.digest()) == 16
    assert replace(d, sustained_window=1).digest() != d.digest()
    assert replace(d, noninferiority_margin=0.03).digest() != d.digest()
    with pytest.raises(AttributeError):
        d.seeds = 3  # frozen: fixed in code, not at run time
    assert d.target_gain == agentic.TARGET_GAIN and d.seeds == agentic.SEEDS


def test_declared_analysis_counts_censoring_both_ways(agentic):
    out = agentic.analyse_declared(_runs())
    assert out["declared_hash"] == agentic.DECLARED.digest()
    assert out["target_acc_sustained"] == pytest.approx(0.23)
    vs_trl = out["speedup_vs_trl_sustained_paired"]
    # seed 0: both (80 / 10 = 8x); seed 1: only TRL sustained it
    assert vs_trl["reached"] == 1 and vs_trl["geo_mean"] == pytest.approx(8.0)
    assert vs_trl["only_baseline"] == 1 and vs_trl["only_system"] == 0
    assert out["speedup_vs_trl_sustained"] is None  # async's censored median: never
    sync = out["speedup_async_over_sync_sustained_paired"]
    assert sync["neither"] == 1 and sync["reached"] == 1
    assert out["time_to_target_sustained_s"]["astraflow_async"]["reached"] == 1


def test_declared_analysis_has_a_ladder_with_the_baselines_final_accuracy(agentic):
    out = agentic.analyse_declared(_runs())
    ladder = out["target_ladder"]
    assert len(ladder) >= 4
    assert {"start+0.01", "start+0.02", "start+0.03", "trl median final"} <= set(ladder)
    assert ladder["trl median final"]["level"] == pytest.approx(0.245)
    assert "only_baseline" in ladder["start+0.03"]["astraflow_async_vs_trl"]
    wall = out["acc_at_equal_wallclock"]["astraflow_async median training time"]
    assert wall["budget_s"] == pytest.approx(13.0)
    assert wall["systems"]["trl"]["median"] == pytest.approx(0.20)
    eq = out["final_acc_at_equal_samples"]["astraflow_async_minus_trl"]
    assert eq["margin"] == agentic.DECLARED.noninferiority_margin
    assert eq["verdict"] in {"non-inferior", "inferior", "inconclusive"}


def test_a_failed_seed_is_left_unpaired_and_listed(agentic):
    runs = _runs()
    runs[5] = _run("astraflow_async", 1, [(0, 0.20), (8, 0.24), (16, 0.21)], ok=False)
    out = agentic.analyse_declared(runs)
    assert out["seeds_paired"] == [0] and out["seeds_unpaired"] == [1]
    failed = agentic.failed_runs({"math": runs})
    assert failed == [
        {"case": "math", "system": "astraflow_async", "seed": 1, "timed_out": True,
         "wall_s": 21.0, "error": "killed after 1320s"}
    ]  # fmt: skip


def test_reanalyse_adds_the_declared_figures_and_keeps_the_earlier_ones(agentic, tmp_path):
    runs = _runs()
    path = tmp_path / "agentic.json"
    meta = {"bench": "agentic", "commit": "abc", "dirty": False, "date": "d", "command": "c",
            "machine": {}}  # fmt: skip
    path.write_text(json.dumps({"meta": meta, "target_acc": 0.23, "speedup_vs_trl": 4.35,
                                "speedup_async_over_sync": 3.43,
                                "runs": [r.to_json() for r in runs]}))  # fmt: skip
    data = agentic.reanalyse(path)
    again = agentic.reanalyse(path)  # idempotent: history is not appended twice
    assert data["meta"] == meta  # the runs' stamp stays; the re-analysis has its own
    assert again["reanalysis"]["command"].endswith(f"--reanalyse {path}")
    for key in ("speedup_vs_trl_sustained", "speedup_async_over_sync_sustained",
                "target_ladder", "acc_at_equal_wallclock", "declared_hash"):  # fmt: skip
        assert key in again
    assert again["speedup_vs_trl"] == 4.35  # the earlier headline, unchanged, beside the new
    (old,) = again["metric_history"]
    assert old["speedup_vs_trl"] == 4.35 and old["replaced_by"] == "speedup_vs_trl_sustained"
    # the first-crossing table, recounted: seed 1's async crossed 0.23 first, TRL later
    assert again["speedup_vs_trl_paired"]["only_baseline"] == 0
    assert again["declared_after_runs"] is True and again["failed_runs"] == []


def test_the_stored_agentic_json_is_reproduced_by_its_reanalysis(agentic):
    """docs/results/agentic.json's declared figures are what the re-analysis makes of its own
    stored curves (nothing typed by hand), and it carries every key issue 43 asks for."""
    data = json.loads((REPO / "docs" / "results" / "agentic.json").read_text())
    for key in ("speedup_vs_trl_sustained", "speedup_async_over_sync_sustained",
                "target_ladder", "acc_at_equal_wallclock", "declared_hash"):  # fmt: skip
        assert key in data, key
    assert "only_baseline" in data["speedup_vs_trl_sustained_paired"]
    assert "only_baseline" in data["speedup_vs_trl_paired"]
    runs = [_results.RunResult.from_json(r) for r in data["runs"]]
    fresh = json.loads(json.dumps(agentic.analyse_declared(runs)))
    for key, value in fresh.items():
        assert data[key] == value, key


def test_journal_records_failed_and_timed_out_runs(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = _results.RunJournal(path, {"x": 1})
    bad = _run("trl", 0, [(0, 0.2), (10, 0.3)], ok=False)
    good = _run("trl", 0, [(0, 0.2), (10, 0.3)])
    assert journal.run("math", "trl", 0, lambda: bad) is bad
    assert journal.failures[0]["timed_out"] is True
    assert journal.run("math", "trl", 0, lambda: good) is good  # retried, not hidden
    reopened = _results.RunJournal(path, {"x": 1})
    assert len(reopened) == 1
    assert [(f["system"], f["seed"], f["timed_out"]) for f in reopened.failures] == [
        ("trl", 0, True)
    ]
    assert reopened.run("math", "trl", 0, lambda: pytest.fail("finished runs are reused")).ok


def test_lora_ratios_are_ratios_of_medians_with_the_spread():
    import multi_lora

    full = [{"episodes_per_s": v} for v in (10.0, 20.0, 30.0)]
    adapters = [{"episodes_per_s": v} for v in (40.0, 25.0, 33.0)]
    value, spread = multi_lora.ratio_of_medians(
        {"full": full, "adapters": adapters},
        list(zip(full, adapters, strict=True)),
        "episodes_per_s",
    )
    assert value == pytest.approx(33.0 / 20.0)  # not the median of 4.0, 1.25, 1.1
    assert spread["ratio_of_medians"] == value and spread["median"] == pytest.approx(1.25)
    assert (spread["min"], spread["max"]) == (pytest.approx(1.1), pytest.approx(4.0))


def test_results_show_the_declared_figure_first_and_counts_both_ways(agentic, results):
    data = json.loads((REPO / "docs" / "results" / "agentic.json").read_text())
    text = "\n".join(results.render_agentic(data))
    assert text.index("Declared headline") < text.index("Earlier metric")
    assert data["declared_hash"] in text
    assert "only baseline" in text
    head = results.render_headline({"agentic": data})
    assert head.index("declared") < head.index("earlier metric, replaced")
    assert "only baseline" in results.cell(data["speedup_vs_trl_paired"])


def test_a_dirty_tree_is_refused_for_a_headline(results):
    meta = {"bench": "agentic", "commit": "abc", "dirty": True, "date": "d", "command": "c"}
    data = {"meta": meta, "tools": {"speedup_vs_trl": 7.2}}
    head = results.render_headline({"agentic_tools": data})
    assert "7.2" not in head and "refused" in head
    allowed = results.render_headline({"agentic_tools": data | {"allow_dirty": True}})
    assert "7.2x" in allowed and "--allow-dirty" in allowed
    clean = results.render_headline({"agentic_tools": data | {"meta": meta | {"dirty": False}}})
    assert "7.2x" in clean and "refused" not in clean


def test_the_stored_multi_policy_paired_tables_count_both_ways(tmp_path):
    """The verifier's race in docs/results/multi_policy_agentic.json: two seeds where only
    lock-step reached the level (seeds the earlier table dropped), and a re-analysis of a copy
    reproduces the stored tables."""
    import multi_policy_agentic as mpa

    stored = REPO / "docs" / "results" / "multi_policy_agentic.json"
    data = json.loads(stored.read_text())
    verifier = data["speedup_time_to_acc_by_policy_paired"]["verifier"]
    assert verifier["only_baseline"] == 2 and verifier["seeds"] == len(data["seeds_paired"])
    copy = tmp_path / "mpa.json"
    copy.write_text(stored.read_text())
    again = mpa.reanalyse(copy)
    for key in ("speedup_time_to_acc_paired", "speedup_time_to_acc_by_policy_paired",
                "speedup_time_to_acc_sustained"):  # fmt: skip
        assert again[key] == data[key], key
    assert data["speedup_time_to_acc"] == again["speedup_time_to_acc"]  # the rest is kept
