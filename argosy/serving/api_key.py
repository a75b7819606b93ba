"""An API key for the OpenAI routes: who may use a service's model.

Contract: `ApiKeyGuard(app, key)` is an ASGI middleware. With a key, every request under
`/v1/` needs `Authorization: Bearer <key>` (what the `openai` SDK sends as its
`api_key`), compared in constant time; otherwise it is answered 401 with OpenAI's error
object (`invalid_api_key`) before the app reads its body. Probes (`/live`, `/health`,
`/metrics`) stay open: the control plane and Prometheus call them without a key; `/admin/*`
has its own token. Without a key (`None`) every request passes, as before.

The key reaches `argosy serve` through the environment (`ARGOSY_SERVE_API_KEY`) or a file
(`--api-key-file`), never a command-line argument: every user on a host can read every
process's arguments. Under `argosy server`, each service gets its own key, derived from
the server's secret, and only its queue's tokens and admins can read it.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path

from argosy.core.errors import ArgosyError
from argosy.serving.limits import App, Receive, Scope, Send

ENV_API_KEY = "ARGOSY_SERVE_API_KEY"
GUARDED_PREFIX = "/v1/"


class ApiKeyGuard:
    """ASGI middleware: `/v1/*` needs the bearer key (see the module docstring)."""

    def __init__(self, app: App, key: str | None) -> None:
        self.app = app
        self.key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.key is None
            or scope["type"] != "http"
            or not scope["path"].startswith(GUARDED_PREFIX)
            or self._allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        await _refuse(send)

    def _allowed(self, scope: Scope) -> bool:
        assert self.key is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key)
        return False


async def _refuse(send: Send) -> None:
    body = {
        "error": {
            "message": "missing or wrong API key (Authorization: Bearer <key>)",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"www-authenticate", b"Bearer"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def read_key(path: Path | None, environ: dict[str, str]) -> str | None:
    """The key from `--api-key-file` (its first line) or `ARGOSY_SERVE_API_KEY`; None when
    neither is given. An empty or unreadable file is an `ArgosyError` naming it."""
    if path is not None:
        try:
            lines = path.read_text().strip().splitlines()
        except OSError as err:
            raise ArgosyError(f"--api-key-file {path}: {err.strerror}") from err
        key = lines[0].strip() if lines else ""
        if not key:
            raise ArgosyError(f"--api-key-file {path} is empty")
        return key
    key = environ.get(ENV_API_KEY, "").strip()
    return key or None
