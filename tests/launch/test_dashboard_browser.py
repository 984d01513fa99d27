"""The web dashboard in a real browser: Debian's chromium, headless, driven by Playwright.

A real dataflow service (loopback) holds a node, kept episodes (good and failed) and drops; the
run directory has metrics.jsonl with steps and evaluations. The dashboard serves both; the test
asserts on what the page shows (policy figures, charts, nodes, errors, the episode list, and
the trajectory viewer's turns and token-level loss mask, log-probs and versions) and keeps
screenshots under tests/artifacts/dashboard/ (or $ASTRAFLOW_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))
from dataflow_helpers import TOKEN, ThreadedService, episode, group, make_recipe  # noqa: E402

from astraflow.launch.dashboard import serve_dashboard  # noqa: E402
from astraflow.recipe import recipe_to_toml  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = (
    Path(
        os.environ.get(
            "ASTRAFLOW_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"
        )
    )
    / "dashboard"
)

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not Path(CHROMIUM).exists():
    pytest.skip(
        "Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True
    )


@pytest.fixture
def run(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 30.0, "buffer_steps": 0,
                                             "policies": [{"name": "zero_variance_filter"}]})  # fmt: skip
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.toml").write_text(recipe_to_toml(recipe))  # the tokenizer comes from it
    steps = [{"type": "step", "policy": "policy", "step": i, "time": float(i), "samples": 8,
              "reward_mean": 0.2 + 0.1 * i, "staleness_mean": 0.5} for i in range(1, 15)]  # fmt: skip
    evals = [{"type": "eval", "policy": "policy", "step": s, "accuracy": a, "version": s}
             for s, a in ((0, 0.25), (10, 0.625))]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps + evals))
    with ThreadedService(recipe, run_dir / "dataflow.db") as svc:
        from astraflow.protocol.client import SyncDataflowClient

        with SyncDataflowClient(svc.url, TOKEN, retries=0) as client:
            node = client.register(policies={"policy": 0}, name="box-7", region="eu").node_id
            a, b, c = client.lease(node_id=node, max_tasks=3, versions={"policy": 0}).leases
            client.push(node_id=node, lease_id=a.id, episodes=group(a.task.id, [1, 0, 1, 0]))
            client.push(node_id=node, lease_id=b.id, episodes=group(b.task.id, [0, 0, 0, 0]))
            failing = [
                episode(c.task.id, error="BadRequest: prompt has 443 tokens") for _ in "abcd"
            ]
            client.push(node_id=node, lease_id=c.id, episodes=failing)
        url, stop = serve_dashboard(run_dir, svc.url, TOKEN)
        try:
            yield url
        finally:
            stop()


def test_dashboard_shows_the_run_and_one_trajectory(run):
    base = run.split("/?")[0]
    assert httpx.get(f"{base}/api/summary").status_code == 401  # no token, no data
    assert httpx.get(f"{base}/?token=wrong").status_code == 401
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(run)
            try:
                page.wait_for_selector("#policies tbody tr[data-policy='policy']", timeout=15000)
            except playwright.TimeoutError:
                raise AssertionError(f"page did not render: {errors}") from None
            row = page.locator("#policies tbody tr[data-policy='policy']")
            assert row.locator("[data-field='reward']").inner_text() == "1.600"
            assert row.locator("[data-field='accuracy']").inner_text() == "0.625"
            assert "zero_variance 4" in row.locator("[data-field='dropped']").inner_text()
            assert "running" in page.locator("#state").inner_text()
            # the four charts: uPlot draws a canvas for each panel with data
            for key in ("reward", "accuracy", "samples_per_s", "staleness"):
                assert page.locator(f"[data-chart='{key}'] canvas").count() == 1, key
            assert "box-7" in page.locator("#nodes").inner_text()
            problems = page.locator("#problems").inner_text()
            assert "episode_error: 4 — BadRequest: prompt has 443 tokens" in problems
            page.wait_for_selector("#episodes tr[data-episode]")
            # logging.transcripts_per_step (4) of the 8 good episodes, and the 4 failed ones
            assert page.locator("#episodes tr[data-episode]").count() == 8
            page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)

            page.locator("#failed").check()
            page.wait_for_function(
                "document.querySelectorAll('#episodes tr[data-episode]').length === 4"
            )
            assert "BadRequest" in page.locator("#episodes").inner_text()
            page.locator("#failed").uncheck()
            page.wait_for_function(
                "document.querySelectorAll('#episodes tr[data-episode]').length === 8"
            )
            page.locator("#episodes tr[data-episode]").first.click()
            page.wait_for_selector("#viewer:not([hidden]) .tok")
            meta = page.locator("#viewer-meta").inner_text()
            assert "role agent → policy policy" in meta and "advantage" in meta
            turns = page.locator("#viewer-turns .turn")
            assert turns.count() == 2
            assert "generated by policy" in turns.nth(1).inner_text()
            generated = page.locator("#viewer-tokens .tok.m1")
            assert generated.count() == 8 and page.locator("#viewer-tokens .tok.m0").count() == 4
            assert generated.first.get_attribute("title") == "log-prob -0.2500 · v0"
            page.screenshot(path=str(ARTIFACTS / "trajectory.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
