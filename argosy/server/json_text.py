"""A guard on JSON request bodies: refuse, before any route reads it, a body that is not
UTF-8, holds text no answer could write back, or nests deeper than any spec does.

- Bytes that are not UTF-8 (RFC 8259: JSON between systems is UTF-8) are a 422 naming
  the offset (FastAPI's own answer is a bare 400, "There was an error parsing the body").
- A lone UTF-16 surrogate (`"\\udc80"`: legal JSON, not Unicode text) is a 422 naming
  the field. Let through, it failed every answer that echoed or showed it (a 500 for
  the submit, and for every later read of the stored job).
- A body nesting lists and objects deeper than MAX_JSON_DEPTH is a 422 naming the limit
  (FastAPI's own answer to JSON its parser cannot recurse into is that same bare 400).

The answers keep FastAPI's shape, `{"detail": [{"type", "loc", "msg"}]}`. Only unsafe
requests with a JSON body (or no Content-Type, which FastAPI reads as JSON) are looked
at, and a body is parsed here only if it could hold the last two problems: it has a
`\\ud800`-`\\udfff` escape, or more than MAX_JSON_DEPTH brackets. Others pass as they
came, so a submit pays a UTF-8 check, a regex search and two byte counts (0.5 us).

    app.add_middleware(JsonText)   # inside the body cap: bodies here are already capped
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from argosy.core.text import NOT_TEXT, depth, find_unencodable

MAX_JSON_DEPTH = 32
"""Deepest nesting of lists and objects a JSON body may have (a job's is 3)."""
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_json(scope: Scope) -> bool:
    for key, value in scope["headers"]:
        if key == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True  # no Content-Type: FastAPI parses the body as JSON


def problem(body: bytes) -> dict[str, Any] | None:
    """The validation error of a body that is not UTF-8, holds a lone surrogate or nests
    too deeply; None for any other body."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = f"not UTF-8: byte 0x{body[err.start]:02x} at offset {err.start}"
        return {"type": "json_invalid", "loc": ["body", err.start], "msg": msg}
    escapes = SURROGATE_ESCAPE.search(body) is not None
    if not escapes and body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return None
    too_deep = {
        "type": "json_too_deep",
        "loc": ["body"],
        "msg": f"JSON nested deeper than {MAX_JSON_DEPTH} levels of lists and objects",
    }
    try:
        data = json.loads(body)
    except RecursionError:
        return too_deep
    except ValueError:
        return None  # not JSON: FastAPI answers with its own 422
    if depth(data) > MAX_JSON_DEPTH:
        return too_deep
    where = find_unencodable(data) if escapes else None
    if where is None:
        return None
    return {
        "type": "string_unicode",
        "loc": ["body", *where],
        "msg": NOT_TEXT,
    }


class JsonText:
    """Reads a JSON body whole (the body cap outside it bounds it), refuses it if
    `problem` says so, else hands the same bytes to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE or not is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away; nobody reads an answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        error = problem(body)
        if error is not None:
            await refuse(send, error)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def refuse(send: Send, error: dict[str, Any]) -> None:
    body = json.dumps({"detail": [error]}).encode()  # ASCII: the path may hold the key
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 422, "headers": headers})
    await send({"type": "http.response.body", "body": body})
