"""Browser-facing checks shared by the control plane and `argosy serve`: is a request from
another site (`Origin`, `Sec-Fetch-Site`), does its Host header name this server, and the
headers that keep a response from being sniffed or framed.

- `cross_site_reason(method, headers, scheme)`: why an unsafe request looks cross-site, or
  None (the control plane's `SameOriginGuard`, `argosy.server.guards`); with
  `safe_methods_too=True` a GET from another site is refused as well.
- `host_allowed(host, extra)`: whether a Host header can be trusted not to be a DNS
  rebinding name: `localhost`, an IP address literal (a browser sends one only when the
  page's own origin is that address, which a rebinding attack cannot use), or a name in
  `extra`. The port is not compared: a forwarded port is still this server.
- `BrowserGuard`: an ASGI middleware for a service without credentials: requests whose
  Host is not allowed get 421, cross-site ones 403, before the app reads anything;
  every response, refusals included, gets `NOSNIFF_HEADERS` (also with `check=False`).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_NAMES = frozenset({"localhost"})
NOSNIFF_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"))
_HOST = re.compile(r"(\[[0-9A-Za-z:.%]+\]|[^\s@/\\:\[\]?#]+)(?::[0-9]{1,5})?")


def origin_tuple(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None if malformed."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return scheme.lower(), parts.hostname.lower(), port


def same_origin(origin: str, scheme: str, host: str | None) -> bool:
    """Whether an `Origin` header names this server (as the Host header gives it)."""
    if host is None or origin == "null":
        return False
    parts = urlsplit(origin)
    if parts.path or parts.query or not parts.scheme:
        return False
    theirs = origin_tuple(parts.scheme, parts.netloc)
    return theirs is not None and theirs == origin_tuple(scheme, host)


def cross_site_reason(
    method: str, headers: Mapping[str, str], scheme: str, *, safe_methods_too: bool = False
) -> str | None:
    """Why a request looks like it came from another site, or None. Only unsafe methods
    are checked unless `safe_methods_too`. (`Sec-Fetch-Site: none`, a user typing the URL,
    is fine only for a safe method: a navigation.)"""
    unsafe = method in UNSAFE_METHODS
    if not unsafe and not safe_methods_too:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin" and (unsafe or site != "none"):
        return f"Sec-Fetch-Site is '{site[:40]}', not 'same-origin'"
    origin = headers.get("origin")
    if origin is not None and not same_origin(origin, scheme, headers.get("host")):
        return f"Origin '{origin[:100]}' is not this server's"
    return None


def host_name(host: str) -> str | None:
    """The name or address in a Host header (lower case, no port, brackets or final dot);
    None when it is not a plain `name[:port]` or `[v6]:port`."""
    match = _HOST.fullmatch(host.strip())
    if match is None:
        return None
    name = match.group(1).lower()
    if name.startswith("["):
        name = name[1:-1]
        return name if _is_ip(name) else None
    return name.rstrip(".") or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(host: str | None, extra: Iterable[str] = ()) -> bool:
    """Whether a Host header names this server rather than a name an attacker could point
    at it (see the module docstring). No Host header (HTTP/1.0) passes: browsers always
    send one."""
    if host is None:
        return True
    name = host_name(host)
    if name is None:
        return False
    return name in LOOPBACK_NAMES or _is_ip(name) or name in {h.lower() for h in extra}


def host_names(text: str) -> frozenset[str]:
    """The names of a comma- or space-separated list, lower case, ports dropped."""
    names = (host_name(part) for part in re.split(r"[,\s]+", text) if part)
    return frozenset(name for name in names if name)


def _detail(status: int, message: str, code: str) -> dict[str, Any]:
    return {"detail": message}


class BrowserGuard:
    """ASGI middleware (see the module docstring). `check=False` only adds the headers;
    `error_body(status, message, code)` shapes a refusal's JSON; `hint` ends the 421's
    message (how to allow another name)."""

    def __init__(
        self,
        app: Callable[..., Any],
        *,
        check: bool = True,
        extra_hosts: Iterable[str] = (),
        error_body: Callable[[int, str, str], Any] = _detail,
        hint: str = "",
    ) -> None:
        self.app, self.check = app, check
        self.extra = frozenset(h.lower() for h in extra_hosts)
        self.error_body, self.hint = error_body, hint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # noqa: ANN401
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.check:
            refusal = self._refusal(scope)
            if refusal is not None:
                await self._refuse(send, *refusal)
                return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                added = [(k, v) for k, v in NOSNIFF_HEADERS if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, with_headers)

    def _refusal(self, scope: Any) -> tuple[int, str, str] | None:  # noqa: ANN401
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        host = headers.get("host")
        if not host_allowed(host, self.extra):
            shown = (host or "")[:100]
            message = (
                f"Host '{shown}' is not this server's name: without an API key it answers "
                f"only localhost and IP addresses (DNS rebinding guard){self.hint}"
            )
            return 421, message, "host_not_allowed"
        reason = cross_site_reason(
            scope["method"], headers, scope.get("scheme", "http"), safe_methods_too=True
        )
        if reason is not None:
            return 403, f"cross-site request refused: {reason}", "cross_site_request"
        return None

    async def _refuse(self, send: Any, status: int, message: str, code: str) -> None:  # noqa: ANN401
        body = json.dumps(self.error_body(status, message, code)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *NOSNIFF_HEADERS,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
