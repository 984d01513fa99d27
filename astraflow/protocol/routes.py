"""Every endpoint of the dataflow service's HTTP API, written once: method, path, request and
reply types, the roles that may call it, whether it long-polls and whether the raw-ASGI fast path
serves it.

Why one table: a route used to be spelled in the server's route table, in its access rules, in
the client and in the docs, so adding or changing one meant finding four copies. Now the server
binds a handler to each entry (:mod:`astraflow.dataflow.http.routes`), the access rules are
derived from the roles here (:mod:`astraflow.dataflow.http.access`), the client builds its
requests from the entries (:mod:`astraflow.protocol.client`), and the route table in
``docs/architecture.md`` and its roles table are generated from them (``python -m
astraflow.protocol.routes --markdown``; ``--update docs/architecture.md`` rewrites them; a test
fails when they differ).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from astraflow.protocol.auth import ADMIN, NODE, ROLES, TRAINER, TokenDigests
from astraflow.protocol.messages import (
    Ack,
    BatchAck,
    BatchReply,
    BatchRequest,
    EvaluationList,
    EvaluationRequest,
    EvaluationResult,
    Heartbeat,
    HeartbeatReply,
    LatestVersions,
    LeaseGrant,
    LeaseRelease,
    LeaseRequest,
    NodeRegistered,
    NodeRegistration,
    PartialPush,
    PartialResult,
    PushResult,
    RunStop,
    TrajectoryPush,
    VersionAnnouncement,
)
from astraflow.protocol.status import DataflowStatus
from astraflow.protocol.transcripts import TranscriptList
from astraflow.recipe.schema import Recipe

#: Every role of a run (what "any token of the run" may be).
ANY_ROLE = frozenset(ROLES)


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    #: the request body's protocol type (None: no body)
    request: type[BaseModel] | None
    #: the reply's protocol type (None: plain data, see ``reply_doc``)
    reply: type[BaseModel] | None
    #: roles that may call it besides admin (who may call every route); empty: admin only
    roles: frozenset[str]
    #: what it does (the docs' route table)
    doc: str
    #: tokenless (``GET /healthz``)
    open: bool = False
    #: the service may hold the reply back up to the request's wait (``wait_s``,
    #: ``wait_done_s``): clients add that wait to their timeout
    long_poll: bool = False
    #: also served by the raw-ASGI fast path when msgpack both ways (the rollout nodes' traffic)
    fast: bool = False
    #: names of its query parameters
    query: tuple[str, ...] = ()
    #: one line for the OpenAPI document (None: FastAPI names it after the handler)
    summary: str | None = None
    #: how the docs name the request and the reply when the type name alone says too little
    request_doc: str | None = None
    reply_doc: str | None = None

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{([^/}]+)\}", self.path))

    def url(self, **params: str) -> str:
        """The path with its parameters filled in."""
        if set(params) != set(self.path_params):
            raise TypeError(f"{self.method} {self.path} takes path parameters {self.path_params}")
        return self.path.format(**params)


HEALTHZ = Endpoint(
    "GET",
    "/healthz",
    None,
    None,
    ANY_ROLE,
    "Liveness; no token.",
    open=True,
    summary="Liveness (no token needed)",
    reply_doc='`{"ok": true}`',
)
REGISTER = Endpoint(
    "POST",
    "/nodes/register",
    NodeRegistration,
    NodeRegistered,
    frozenset({NODE}),
    "Joins the run: policies and versions held, concurrency, region, engines; `replace=true` "
    "retires a silent node of the same name at once when the caller sends that node's key "
    "(`X-Node-Key`) or is an admin. Registrations are rate-limited per caller and reaped when "
    "idle. Reply: node id, node key, heartbeat interval, lease timeout, latest versions, "
    "`max_lag`, `group_size` (episodes per training task).",
)
HEARTBEAT = Endpoint(
    "POST",
    "/nodes/{node_id}/heartbeat",
    Heartbeat,
    HeartbeatReply,
    frozenset({NODE}),
    "Versions held, leases still in flight, metrics. Reply: leases `renewed` and `lost`, latest "
    "versions, where to fetch them and their digests (`weight_digests`: a node holding a latest "
    "version's number with another digest, having missed a rewind, reloads it), `stop` when the "
    "run is over, `heartbeat_interval_s` (the interval asked of the node now: it grows with the "
    "pool, `dataflow.max_heartbeats_per_s`).",
    fast=True,
)
DEREGISTER = Endpoint(
    "DELETE",
    "/nodes/{node_id}",
    None,
    Ack,
    frozenset({NODE}),
    "Leaves; its active leases go back to the queue. A node token must send the node's "
    "`X-Node-Key` (from `NodeRegistered.node_key`; 403 otherwise).",
)
LEASE = Endpoint(
    "POST",
    "/leases",
    LeaseRequest,
    LeaseGrant,
    frozenset({NODE}),
    "Up to `max_tasks` tasks, each as a `Lease` (task + deadline), whose episodes (`group_size` "
    "per training task, 1 per evaluation task) add up to at most **`max_episodes`**, the node's "
    "free episode slots. Long-polls up to `wait_s`. A "
    "request whose client hangs up meanwhile is dropped at once (`dataflow/http/hangup.py` "
    "watches for `http.disconnect`) and any grant made to it goes back to the queue. "
    "`idempotency_key` makes a retry get the same leases. The grant carries `latest_versions`, "
    "`weight_locations`, `weight_digests` (as in the heartbeat reply), `done` (no task will come "
    "again) and **`update_first`**: the node's "
    "training work is held back until it loads the latest weights (more than `max_lag` behind, "
    "a sync round, a rewound timeline), so it should ask again once loaded; without it, a node "
    "within the lag asks again at once and works while its weights load. `reason` says why "
    "fewer tasks than asked were granted. A task whose earlier lease saved episodes in flight "
    "(`POST /partials`) comes with them (`Lease.partials`), to be resumed.",
    long_poll=True,
    fast=True,
)
RELEASE = Endpoint(
    "POST",
    "/leases/release",
    LeaseRelease,
    Ack,
    frozenset({NODE}),
    "Gives leases back (a draining node), so other nodes can take them at once.",
)
PUSH = Endpoint(
    "POST",
    "/trajectories",
    TrajectoryPush,
    PushResult,
    frozenset({NODE}),
    "Episodes of a lease (one or several pushes per lease). Idempotent by `idempotency_key` (a "
    "retry is answered `duplicate=true`); the first lease to complete a task's group wins, later "
    "ones are refused. `samples` = samples buffered.",
    fast=True,
    summary="Push episodes of a lease (idempotent by idempotency_key)",
)
PARTIALS = Endpoint(
    "POST",
    "/partials",
    PartialPush,
    PartialResult,
    frozenset({NODE}),
    "Saves episodes of a lease the node holds that are still in flight (`PartialEpisode`: each "
    "role's tokens, log-probs, versions and loss mask so far, the env's `state_dict()`, the "
    "workflow's own state), one per (task, episode index), a newer save replacing the older. "
    "When the lease expires or is released, the task's next `Lease` carries them as `partials` "
    "and that node resumes each episode from its saved turn. Deleted when the task completes. "
    "Refused (`accepted=false`) for a lease the node does not hold or that is no longer active.",
    summary="Save in-flight episodes of a lease (resumed by the task's next lease)",
)
NEXT_BATCH = Endpoint(
    "POST",
    "/batches",
    BatchRequest,
    BatchReply,
    frozenset({TRAINER}),
    "The next `Batch` of `num_groups` groups for `policy`, advantages computed; long-polls up to "
    "`wait_s`. An unacknowledged batch is served again first (`redelivered=true`). `done` when "
    "no more data will come.",
    long_poll=True,
    summary="Next batch for a trainer (long-polls up to wait_s)",
)
ACK = Endpoint(
    "POST",
    "/batches/{batch_id}/ack",
    BatchAck,
    Ack,
    frozenset({TRAINER}),
    "After the optimizer step: `trainer_version` (the version the step produced), `metrics` "
    "(written to `metrics.jsonl`), **`trained`** (false: consumed without an optimizer step, so "
    "not a step of the run) and **`checkpoint_version`** (newest version the trainer can restart "
    "from; the service keeps later steps' samples so a restarted trainer gets the same batches; "
    "`None`: the trainer cannot resume, samples are freed at once).",
)
ANNOUNCE = Endpoint(
    "POST",
    "/versions",
    VersionAnnouncement,
    Ack,
    frozenset({TRAINER}),
    "A new version is in the weight store; parked lease requests hear of it at once (in a pool "
    "past its heartbeat budget, `dataflow.max_heartbeats_per_s`, only those whose work waits on "
    "it; the others from their next heartbeat). An older version than the acknowledged steps "
    "rewinds the policy's timeline.",
    request_doc="`VersionAnnouncement` (a `WeightVersion`: policy, version, location, digest, "
    "parent)",
)
LATEST_VERSIONS = Endpoint(
    "GET",
    "/versions/latest",
    None,
    LatestVersions,
    frozenset({NODE, TRAINER}),
    "The newest announced `WeightVersion` of each policy (location, digest). A region's weight "
    "cache (`serve weight-cache --join`, holding a node token) reads it to follow a restarted "
    "trainer's weight server to its new address.",
    summary="Newest announced version of each policy: location and digest",
)
REQUEST_EVALUATION = Endpoint(
    "POST",
    "/evaluations",
    EvaluationRequest,
    EvaluationResult,
    frozenset({TRAINER}),
    "Queue a held-out evaluation of `policy` at `version` (or newer): greedy, one episode per "
    "task, run by the nodes as high-priority tasks.",
)
LIST_EVALUATIONS = Endpoint(
    "GET",
    "/evaluations",
    None,
    EvaluationList,
    frozenset({TRAINER}),
    "Every evaluation (of one policy).",
    query=("policy",),
)
GET_EVALUATION = Endpoint(
    "GET",
    "/evaluations/{eval_id}",
    None,
    EvaluationResult,
    frozenset({TRAINER}),
    "Progress (`completed`, `errors`) and `accuracy` once `done`.",
)
STATUS = Endpoint(
    "GET",
    "/status",
    None,
    DataflowStatus,
    frozenset({TRAINER}),
    "The whole run at a glance: queue per task set, leases, tasks done, episodes and rate, "
    "`nodes` (`NodeStatus`: the silent ones, then at most 256 active, and the last that left), `node_summary` (every node counted: active, silent, left, by region), `policies` (`PolicyStatus`: version, steps, buffer, unacked "
    "batches, staleness histogram, drops by reason, `filtered_rewards`), `errors` (failed "
    "episodes by reason with the first and newest message), evaluations, dataflow policies, "
    "store counters. With `wait_done_s`, answered as soon as the run is done (the launcher's and "
    "trainers' long poll).",
    long_poll=True,
    query=("wait_done_s",),
    reply_doc="`DataflowStatus` (`protocol/status.py`)",
)
AUTH_VERIFIERS = Endpoint(
    "GET",
    "/auth/verifiers",
    None,
    TokenDigests,
    frozenset({TRAINER}),
    "SHA-256 digests of the role tokens, so a trainer's weight server (which holds only a "
    "trainer token) can check node and admin tokens.",
    summary="SHA-256 digests of the run's role tokens",
    reply_doc="`TokenDigests` (`protocol/auth.py`)",
)
RUN_STOP = Endpoint(
    "POST",
    "/run/stop",
    RunStop,
    Ack,
    frozenset(),
    "Ends the run cleanly (`astraflow stop URL`): from then on trainers get `done` (they "
    "checkpoint the step they reached and exit 0), lease replies say `done` and heartbeats `stop` "
    "(nodes finish or hand back their episodes and exit 0), `GET /status` says `done` with "
    "`stopped` = the reason (the launcher ends). Durable: a restarted service stays stopped. Node "
    "and trainer tokens get 403.",
    summary="End the run cleanly: trainers checkpoint and exit, nodes drain and exit",
)
RECIPE = Endpoint(
    "GET",
    "/recipe",
    None,
    Recipe,
    ANY_ROLE,
    "A node can join with only the URL and a token (`serve rollout --join URL`).",
    summary="The run's resolved recipe",
    reply_doc="the resolved `Recipe`",
)

TRANSCRIPTS = Endpoint(
    "GET",
    "/transcripts",
    None,
    TranscriptList,
    frozenset(),
    "The kept episodes (`logging.transcripts_per_step` per weight version, and as many failed "
    "ones): token arrays, loss mask, log-probs, versions, rewards and group advantages, newest "
    "step first; readers decode them with the policy's tokenizer (`astraflow transcripts`, the "
    "dashboard).",
    query=("step", "failed", "limit"),
    summary="Sampled finished episodes (admin only: every prompt and answer of the run)",
    reply_doc="`TranscriptList` (`protocol/transcripts.py`)",
)

#: Every endpoint, in the order the docs list them.
ENDPOINTS: tuple[Endpoint, ...] = (
    HEALTHZ,
    REGISTER,
    HEARTBEAT,
    DEREGISTER,
    LEASE,
    RELEASE,
    PUSH,
    PARTIALS,
    NEXT_BATCH,
    ACK,
    ANNOUNCE,
    LATEST_VERSIONS,
    REQUEST_EVALUATION,
    LIST_EVALUATIONS,
    GET_EVALUATION,
    STATUS,
    TRANSCRIPTS,
    AUTH_VERIFIERS,
    RUN_STOP,
    RECIPE,
)

#: Paths the service's framework serves besides the endpoints (the API's own description), and
#: who may read them: any token of the run.
API_DOC_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
#: Prometheus text (not a protocol type, so no endpoint): admin only, like every run-wide read
METRICS_PATH = "/metrics"


def access_rules() -> tuple[tuple[str, frozenset[str]], ...]:
    """(path pattern, roles allowed besides admin) per guarded path, whatever the method (so a
    wrong method still reaches the router and gets its 405). Raises if two endpoints of one path
    disagree on the roles (the rule could not hold for both)."""
    rules: dict[str, frozenset[str]] = {}
    for ep in ENDPOINTS:
        if ep.open:
            continue
        if rules.setdefault(ep.path, ep.roles) != ep.roles:
            raise ValueError(f"endpoints of {ep.path} allow different roles")
    return (
        *rules.items(),
        *((p, ANY_ROLE) for p in API_DOC_PATHS),
        (METRICS_PATH, frozenset()),
    )


def open_paths() -> frozenset[str]:
    """Paths reachable without a token."""
    return frozenset(ep.path for ep in ENDPOINTS if ep.open)


# -- docs ----------------------------------------------------------------------------------------
#: The generated parts of ``docs/architecture.md``: name -> (begin marker, end marker).
MARKERS = {
    "routes": (
        "<!-- dataflow routes: generated by `python -m astraflow.protocol.routes --markdown` -->",
        "<!-- end of dataflow routes -->",
    ),
    "roles": (
        "<!-- dataflow roles: generated by `python -m astraflow.protocol.routes --markdown` -->",
        "<!-- end of dataflow roles -->",
    ),
}


def _name(model: type[BaseModel] | None, override: str | None) -> str:
    if override is not None:
        return override
    return "—" if model is None else f"`{model.__name__}`"


def _caller(ep: Endpoint) -> str:
    if ep.open:
        return "anyone"
    if ep.roles == ANY_ROLE:
        return "any role"
    return ", ".join(r for r in ROLES if r in ep.roles) or "admin"


def _route(ep: Endpoint) -> str:
    query = "&".join(f"{q}=" for q in ep.query)
    return f"`{ep.method} {ep.path}{'?' + query if query else ''}`"


def _routes_table() -> list[str]:
    lines = ["| Route | Caller | Request → reply | What it does |", "|---|---|---|---|"]
    for ep in ENDPOINTS:
        io = f"{_name(ep.request, ep.request_doc)} → {_name(ep.reply, ep.reply_doc)}"
        lines.append(f"| {_route(ep)} | {_caller(ep)} | {io} | {ep.doc} |")
    long_polls = ", ".join(f"`{ep.method} {ep.path}`" for ep in ENDPOINTS if ep.long_poll)
    fast = ", ".join(f"`{ep.method} {ep.path}`" for ep in ENDPOINTS if ep.fast)
    return [
        *lines,
        "",
        f"Long polls (the client adds the wait to its timeout): {long_polls}. Served by the "
        f"raw-ASGI fast path when both bodies are msgpack: {fast}. Admin may call every route.",
    ]


def _roles_table() -> list[str]:
    lines = ["| Role | May call (admin may call everything) |", "|---|---|"]
    for role in ROLES:
        if role == ADMIN:
            continue
        calls = [f"`{ep.method} {ep.path}`" for ep in ENDPOINTS if not ep.open and role in ep.roles]
        lines.append(f"| `{role}` | {', '.join(calls)} |")
    lines.append(
        f"| `{ADMIN}` | everything, including any path without an endpoint (a path served "
        "without one is closed to the other roles) |"
    )
    return lines


def markdown(part: str = "routes") -> str:
    """A generated part of ``docs/architecture.md`` ("routes": the route table of "Dataflow
    routes"; "roles": the table of "Tokens and roles"), markers included."""
    begin, end = MARKERS[part]
    body = _routes_table() if part == "routes" else _roles_table()
    return "\n".join([begin, *body, end]) + "\n"


def generated_part(text: str, part: str = "routes") -> str:
    """The generated ``part`` of a document as it stands (from its begin to its end marker)."""
    begin, end = MARKERS[part]
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the document has no generated {part} table (its markers are missing)")
    return text[start : stop + len(end)] + "\n"


def update(path: Path) -> bool:
    """Rewrite the generated parts of the document at ``path``; returns whether it changed."""
    text = path.read_text(encoding="utf-8")
    new = text
    for part in MARKERS:
        new = new.replace(generated_part(new, part), markdown(part))
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m astraflow.protocol.routes")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the generated tables")
    group.add_argument("--update", type=Path, metavar="DOC", help="rewrite DOC's tables")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write("\n".join(markdown(part) for part in MARKERS))
    else:
        print(f"{args.update}: {'updated' if update(args.update) else 'already current'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
