"""The documentation describes main: the README is a short user guide without lab-notebook words,
its links resolve, every figure in ``docs/results.md`` (and the README's headline table) is what
``bench/results.py`` makes of the benches' JSON files, and every design decision has a
status."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import results  # noqa: E402

README = REPO / "README.md"

#: words a user cannot act on: the history of the work, not what main does
PROCESS_WORDS = (
    "previous release",
    "re-measured",
    "submission",
    "submitted",
    "before the last merge",
    "was lent",
    "the issue's",
    "still to be",
    "this session",
    "next session",
)


def test_readme_is_a_short_user_guide():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; keep it a guide (<= 300)"
    text = README.read_text().lower()
    found = [w for w in PROCESS_WORDS if w in text]
    assert not found, f"README.md says {found}: docs describe main, not its history"


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (REPO / "docs").glob("*.md"))]
)
def test_relative_links_resolve(doc):
    path = README if doc == "README.md" else REPO / "docs" / doc
    broken = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (path.parent / target).exists():
            broken.append(target)
    assert not broken, f"{doc} links to missing files: {broken}"


def test_results_md_is_generated_from_the_bench_json():
    want = results.render_results_md(results.load_results())
    have = results.RESULTS_MD.read_text() if results.RESULTS_MD.exists() else ""
    assert have == want, "docs/results.md differs from its JSON; run python bench/results.py"


def test_readme_headline_table_is_generated_from_the_bench_json():
    text = README.read_text()
    want = results.readme_with_headline(text, results.render_headline(results.load_results()))
    assert text == want, "README's headline table differs; run python bench/results.py"


def test_every_bench_json_is_stamped():
    for name, data in results.load_results().items():
        meta = data.get("meta") or {}
        missing = [k for k in ("bench", "commit", "date", "machine", "command") if not meta.get(k)]
        assert not missing, f"docs/results/{name}.json lacks meta {missing}: write it with --json"


def test_rendering_reads_figures_from_the_json(tmp_path):
    """A changed figure in a JSON file changes the generated page (nothing is typed by hand)."""
    meta = {"bench": "toy", "commit": "abc", "date": "2026-01-01T00:00:00Z", "command": "x",
            "machine": {"cpus": 2}}  # fmt: skip
    (tmp_path / "toy.json").write_text(_json({"meta": meta, "speedup": 2.5}))
    first = results.render_results_md(results.load_results(tmp_path))
    (tmp_path / "toy.json").write_text(_json({"meta": meta, "speedup": 3.5}))
    second = results.render_results_md(results.load_results(tmp_path))
    assert "2.5" in first and "3.5" in second and first != second


def test_every_decision_has_a_status():
    text = (REPO / "docs" / "decisions.md").read_text()
    entries = re.split(r"(?m)^## ", text)[1:]
    assert entries
    for entry in entries:
        title, _, body = entry.partition("\n")
        status = body.strip().splitlines()[0] if body.strip() else ""
        assert re.match(r"Status: (current|superseded by .+)", status), (
            f"decision {title!r} needs a 'Status: current.' or 'Status: superseded by ...' line"
        )


def _json(obj) -> str:
    import json

    return json.dumps(obj)
