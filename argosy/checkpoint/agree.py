"""What the ranks agree on: the attempt's epoch, and the one step every rank resumes from.

Resume: every rank reports what it holds (complete snapshots in shared memory, committed
steps on disk); the newest step that every rank holds in one tier is tried; every rank
reads its part and reports whether that worked; if any rank failed (a torn file, a
snapshot overwritten while read) the step is dropped from that tier for everyone and the
next one is tried. So all ranks return the same step, or all return None, and a problem
of one rank (even an exception) never sends the ranks to different steps. The decision,
with what every rank reported and what was rejected and why, is returned as a dict.

    decision = resume(memory={10, 15}, on_disk={5, 10}, wanted=None, read=my_reader)
    decision.step, decision.result, decision.record()
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from argosy.checkpoint.restore import choose_step

ENV_EPOCH = "ARGOSY_CKPT_EPOCH"

Reader = Callable[[int, bool], Any]
"""read(step, from_memory) -> result; raises UnreadableError (or anything) when it cannot."""


class UnreadableError(Exception):
    """This rank cannot read the chosen step from the chosen tier (torn, changed)."""


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def all_gather(value: Any, world_size: int) -> list[Any]:
    dist = _dist()
    if world_size <= 1 or dist is None:
        return [value]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, value)
    return out


def agree_epoch(world_size: int) -> int:
    """The launcher's epoch for this attempt, else rank 0's clock (microseconds) for all."""
    explicit = os.environ.get(ENV_EPOCH)
    if explicit:
        return int(explicit)
    mine = time.time_ns() // 1000
    dist = _dist()
    if world_size > 1 and dist is not None:
        box = [mine]
        dist.broadcast_object_list(box, src=0)
        return int(box[0])
    return mine


@dataclass
class Decision:
    step: int | None = None
    source: str | None = None
    result: Any = None
    reports: list[dict[str, list[int]]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """JSON-friendly: the step, its tier, every rank's report, the rejected tries."""
        return {
            "step": self.step,
            "source": self.source,
            "ranks": self.reports,
            "rejected": self.rejected,
        }


def resume(
    memory: set[int],
    on_disk: set[int],
    wanted: int | None,
    read: Reader,
    world_size: int,
    gather: Callable[[Any], list[Any]] | None = None,
) -> Decision:
    """One decision for all ranks (see the module docstring); collective under dist.

    `gather(value)` returns every rank's value in rank order (all_gather_object by default).
    """
    gather = gather or (lambda value: all_gather(value, world_size))
    gathered = gather((sorted(memory), sorted(on_disk)))
    decision = Decision(reports=[{"memory": m, "disk": d} for m, d in gathered])
    memory_sets = [set(m) for m, _ in gathered]
    disk_sets = [set(d) for _, d in gathered]
    while True:
        choice = choose_step(memory_sets, disk_sets, wanted)
        if choice is None:
            return decision
        step, from_memory = choice
        result, problem, fatal, local = None, None, False, None
        try:
            result = read(step, from_memory)
        except UnreadableError as err:
            problem = str(err)
        except FileNotFoundError as err:
            problem = f"{type(err).__name__}: {err}"
            if not from_memory:  # a file of a committed step gone: never skipped silently
                fatal, local = True, err
            # a memory slot that vanished after it was listed (reclaimed, or a persister of
            # the given-up attempt took it) is dropped for all ranks, like a torn copy
        except Exception as err:  # raised on every rank below, never on one alone
            problem, fatal, local = f"{type(err).__name__}: {err}", True, err
        outcomes = gather((problem, fatal))
        problems = {r: p for r, (p, _) in enumerate(outcomes) if p is not None}
        if not problems:
            decision.step, decision.result = step, result
            decision.source = "memory" if from_memory else "disk"
            return decision
        tier = "memory" if from_memory else "disk"
        decision.rejected.append({"step": step, "source": tier, "problems": problems})
        if local is not None:
            raise local
        if any(f for _, f in outcomes):
            raise AgreedError(step, problems)
        memory_sets = [m - {step} for m in memory_sets]
        if not from_memory:
            disk_sets = [d - {step} for d in disk_sets]


class AgreedError(Exception):
    """A rank failed to load the agreed step for a reason that is not a torn checkpoint."""

    def __init__(self, step: int, problems: dict[int, str]) -> None:
        self.step = step
        self.problems = problems
        text = "; ".join(f"rank {r}: {p}" for r, p in sorted(problems.items()))
        super().__init__(f"loading step {step} failed: {text}")
