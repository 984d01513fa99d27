"""Role-scoped bearer tokens, derived from one run secret.

Why: one run token let any holder ack batches, publish versions or drain the queue, and a remote
rollout node needs none of that. Each role gets its own token, derived from the run secret with
HMAC-SHA256 (``role + "." + base64url(hmac(secret, "astraflow/role/" + role))``), so

- the dataflow service needs only the secret to check every role's token (nothing to store),
- a node holds only its node token, from which neither the secret nor another role's token can be
  computed,
- the run secret itself keeps working as the admin token (a single-token setup is unchanged).

A service that holds only a role token (a trainer's weight server) checks other roles' tokens
against their SHA-256 digests (:class:`TokenDigests`, served by the dataflow service to trainers):
a digest of a 256-bit HMAC output reveals nothing usable. The raw secret is never digested, so a
weak hand-picked secret cannot be brute-forced from what a trainer receives.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: Roles; what each may call on the dataflow service is :mod:`astraflow.dataflow.http.access`.
NODE = "node"
TRAINER = "trainer"
ADMIN = "admin"
#: Every role, least privileged first.
ROLES: tuple[str, ...] = (NODE, TRAINER, ADMIN)

_MAC_CHARS = 43  # base64url of a 32-byte HMAC-SHA256 without padding


class TokenDigests(BaseModel):
    """``GET /auth/verifiers``: SHA-256 hex digests of each role token of the run, so a service
    holding only its own role token (a trainer's weight server) can check the others."""

    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["sha256"] = "sha256"
    digests: dict[str, str] = Field(description="role -> sha256 hex of that role's token")


def derive_token(secret: str, role: str) -> str:
    """The token of ``role`` for the run whose secret is ``secret``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if not secret:
        raise ValueError("cannot derive a role token from an empty run secret")
    mac = hmac.new(secret.encode(), f"astraflow/role/{role}".encode(), hashlib.sha256).digest()
    return f"{role}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


def token_role(token: str) -> str | None:
    """The role a token claims by its form (``node.<mac>``), or None for anything else (a run
    secret). A claim is not proof: :class:`TokenVerifier` checks it."""
    role, dot, mac = token.partition(".")
    if dot and role in ROLES and len(mac) == _MAC_CHARS:
        return role
    return None


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenVerifier:
    """Maps a presented bearer token to its role (or None when it is no token of this run).

    Built from the run secret (:meth:`from_secret`: every role, and the secret as admin) or from
    the role tokens' digests (:meth:`from_digests`). Comparisons are constant-time.
    """

    def __init__(self, expected: Mapping[str, bytes], secret: bytes | None, hashed: bool) -> None:
        self._expected = dict(expected)  # role -> token (or its sha256 hex when hashed)
        self._secret = secret
        self._hashed = hashed

    @classmethod
    def from_secret(cls, secret: str) -> TokenVerifier:
        if not secret:
            raise ValueError("a service needs a non-empty run secret (--token or ASTRAFLOW_TOKEN)")
        if token_role(secret) is not None:
            raise ValueError(
                f"this service needs the run secret, not a {token_role(secret)} token: it derives "
                "every role's token from the secret (see `astraflow token --help`)"
            )
        expected = {r: derive_token(secret, r).encode() for r in ROLES}
        return cls(expected, secret.encode(), hashed=False)

    @classmethod
    def from_digests(cls, digests: TokenDigests | Mapping[str, str]) -> TokenVerifier:
        data = digests.digests if isinstance(digests, TokenDigests) else dict(digests)
        unknown = sorted(set(data) - set(ROLES))
        if unknown:
            raise ValueError(f"token digests for unknown roles {unknown}")
        return cls({r: d.encode() for r, d in data.items()}, None, hashed=True)

    def digests(self, roles: Iterable[str] = ROLES) -> TokenDigests:
        """Digests of the role tokens (only a verifier built from the secret has them)."""
        if self._hashed:
            return TokenDigests(digests={r: self._expected[r].decode() for r in roles})
        return TokenDigests(digests={r: _sha256(self._expected[r].decode()) for r in roles})

    def role_of(self, token: str | bytes) -> str | None:
        raw = token.encode() if isinstance(token, str) else token
        if self._secret is not None and hmac.compare_digest(raw, self._secret):
            return ADMIN
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
        role = token_role(text)
        expected = self._expected.get(role) if role else None
        if expected is None:
            return None
        presented = _sha256(text).encode() if self._hashed else raw
        return role if hmac.compare_digest(presented, expected) else None


def bearer(header: str | bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if header is None:
        return None
    raw = header.encode("latin-1") if isinstance(header, str) else header
    scheme, _, value = raw.partition(b" ")
    if scheme.lower() != b"bearer" or not value:
        return None
    return value.strip()


def roles_phrase(roles: Iterable[str]) -> str:
    """``"a trainer or admin token"``: the roles a route accepts, for a 403's detail."""
    names = [r for r in ROLES if r in set(roles)]
    return ("an " if names[0] == ADMIN else "a ") + " or ".join(names) + " token"
