"""The device spec users write (`--device`): one lexical form for training and serving.

Contract: `parse_device_spec(spec)` returns `(kind, index)`: `("auto", None)`,
`("cpu", None)`, `("cuda", None)` or `("cuda", i)` for `cuda:i`; anything else raises
`ValueError` naming the accepted forms (`FORMS`). Case and surrounding space are ignored.
What `cuda` without an index means is each caller's: a training rank's own GPU
(`argosy.runtime.devices`), GPU 0 for a server (`argosy.serving.placement`).
"""

from __future__ import annotations

FORMS = "auto, cpu, cuda, cuda:<index>"
"""The accepted device specs, as error messages list them."""


def parse_device_spec(spec: str) -> tuple[str, int | None]:
    """`(kind, index)` of a device spec; `ValueError` listing `FORMS` otherwise."""
    text = spec.strip().lower()
    if text in ("auto", "cpu", "cuda"):
        return text, None
    kind, sep, index = text.partition(":")
    if kind == "cuda" and sep and index.isdigit():
        return "cuda", int(index)
    raise ValueError(f"device '{spec}' is not one of the accepted forms: {FORMS}")
