"""The trainer's own snapshot slots, filled while its persister starts.

    held = HeldSlots(job, rank)
    held.hold(step, meta_bytes, inline, sources)   # a copy into one of two slots of our own
    paths = held.hand_over()                       # the persister adopts them, oldest first

Contract: a new process's first saves never wait for the persister (it imports torch:
seconds); `hold` copies the snapshot into one of two shared-memory slots named
`...-r<rank>-sh<index>` (segment.held_name), overwriting the older one, so the newest
complete snapshot survives a copy cut short and a SIGKILL of the trainer (its persister,
or the next one, adopts them as an orphan's). `hand_over` closes them here and returns
their paths, oldest step first, for the persister to adopt; nothing is unlinked here.
"""

from __future__ import annotations

import pickle
from typing import Any

from argosy.checkpoint.layout import align
from argosy.checkpoint.segment import HEADER_BYTES, HELD_SLOTS, SHM_DIR, Segment, held_name
from argosy.checkpoint.staging import slot_data, write_snapshot


class HeldSlots:
    """Two slots of the trainer's own, and the step each holds."""

    def __init__(self, job: str, rank: int) -> None:
        self.job = job
        self.rank = rank
        self.steps: dict[int, int] = {}
        """Step of the complete snapshot in each slot, by slot index."""
        self.segments: dict[int, Segment] = {}

    def __bool__(self) -> bool:
        return bool(self.segments)

    def hold(self, step: int, meta: bytes, inline: dict[int, bytes], sources: list[Any]) -> None:
        """Copy one snapshot into the slot holding the older step (or a free one)."""
        snapshot = pickle.loads(meta)
        size = HEADER_BYTES + align(snapshot.data_len + 2 * len(meta) + (1 << 20))
        index = min(range(HELD_SLOTS), key=lambda i: self.steps.get(i, -1))
        seg = self.segments.get(index)
        if seg is None or seg.size < size:
            if seg is not None:
                seg.close()
            path = SHM_DIR / held_name(self.job, self.rank, index)
            path.unlink(missing_ok=True)
            seg = self.segments[index] = Segment.create(path, size)
        self.steps.pop(index, None)
        data = slot_data(seg)
        write_snapshot(seg, data, snapshot, meta, inline, sources)
        del data
        self.steps[index] = step

    def hand_over(self) -> list[str]:
        """The slots' paths, oldest step first; they are the persister's from now on."""
        order = sorted(self.segments, key=lambda i: self.steps.get(i, -1))
        paths = [str(self.segments[i].path) for i in order]
        for seg in self.segments.values():
            seg.close()
        self.segments, self.steps = {}, {}
        return paths
