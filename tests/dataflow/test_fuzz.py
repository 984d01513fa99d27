"""A bounded schemathesis pass over the service's own OpenAPI document: no input gives a 5xx."""

from __future__ import annotations

import httpx
import pytest
from dataflow_helpers import TOKEN, ThreadedService, make_recipe

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis not installed (pip install schemathesis)"
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

MAX_EXAMPLES = 15


@pytest.mark.slow  # schemathesis over every route
def test_openapi_fuzz_produces_no_server_errors(tmp_path):
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        auth = {"authorization": f"Bearer {TOKEN}"}
        raw = httpx.get(f"{svc.url}/openapi.json", headers=auth).json()
        schema = schemathesis.openapi.from_dict(raw)
        failures: list[str] = []
        checked = 0
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation, mode in [(op, m) for op in operations for m in schemathesis.GenerationMode]:

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                _clamp_long_polls(case)
                response = case.call(base_url=svc.url, headers=auth, timeout=30)
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path}: "
                        f"{response.status_code} {response.text[:300]}"
                    )

            try:
                run()
            except Unsatisfiable:  # nothing to negate (e.g. GET /healthz has no inputs)
                continue
            checked += 1
        assert checked >= 20
        assert not failures, "\n".join(failures[:10])


def _clamp_long_polls(case) -> None:
    """Long polls (``wait_s`` of batch and lease requests, ``/status?wait_done_s``) legitimately
    hold a valid request up to 600 s; clamp valid values to 1 s so the pass stays bounded (the
    waiting itself is tested in test_lease_wait.py). Invalid values are left for the fuzzer."""
    for holder, key in ((case.query, "wait_done_s"), (case.body, "wait_s")):
        if isinstance(holder, dict) and key in holder:
            try:
                if float(holder[key]) > 1.0:
                    holder[key] = 1.0
            except (TypeError, ValueError):
                pass
