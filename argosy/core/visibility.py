"""Which devices a process sees: the vendor variables that narrow a runtime's device list.

Each runtime numbers the devices it sees 0..n-1 after its variable narrows them:

    CUDA_VISIBLE_DEVICES=4,5   -> cuda:0 is GPU 4, cuda:1 is GPU 5

so a child narrowed again by index (`argosy launch`'s preflight keeps the healthy ones)
must name its parent's entries, not its own indices: `narrowed("0,1" ...)` under
`CUDA_VISIBLE_DEVICES=4,5,6` is `4,5`. ROCm is narrowed at its lowest layer
(`ROCR_VISIBLE_DEVICES`), which `HIP_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES` then index
into, so a job's own narrowing stays relative there by design.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

BACKEND_VARIABLE = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "ROCR_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
}
"""Device backend (`argosy.hardware.backends`) -> the variable an executor sets to give a
process its devices."""


def entries(value: str | None) -> list[str] | None:
    """A visibility variable's entries (None when unset); runtimes stop at the first empty
    or negative entry, and so does this."""
    if value is None:
        return None
    out: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def narrowed(variable: str, indices: Sequence[int], env: Mapping[str, str]) -> str:
    """The value of `variable` that shows a child only `indices`, numbered as a process
    with environment `env` numbers its devices. An index past what `env` shows is an error:
    the child would silently get another device, or none."""
    seen = entries(env.get(variable))
    if seen is None:
        return ",".join(str(i) for i in indices)
    if any(i < 0 or i >= len(seen) for i in indices):
        raise ValueError(f"devices {list(indices)} are not all among {variable}={seen}")
    return ",".join(seen[i] for i in indices)
