"""Which roles may call which route of the dataflow service.

Why a table: one place to read (and test) the whole access policy, checked by the guard before
routing, so the FastAPI routes and the raw-ASGI fast path (:mod:`astraflow.dataflow.http.fastpath`)
are covered alike. The roles are the endpoints' (:mod:`astraflow.protocol.routes`). A path that is
not in the table is admin-only: a path served without an endpoint is closed, not open
(``tests/dataflow/test_roles.py`` checks every route has a rule).
"""

from __future__ import annotations

import re

from astraflow.protocol.auth import ADMIN
from astraflow.protocol.routes import access_rules

#: (path pattern, roles allowed besides admin), from the protocol's endpoint table; rules are per
#: path, whatever the method, so a wrong method still reaches FastAPI and gets its 405.
RULES: tuple[tuple[str, frozenset[str]], ...] = access_rules()


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
