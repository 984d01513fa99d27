"""The web dashboard: a run's figures and single trajectories in a browser, read-only.

``astraflow dashboard RUN_DIR|URL`` serves it; ``astraflow train`` serves it beside the run. The
page is one static HTML file with plain JavaScript and a vendored chart library (uPlot), so
there is no front-end build. It reads three JSON routes:

- ``/api/summary``: the run's status (from the live service, when there is one; for a finished
  run the service's last status from the ``run_summary`` record and how the run ended, from
  ``outcome.json``) and, from ``metrics.jsonl``, every figure by step, grouped into learning,
  data and system (:mod:`astraflow.launch.run_metrics`), with evaluations that all errored
  listed apart rather than charted as accuracy 0;
- ``/api/transcripts``: the kept episodes (:mod:`astraflow.launch.transcripts`), decoded;
- ``/api/transcripts/{episode_id}``: one of them token by token for the trajectory viewer: the
  text of each token, the loss mask, the behaviour log-prob and the weight version.

Every route but ``/healthz`` and the static code needs a token (``?token=`` or a bearer header):
the page shows every prompt and answer of the run. The token is the dashboard's read-only one
(:func:`astraflow.launch.security.dashboard_token`, derived from the run secret; it opens this page
and nothing on the dataflow service), or the run secret itself. ``astraflow train`` writes the
address with that token to ``RUN_DIR/dashboard.url`` (0600) and prints it without the token: a
launcher log is read by more people than the run's owner. Nothing here writes anything else.
"""

from __future__ import annotations

import hmac
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from astraflow.launch.report import metric_series
from astraflow.launch.security import DASHBOARD_URL_FILE, dashboard_token, write_private
from astraflow.launch.transcripts import Decoders, load_recipe_of, read_store
from astraflow.protocol.auth import bearer
from astraflow.protocol.transcripts import TranscriptRecord

STATIC = resources.files("astraflow.launch") / "dashboard_static"
ASSETS = {
    "uPlot.iife.min.js": "application/javascript",
    "uPlot.min.css": "text/css",
    "dashboard.js": "application/javascript",
}
#: tokens shown per trajectory in the token view (a long episode is cut, and says so)
MAX_VIEW_TOKENS = 4096


class DashboardSource:
    """Where the figures come from: a run directory, a live service (client), or both."""

    def __init__(self, run_dir: Path | None = None, client: Any = None, recipe: Any = None):
        self.run_dir = run_dir
        self.client = client
        self.recipe = (
            recipe if recipe is not None else (load_recipe_of(run_dir) if run_dir else None)
        )
        if self.recipe is None and client is not None:
            self.recipe = client.recipe()
        self.decoders = Decoders(self.recipe)

    def status(self) -> dict | None:
        if self.client is None:
            return None
        try:
            return self.client.status().model_dump(mode="json")
        except Exception:  # the service is gone (a finished run): the files still tell
            return None

    def metrics(self) -> list[dict]:
        if self.run_dir is None or not (self.run_dir / "metrics.jsonl").exists():
            return []
        from astraflow.launch.report import read_metrics

        return read_metrics(self.run_dir)

    def series(self, records: list[dict] | None = None) -> dict[str, Any]:
        """The four headline figures (the policy table) and every figure, grouped (charts)."""
        from astraflow.launch.report import empty_panel_notes
        from astraflow.launch.run_metrics import errored_eval, run_series

        records = self.metrics() if records is None else records
        if not records:
            return {}
        out: dict[str, Any] = {"notes": empty_panel_notes(records), "policies": {}}
        measured = [r for r in records if not errored_eval(r)]  # all tasks errored: no accuracy
        for key, kind, field in (
            ("reward", "step", "reward_mean"),
            ("accuracy", "eval", "accuracy"),
            ("samples_per_s", "step", "samples_per_s"),
            ("staleness", "step", "staleness_mean"),
        ):
            for policy, (xs, ys) in metric_series(measured, kind, field).items():
                out["policies"].setdefault(policy, {})[key] = {"x": xs, "y": ys}
        out.update(run_series(records).as_json())
        return out

    def final(self, records: list[dict]) -> dict[str, Any] | None:
        """A finished run: how it ended (``outcome.json``) and the service's last status (the
        ``run_summary`` record), so its page shows its final state, not dashes."""
        from astraflow.launch.outcome import read_outcome

        if self.run_dir is None:
            return None
        outcome = read_outcome(self.run_dir)
        summaries = [r for r in records if r.get("type") == "run_summary"]
        last = summaries[-1].get("status") if summaries else None
        if outcome is None and last is None:
            return None
        return {
            "outcome": outcome.outcome if outcome else None,
            "reason": outcome.reason if outcome else None,
            "services": outcome.services if outcome else None,
            "ended": outcome.ended if outcome else None,
            "status": last if isinstance(last, dict) else None,
        }

    def records(self, step: int | None, failed: bool | None, limit: int) -> list[TranscriptRecord]:
        if self.client is not None:
            try:
                return self.client.transcripts(step, failed, limit).transcripts
            except Exception:
                if self.run_dir is None:
                    raise
        if self.run_dir is None or not (self.run_dir / "dataflow.db").exists():
            return []  # no store (yet): no kept episodes, not an error
        return read_store(self.run_dir, step, failed, limit)

    def token_view(self, record: TranscriptRecord) -> dict[str, Any]:
        """One episode for the viewer: turns, and per role every token with its figures."""
        transcript = self.decoders.decode(record)
        roles = []
        for t in record.trajectories:
            decode = self.decoders.for_policy(record.policy.get(t.role, "policy"))
            n = min(len(t.tokens), MAX_VIEW_TOKENS)
            roles.append(
                {
                    "role": t.role,
                    "policy": record.policy.get(t.role, ""),
                    "reward": record.rewards.get(t.role),
                    "advantage": record.advantages.get(t.role),
                    "cut": len(t.tokens) > n,
                    "tokens": [
                        {
                            "text": decode([t.tokens[i]]),
                            "mask": t.loss_mask[i],
                            "logprob": t.logprobs[i] if t.loss_mask[i] else None,
                            "version": t.versions[i] if t.loss_mask[i] else None,
                        }
                        for i in range(n)
                    ],
                }
            )
        return {
            "record": record.model_dump(exclude={"trajectories"}),
            "turns": [turn.model_dump() for turn in transcript.turns],
            "roles": roles,
        }


def serve_dashboard(
    run_dir: Path, dataflow_url: str, token: str, ca_file: str | None = None, port: int = 0
) -> tuple[str, Any]:
    """The dashboard of a run being launched, in a thread of the launcher: (URL with token,
    stop function)."""
    from astraflow.protocol.client import SyncDataflowClient
    from astraflow.weights.server import serve_in_thread

    client = SyncDataflowClient(dataflow_url, token, timeout=5.0, retries=0, ca_file=ca_file)
    app = create_dashboard_app(DashboardSource(run_dir, client), token)
    url, stop = serve_in_thread(app, "127.0.0.1", port)
    address = f"{url}/?token={dashboard_token(token)}"
    write_private(Path(run_dir) / DASHBOARD_URL_FILE, address + "\n")

    def close() -> None:
        stop()
        client.close()

    return address, close


def printable_address(address: str, run_dir: Path) -> str:
    """What a launcher prints for the dashboard: its address without the token, and where the
    address with the token is (``RUN_DIR/dashboard.url``, 0600)."""
    return f"{address.split('?', 1)[0]} (with its token: {Path(run_dir) / DASHBOARD_URL_FILE})"


def create_dashboard_app(source: DashboardSource, token: str) -> FastAPI:
    """The dashboard app; ``token`` is the run secret (the app's own client reads the service
    with it). Browsers present the read-only dashboard token derived from it, or the secret."""
    if not token:
        raise ValueError("the dashboard needs the run's admin token")
    accepted = (token.encode(), dashboard_token(token).encode())
    app = FastAPI(title="AstraFlow dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def require_token(request: Request, call_next):
        # the page's code and chart library hold no run data; everything else needs the token
        path = request.url.path
        if path not in ("/healthz", "/favicon.ico") and not path.startswith("/static/"):
            # compared as bytes: the header's token is bytes and a query token may be any text;
            # comparing mixed or non-ASCII str raises TypeError, which answered 500 (issue 48 #8)
            query = request.query_params.get("token")
            given = query.encode() if query else bearer(request.headers.get("authorization"))
            if not given or not any(hmac.compare_digest(given, t) for t in accepted):
                return Response(
                    "missing or wrong token: open the URL `astraflow dashboard` printed "
                    "(it ends in ?token=...)",
                    status_code=401,
                    media_type="text/plain",
                )
        return await call_next(request)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return (STATIC / "dashboard.html").read_text(encoding="utf-8")

    @app.get("/static/{name}")
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        return Response((STATIC / name).read_bytes(), media_type=ASSETS[name])

    @app.get("/api/summary")
    def summary() -> dict:
        run = source.run_dir.name if source.run_dir else None
        st = source.status()
        records = source.metrics()
        final = None if st is not None and not st.get("done") else source.final(records)
        shown = st if st is not None else (final or {}).get("status")
        return {
            "run": (shown or {}).get("run") or run,
            "run_dir": str(source.run_dir) if source.run_dir else None,
            "live": st is not None and not st.get("done"),
            "status": shown,
            "final": final,
            "series": source.series(records),
        }

    @app.get("/api/transcripts")
    def transcripts(step: int | None = None, failed: bool | None = None, limit: int = 50):
        records = source.records(step, failed, min(max(limit, 1), 500))
        out = []
        for r in records:
            t = source.decoders.decode(r)
            answer = next((x.text for x in reversed(t.turns) if x.source == "policy"), "")
            out.append(
                {
                    **r.model_dump(exclude={"trajectories"}),
                    "turns": len(t.turns),
                    "answer": answer[:200],
                }
            )
        return {"transcripts": out}

    @app.get("/api/transcripts/{episode_id}")
    def one(episode_id: str) -> dict:
        for r in source.records(None, None, 500):
            if r.episode_id == episode_id:
                return source.token_view(r)
        raise HTTPException(404, f"no kept transcript {episode_id!r}")

    return app
