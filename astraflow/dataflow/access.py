"""Which roles may call which route of the dataflow service.

Why a table: one place to read (and test) the whole access policy, checked by the guard before
routing, so the FastAPI routes and the raw-ASGI fast path (:mod:`astraflow.dataflow.fastpath`) are
covered alike. A path that is not in the table is admin-only: a route added without an entry here
is closed, not open (``tests/dataflow/test_roles.py`` checks every route has one).
"""

from __future__ import annotations

import re

from astraflow.protocol.auth import ADMIN, NODE, TRAINER

_ANY = frozenset({NODE, TRAINER, ADMIN})

#: (path pattern, roles allowed besides admin); rules are per path, whatever the method, so a wrong
#: method still reaches FastAPI and gets its 405.
RULES: tuple[tuple[str, frozenset[str]], ...] = (
    # rollout nodes: membership, leases, pushes
    ("/nodes/register", frozenset({NODE})),
    ("/nodes/{node_id}/heartbeat", frozenset({NODE})),
    ("/nodes/{node_id}", frozenset({NODE})),
    ("/leases", frozenset({NODE})),
    ("/leases/release", frozenset({NODE})),
    ("/trajectories", frozenset({NODE})),
    # trainers: batches, acks, versions, evaluations, the end of the run
    ("/batches", frozenset({TRAINER})),
    ("/batches/{batch_id}/ack", frozenset({TRAINER})),
    ("/versions", frozenset({TRAINER})),
    ("/evaluations", frozenset({TRAINER})),
    ("/evaluations/{eval_id}", frozenset({TRAINER})),
    ("/status", frozenset({TRAINER})),
    ("/auth/verifiers", frozenset({TRAINER})),
    # join information and the API's own description: any token of the run
    ("/recipe", _ANY),
    ("/openapi.json", _ANY),
    ("/docs", _ANY),
    ("/docs/oauth2-redirect", _ANY),
    ("/redoc", _ANY),
)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", pattern) + "$")


_COMPILED = tuple((_compile(p), roles | {ADMIN}) for p, roles in RULES)
_EXACT = {p: roles | {ADMIN} for p, roles in RULES if "{" not in p}
_ADMIN_ONLY = frozenset({ADMIN})


def allowed_roles(path: str) -> frozenset[str]:
    """Roles that may call ``path`` (admin always may; unknown paths: admin only)."""
    roles = _EXACT.get(path)
    if roles is not None:
        return roles
    for pattern, roles in _COMPILED:
        if pattern.match(path):
            return roles
    return _ADMIN_ONLY
