"""Text deltas of a growing token sequence, at a cost that does not grow with it.

A stream must send each piece of text once, never half a character, and end with exactly
the text of all its tokens. Decoding every token id again at each step does that but costs
O(n) per token, O(n^2) per request, all of it under the GIL that the batch loop needs.
`TextStream` decodes a short window instead (the method of vLLM's incremental
detokenizer): the text of `ids[prefix:]` minus the text of `ids[prefix:read]`, where
`read` is where the text sent so far ends and `prefix` where the delta before it began.
Both decodes start at the same token, so a tokenizer's treatment of a leading piece (a
dropped space) cancels out. A window that ends inside a multi-byte character (U+FFFD)
sends nothing until the character completes; at the end, the rest is sent as decoded.

    stream = TextStream(tokenizer_decode)
    for new_ids in steps:
        send(stream.push(new_ids))
    send(stream.finish())
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    """Deltas of `decode(ids)` as `ids` grows; `decode` maps token ids to text."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # the window's first token: where the previous delta began
        self._read = 0  # tokens whose text has been sent

    def push(self, new: Sequence[int], final: bool = False) -> str:
        """The text `new` completes (empty while a character is still partial); with
        `final`, no token follows: everything left (a partial character as U+FFFD)."""
        self.ids.extend(new)
        window = self.ids[self._prefix :]
        before = self._decode(window[: self._read - self._prefix])
        after = self._decode(window)
        if not final and (len(after) <= len(before) or after.endswith(REPLACEMENT)):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]

    def finish(self) -> str:
        """The text left once no token follows: `push((), final=True)`."""
        return self.push((), final=True)
