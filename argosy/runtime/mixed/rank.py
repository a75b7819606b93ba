"""The in-script side of a mixed-chip launch: this rank's assignment, throttle and stats.

    mixed = MixedRank.from_env(rank, world, global_batch=24, micro_batch=4)
    mixed.assignment.samples, mixed.assignment.sample_offset   # this rank's slice
    sync = GradSync(model, mixed.allreduce(), weight=mixed.assignment.weight)
    with mixed.throttle.block(): ...                           # one micro-batch
    mixed.record(step, compute_s, wait_s)
    mixed.finish(run_dir)        # rank 0 writes <run dir>/mixed/throughput.json

Under `argosy launch --plan`, the launcher's assignment file (`ARGOSY_MIXED`) says what
this rank does; without it every rank gets an even share of `global_batch` (a uniform
run, one group of the host's chip), so the same script runs both.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from argosy.runtime.mixed.emulate import Throttle
from argosy.runtime.mixed.plan import (
    ENV_MIXED,
    GroupLayout,
    MixedLayout,
    RankAssignment,
    assign_ranks,
    decode_assignment,
    encode_assignments,
)
from argosy.runtime.mixed.report import throughput_summary, write_throughput

if TYPE_CHECKING:
    from argosy.runtime.mixed.allreduce import HierarchicalAllReduce


@dataclass
class MixedRank:
    """This rank's part of a mixed launch (see the module docstring)."""

    assignment: RankAssignment
    doc: dict[str, Any]
    throttle: Throttle
    records: list[dict[str, float]] = field(default_factory=list)
    _allreduce: HierarchicalAllReduce | None = None

    @classmethod
    def from_env(cls, rank: int, world: int, global_batch: int, micro_batch: int) -> MixedRank:
        path = os.environ.get(ENV_MIXED)
        if path:
            assignment, doc = decode_assignment(Path(path).read_text(), rank)
        else:
            group = GroupLayout("cpu", world, global_batch, micro_batch, 1, None, 0.0)
            layout = MixedLayout("batch", (group,), global_batch, 0.0)
            doc_text = encode_assignments(layout, assign_ranks(layout), {"emulation": None})
            assignment, doc = decode_assignment(doc_text, rank)
        emulation = doc.get("emulation")
        slowdown = emulation["slowdown"][rank] if emulation else 1.0
        return cls(assignment, doc, Throttle(slowdown))

    def group_of_rank(self) -> list[int]:
        return [int(r["group"]) for r in self.doc["ranks"]]

    def allreduce(self, device_backend: str = "cpu") -> HierarchicalAllReduce:
        """The hierarchical all-reduce over this launch's chip groups (built once)."""
        if self._allreduce is None:
            from argosy.runtime.mixed.allreduce import HierarchicalAllReduce

            self._allreduce = HierarchicalAllReduce(self.group_of_rank(), device_backend)
        return self._allreduce

    def record(self, step: int, compute_s: float, wait_s: float) -> None:
        """One step's busy and waiting time on this rank (stamped with its end)."""
        self.records.append(
            {
                "step": step,
                "compute_s": compute_s,
                "wait_s": wait_s,
                "end_s": time.monotonic(),
                "oversleep_s": self.throttle.oversleep_s,
                "cpu_s": self.throttle.cpu_s,
            }
        )

    def finish(self, run_dir: Path | None, warmup: int = 2) -> dict[str, Any] | None:
        """Gather every rank's records; rank 0 writes and returns the throughput summary."""
        import torch.distributed as dist

        _per_step_oversleep(self.records)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.records)
        if self._allreduce is not None:
            self._allreduce.close()
        if self.assignment.rank != 0:
            return None
        summary = throughput_summary(self.doc, gathered, warmup=warmup)
        if run_dir is not None:
            write_throughput(run_dir, summary)
        return summary


def _per_step_oversleep(records: list[dict[str, float]]) -> None:
    """Records carry running totals of the throttle's oversleep and CPU time; make them
    per step."""
    for key in ("oversleep_s", "cpu_s"):
        before = 0.0
        for r in records:
            total = r[key]
            r[key], before = total - before, total
