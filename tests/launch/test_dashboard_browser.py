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
              "reward_mean": 0.2 + 0.1 * i, "staleness_mean": 0.5,
              "metrics": {"loss": 0.1 / i, "grad_norm": 2.0 + i % 3, "entropy": 0.5 - 0.01 * i,
                          "completions/mean_length": 3.0 + i % 2, "wall_time_s": 0.2}}
             for i in range(1, 15)]  # fmt: skip
    evals = [{"type": "eval", "policy": "policy", "step": s, "accuracy": a, "version": s,
              "n": 4, "errors": e} for s, a, e in ((0, 0.25, 0), (10, 0.625, 0), (12, 0.0, 4))]  # fmt: skip
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


def assert_drawn(chart) -> None:
    """The chart's screenshot holds a drawn line, not a blank box (many colours, not one)."""
    from io import BytesIO

    from PIL import Image

    image = Image.open(BytesIO(chart.screenshot())).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20, f"a blank chart: {len(colours)} colours"


def _browser(p):
    return p.chromium.launch(
        executable_path=CHROMIUM,
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
    )


def test_a_finished_run_shows_its_final_state_and_stop_reason(tmp_path):
    """No live service: the page reads the final status from the run_summary record and how
    the run ended from outcome.json (a finished run showed "-" and no reason)."""
    from astraflow.launch.dashboard import DashboardSource, create_dashboard_app
    from astraflow.launch.outcome import RunOutcome
    from astraflow.weights.server import serve_in_thread

    recipe = make_recipe(tmp_path)
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.toml").write_text(recipe_to_toml(recipe))
    status = {
        "run": "t", "done": True,
        "policies": {"policy": {"trainable": True, "latest_version": 7, "steps": 7,
                                "max_steps": 40, "buffer_groups": 3,
                                "dropped": {"zero_variance": 15976}}},
        "nodes": [{"id": "node-1", "name": "box-7", "region": "eu", "state": "left",
                   "versions": {"policy": 7}, "episodes_per_s": 1.5,
                   "metrics": {"tokens_per_s": 30.0, "weight_sync_s": 0.01, "errors": 2.0}}],
        "errors": {},
    }  # fmt: skip
    steps = [{"type": "step", "policy": "policy", "step": i, "time": float(i),
              "reward_mean": 0.0, "metrics": {"loss": 0.0}} for i in range(1, 8)]  # fmt: skip
    records = [*steps, {"type": "run_summary", "status": status, "time": 9.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    RunOutcome("stalled", "constant reward 0.0 for 120 s: every group is filtered",
               "all 3 services stopped cleanly").write(run_dir)  # fmt: skip
    url, stop = serve_in_thread(create_dashboard_app(DashboardSource(run_dir), TOKEN),
                                "127.0.0.1", 0)  # fmt: skip
    try:
        with playwright.sync_playwright() as p:
            browser = _browser(p)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/?token={TOKEN}")
                page.wait_for_selector("#policies tbody tr[data-policy='policy']", timeout=15000)
                assert page.locator("#state").inner_text() == "finished: stalled"
                reason = page.locator("[data-stop-reason='stalled']").inner_text()
                assert "constant reward 0.0 for 120 s" in reason
                assert "all 3 services stopped cleanly" in reason
                row = page.locator("#policies tbody tr[data-policy='policy']").inner_text()
                assert "7/40" in row and "3 groups" in row and "zero_variance 15976" in row
                assert "box-7" in page.locator("#nodes").inner_text()
                assert page.locator("[data-chart='loss'] canvas").count() == 1
                page.wait_for_selector("#episodes .note")  # no store: said, not an error
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "finished.png"), full_page=True)
            finally:
                browser.close()
    finally:
        stop()


def test_dashboard_shows_the_run_and_one_trajectory(run):
    base = run.split("/?")[0]
    assert httpx.get(f"{base}/api/summary").status_code == 401  # no token, no data
    assert httpx.get(f"{base}/?token=wrong").status_code == 401
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = _browser(p)
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
            # the evaluation at step 12 errored on every task: listed, not charted as accuracy 0
            assert row.locator("[data-field='accuracy']").inner_text() == "0.625"
            errored = page.locator("[data-errored-eval='12']").inner_text()
            assert "errored on all 4 tasks" in errored
            assert "zero_variance 4" in row.locator("[data-field='dropped']").inner_text()
            assert "running" in page.locator("#state").inner_text()
            # every logged figure is charted in its group: uPlot draws a canvas per chart
            expected = {
                "learning": ("reward_mean", "accuracy", "loss", "grad_norm", "entropy"),
                "data": ("samples_per_s", "staleness_mean", "completions/mean_length"),
                "system": ("wall_time_s",),
            }
            for group, keys in expected.items():
                for key in keys:
                    chart = page.locator(f"[data-group='{group}'] [data-chart='{key}'] canvas")
                    assert chart.count() == 1, (group, key)
            assert_drawn(page.locator("[data-chart='loss']"))
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
