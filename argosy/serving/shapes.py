"""The OpenAI response objects of `/v1/completions` and `/v1/chat/completions`.

`Shape` builds one response's objects: the whole answer (`full`), a stream chunk per piece
(`chunk`), the first chunk of a chat choice (`role_chunk`: `{"role": "assistant",
"content": ""}`), the usage chunk (`usage_chunk`: no choices). Log-probabilities take the
chat form (`{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`) or the legacy
completions form (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). `error_body`
is OpenAI's error object, with the `type` the status implies.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

ERROR_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_body(
    status: int, message: str, param: str | None, code: str | None = None
) -> dict[str, Any]:
    """`{"error": {...}}` as OpenAI writes it."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's `usage` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Shape:
    """Builds the OpenAI objects of one response (`kind`: `chat` or `text`)."""

    def __init__(self, model: str, kind: str, logprobs: bool = False) -> None:
        self.model, self.kind, self.logprobs = model, kind, logprobs
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self._offsets: dict[int, int] = {}

    def offset_from(self, index: int, chars: int) -> None:
        """Choice `index`'s text starts with `chars` characters of prompt (`echo`): its
        completion logprobs' `text_offset` counts from there."""
        self._offsets[index] = chars

    def _base(self, chunk: bool) -> dict[str, Any]:
        obj = "text_completion"
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, choices: Sequence[Any], prompt_tokens: int) -> dict[str, Any]:
        """The whole answer; `choices` are `streaming.Choice`s."""
        rows = []
        for choice in choices:
            row: dict[str, Any] = {"index": choice.index}
            if self.kind == "chat":
                row["message"] = {"role": "assistant", "content": choice.text}
            else:
                row["text"] = choice.text
            row["logprobs"] = self._logprobs(choice.index, choice.logprobs, choice.text)
            row["finish_reason"] = choice.finish
            rows.append(row)
        completion = sum(c.tokens for c in choices)
        return {**self._base(False), "choices": rows, "usage": usage(prompt_tokens, completion)}

    def chunk(self, piece: Any) -> dict[str, Any]:
        """A stream chunk of one `streaming.Piece`."""
        row: dict[str, Any] = {"index": piece.index}
        if self.kind == "chat":
            row["delta"] = {"content": piece.text} if piece.text or not piece.finish else {}
        else:
            row["text"] = piece.text
        row["logprobs"] = self._logprobs(piece.index, piece.logprobs, piece.text)
        row["finish_reason"] = piece.finish
        return {**self._base(True), "choices": [row]}

    def role_chunk(self, index: int) -> dict[str, Any]:
        """The first chunk of a chat choice: the role, and empty content."""
        delta = {"role": "assistant", "content": ""}
        row = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._base(True), "choices": [row]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The last chunk before `[DONE]` with `stream_options.include_usage`."""
        return {**self._base(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}

    def _logprobs(self, index: int, entries: Sequence[Any], text: str) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return {"content": [_chat_entry(e) for e in entries], "refusal": None}
        offset = self._offsets.get(index, 0)
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        self._offsets[index] = offset
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries],
            "text_offset": offsets,
        }


def _chat_entry(entry: Any) -> dict[str, Any]:
    top = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in entry.top]
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.token_bytes),
        "top_logprobs": top,
    }
