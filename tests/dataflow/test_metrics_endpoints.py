"""`GET /metrics` on every service over real HTTP, with the documented names (docs/observability.md):
the dataflow (status as metric families plus the lease wake-up histogram), the trainer's weight
server (step and publish times, downloads), the OpenAI-compatible policy server (generation
time and tokens) and a region's weight cache (its stats). Each needs a token of the run, like every
other route. Rollout nodes open no port; their figures are the dataflow's ``astraflow_node_*``."""

from __future__ import annotations

import httpx
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

from astraflow.protocol.client import SyncDataflowClient
from astraflow.protocol.prometheus import DATAFLOW_METRICS, WEIGHT_CACHE_METRICS
from astraflow.rollout.engines.openai_server import create_app
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.trainer.main import TrainerMetrics
from astraflow.weights import WeightStore
from astraflow.weights.server import create_weight_app, serve_in_thread


def scrape(url: str, token: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{url}/metrics", headers=headers, timeout=10)


def test_dataflow_metrics_carry_every_documented_name(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"policies": [{"name": "zero_variance_filter"}]})
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}, name="box").node_id
        a, b = client.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases
        client.push(node_id=node, lease_id=a.id, episodes=group(a.task.id, [0, 0, 0, 0]))
        client.push(node_id=node, lease_id=b.id, episodes=group(b.task.id, [1, 0, 1, 0]))
        assert scrape(svc.url, None).status_code == 401
        reply = scrape(svc.url, TOKEN)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    for name in DATAFLOW_METRICS:
        assert f"# HELP {name}" in text, name
    assert 'astraflow_dropped_total{policy="policy",reason="zero_variance"} 4.0' in text
    assert "astraflow_episodes_total 8.0" in text
    assert 'astraflow_buffer_groups{policy="policy"} 1.0' in text
    assert f'astraflow_node_episodes_per_s{{node="box",node_id="{node}",region="local"}}' in text
    assert "astraflow_lease_wait_seconds_count 1.0" in text  # the one call that got leases


def test_weight_server_and_policy_server_metrics(tmp_path):
    metrics = TrainerMetrics("policy")
    metrics.stepped(1)
    with metrics.publish.time():
        pass
    app = create_weight_app(WeightStore(tmp_path / "w"), TOKEN, metrics.service)
    url, stop = serve_in_thread(app)
    try:
        assert scrape(url, None).status_code == 401
        text = scrape(url, TOKEN).text
    finally:
        stop()
    for name in ("astraflow_trainer_step_seconds", "astraflow_weight_publish_seconds",
                 "astraflow_trainer_version", "astraflow_weight_downloads"):  # fmt: skip
        assert f"# HELP {name}" in text, name
    assert 'astraflow_trainer_step_seconds_count{policy="policy"} 1.0' in text
    assert 'astraflow_trainer_version{policy="policy"} 1.0' in text

    engine = ScriptedEngine(lambda obs: "42")
    url, stop = serve_in_thread(create_app(engine, "tiny", "key"))
    try:
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": "Bearer key"},
            json={"model": "tiny", "messages": [{"role": "user", "content": "6*7"}]},
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        assert scrape(url, None).status_code == 401
        text = scrape(url, "key").text
    finally:
        stop()
    assert 'astraflow_generate_seconds_count{model="tiny"} 1.0' in text
    assert 'astraflow_generated_tokens_total{model="tiny"}' in text


def test_weight_cache_metrics(tmp_path):
    from astraflow.weights import WeightClient
    from astraflow.weights.cache import WeightCache, create_cache_app

    store = WeightStore(tmp_path / "w")
    store.publish("policy", 1, {"w": __import__("torch").ones(4)})
    up_url, stop_up = serve_in_thread(create_weight_app(store, TOKEN))
    cache = WeightCache({"*": up_url}, TOKEN, tmp_path / "cache")
    url, stop = serve_in_thread(create_cache_app(cache))
    try:
        for _ in range(2):  # one download upstream, then a hit
            with WeightClient(url, TOKEN) as client:
                client.fetch_update("policy", None, None, want_version=1)
        assert scrape(url, None).status_code == 401
        text = scrape(url, TOKEN).text
    finally:
        stop()
        cache.close()
        stop_up()
    for name in WEIGHT_CACHE_METRICS:
        assert f"# HELP {name}" in text, name
    assert "astraflow_weight_cache_files_fetched_total 1.0" in text
    assert "astraflow_weight_cache_hits_total 1.0" in text
    assert "astraflow_weight_cache_files_served_total 2.0" in text


def test_grafana_dashboard_uses_only_exported_names():
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).parents[2] / "docs" / "grafana-astraflow.json").read_text())
    exported = set(DATAFLOW_METRICS) | set(WEIGHT_CACHE_METRICS) | {
        "astraflow_lease_wait_seconds", "astraflow_trainer_step_seconds",
        "astraflow_weight_publish_seconds", "astraflow_trainer_version",
        "astraflow_weight_downloads", "astraflow_generate_seconds", "astraflow_generated_tokens",
    }  # fmt: skip
    used = {
        re.sub(r"_(bucket|total|count|sum)$", "", name)
        for p in dash["panels"]
        for t in p["targets"]
        for name in re.findall(r"astraflow_\w+", t["expr"])
    }
    assert used and used <= {n.removesuffix("_total") for n in exported} | exported, used - exported
