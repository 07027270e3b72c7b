"""Authentication the way Flight SQL clients do it: a `Handshake` carrying HTTP basic
credentials (user = tenant, password = the tenant's token from `gateway.tokens`) returns a
bearer session token in the `authorization` response header, which the client then sends on
every call (`authorization: Bearer <session>`).

A session token is `<payload>.<signature>`: the payload names the tenant and the expiry, the
signature is an HMAC keyed by the tenant's configured token. So a session needs no state
(every gateway with the same configuration accepts it), it ends at its expiry, and changing a
tenant's token ends the tenant's sessions at once. A tenant without a configured token (only
accepted when `require_tokens` is false, as on the native path) signs with a secret of this
gateway process: its sessions end with the process.

The native path (the `x-speedlayer-tenant` header with the tenant's token) is unchanged; a call
carrying that header is authenticated the native way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from typing import Callable

import pyarrow.flight as flight

from speedlayer.config import GatewayConfig
from speedlayer.errors import UnauthenticatedError
from speedlayer.keys import valid_id
from speedlayer.protocol.query import AUTH_HEADER, TENANT_HEADER

SESSION_PREFIX = "sls1."
AUTH_MIDDLEWARE = "speedlayer-flight-sql-auth"
_PROCESS_SECRET = secrets.token_bytes(32)
VERIFIED_CACHE_SIZE = 4096


class SessionTokens:
    """Issues and checks bearer session tokens for `config`'s tenants."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.ttl_s = config.flight_sql_session_ttl_s
        self._clock = clock
        # Tokens whose signature checked out: token -> (tenant, expiry, the tenant's token it was
        # signed with). A client sends its token on every call; this spares the HMAC after the
        # first, and a changed tenant token still ends the session (the entry no longer matches).
        self._verified: dict[str, tuple[str, int, str | None]] = {}

    def check_password(self, tenant: str, password: str) -> None:
        """UnauthenticatedError unless `password` is `tenant`'s token (or the tenant needs none)."""
        if not valid_id(tenant):
            raise UnauthenticatedError(f"user {tenant!r} is not a tenant id")
        expected = self.config.tokens.get(tenant)
        if expected is None:
            if self.config.require_tokens:
                raise UnauthenticatedError(f"tenant {tenant!r} has no token configured at this gateway")
            return
        if not hmac.compare_digest(password.encode(), expected.encode()):
            raise UnauthenticatedError(f"tenant {tenant!r}: wrong password (the tenant's token)")

    def issue(self, tenant: str) -> str:
        expires = int(self._clock() + self.ttl_s)
        payload = _b64(f"{tenant}:{expires}".encode())
        return f"{SESSION_PREFIX}{payload}.{self._sign(tenant, payload)}"

    def verify(self, token: str, *, allow_expired: bool = False) -> str:
        """The tenant of a valid, unexpired session token (`allow_expired`: expired too);
        UnauthenticatedError otherwise."""
        known = self._verified.get(token)
        if known is not None and known[2] == self.config.tokens.get(known[0]):
            return self._unexpired(known[0], known[1], allow_expired)
        try:
            payload, signature = token[len(SESSION_PREFIX):].split(".")
            tenant, expires = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode().rsplit(":", 1)
            expires_at = int(expires)
            signed = signature.encode("ascii")  # str compare_digest refuses non-ASCII: compare bytes
        except ValueError as exc:  # UnicodeError, binascii.Error are ValueErrors
            raise UnauthenticatedError("the bearer token is not a session token of this gateway: "
                                       "Handshake again with the tenant and its token") from exc
        if not token.startswith(SESSION_PREFIX) or not valid_id(tenant) or \
                not hmac.compare_digest(signed, self._sign(tenant, payload).encode("ascii")):
            raise UnauthenticatedError("the bearer token is not valid (wrong signature, or the tenant's token "
                                       "changed): Handshake again with the tenant and its token")
        if len(self._verified) >= VERIFIED_CACHE_SIZE:
            self._verified.clear()
        self._verified[token] = (tenant, expires_at, self.config.tokens.get(tenant))
        return self._unexpired(tenant, expires_at, allow_expired)

    def _unexpired(self, tenant: str, expires_at: int, allow_expired: bool) -> str:
        if self._clock() >= expires_at and not allow_expired:
            raise UnauthenticatedError(f"the session of tenant {tenant!r} expired: Handshake again")
        if tenant not in self.config.tokens and self.config.require_tokens:
            raise UnauthenticatedError(f"tenant {tenant!r} has no token configured at this gateway")
        return tenant

    def _sign(self, tenant: str, payload: str) -> str:
        token = self.config.tokens.get(tenant)
        key = hashlib.sha256(b"speedlayer-flight-sql-session\0" + token.encode()).digest() if token else _PROCESS_SECRET
        return _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def call_tenant(headers: dict[str, str], sessions: SessionTokens,
                native: Callable[[dict[str, str], GatewayConfig], str], *, allow_expired: bool = False) -> str:
    """The tenant of a call: the native way when it names one in `x-speedlayer-tenant`, else from
    its bearer session token (`allow_expired`: a genuine one that has expired too)."""
    if headers.get(TENANT_HEADER):
        return native(headers, sessions.config)
    presented = headers.get(AUTH_HEADER, "")
    if not presented.lower().startswith("bearer "):
        raise UnauthenticatedError("no credentials: Handshake with basic auth (user = tenant, password = the "
                                   f"tenant's token), or send the {TENANT_HEADER} header")
    return sessions.verify(presented[7:].strip(), allow_expired=allow_expired)


class _IssuedSession(flight.ServerMiddleware):
    def __init__(self, token: str) -> None:
        self.token = token

    def sending_headers(self) -> dict[str, str]:
        return {AUTH_HEADER: f"Bearer {self.token}"}


class BasicAuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    """On `Handshake` with `authorization: Basic ...`: check the tenant's token and answer with a
    bearer session token (refusing the call, UNAUTHENTICATED, on wrong credentials)."""

    def __init__(self, sessions: SessionTokens) -> None:
        self.sessions = sessions

    def start_call(self, info: flight.CallInfo, headers: dict[str, list]) -> _IssuedSession | None:
        if info.method != flight.FlightMethod.HANDSHAKE:
            return None
        values = headers.get(AUTH_HEADER) or headers.get(AUTH_HEADER.title()) or []
        basic = next((v for v in values if str(v).lower().startswith("basic ")), None)
        if basic is None:
            return None
        try:
            encoded = str(basic)[6:].strip()  # Go's client leaves the padding out
            tenant, _, password = base64.b64decode(encoded + "=" * (-len(encoded) % 4)).decode().partition(":")
            self.sessions.check_password(tenant, password)
        except (ValueError, UnicodeDecodeError) as exc:
            raise flight.FlightUnauthenticatedError(f"malformed basic credentials: {exc}") from exc
        except UnauthenticatedError as exc:
            raise flight.FlightUnauthenticatedError(str(exc)) from exc
        return _IssuedSession(self.sessions.issue(tenant))


class AcceptingAuthHandler(flight.ServerAuthHandler):
    """Lets `Handshake` complete (pyarrow refuses it without a handler); the credentials are
    checked by `BasicAuthMiddlewareFactory`, and each call's by `call_tenant`."""

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""
