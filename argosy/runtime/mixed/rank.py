"""The in-script side of a mixed-chip launch: this rank's assignment, throttle and stats.

    mixed = MixedRank.from_env(rank, world, global_batch=24, micro_batch=4)
    mixed.calibrate(run_one_micro_batch)   # emulated launches: agree on the time scale
    mixed.assignment.samples, mixed.assignment.sample_offset   # this rank's slice
    sync = GradSync(model, mixed.allreduce(), weight=mixed.assignment.weight,
                    pace=mixed.throttle.pace)
    with mixed.throttle.step():
        with mixed.throttle.block(samples=4): ...              # one micro-batch
    mixed.record(step, compute_s, wait_s)
    mixed.finish(run_dir)        # rank 0 writes <run dir>/mixed/throughput.json

Under `argosy launch --plan`, the launcher's assignment file (`ARGOSY_MIXED`) says what
this rank does; without it every rank gets an even share of `global_batch` (a uniform
run, one group of the host's chip), so the same script runs both.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from argosy.runtime.mixed.emulate import Throttle, sample_seconds
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

CALIBRATION_FILE = "calibration.json"
"""Next to the assignment file: the launch's calibrated emulation times."""

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
        given = emulation.get("sample_s") if emulation else None
        return cls(assignment, doc, Throttle(given[emulation["chips"][rank]] if given else 0.0))

    def calibrate(
        self, run_micro_batch: Callable[[], None], warmup: int = 2, repeats: int = 7
    ) -> None:
        """Emulated launch without given times: set this rank's seconds per sample.

        Every rank times `repeats` real micro-batches (`run_micro_batch` runs one of
        `assignment.micro_batch` samples) after `warmup`, the ranks agree on the largest
        median per sample (all-reduce max: all ranks must call this), and the fastest
        chip's reference is that x headroom; this rank's time is reference / its speed.
        Rank 0 saves the result next to the assignments, and a restarted attempt of the
        launch reads it instead of measuring again (same time scale after a fault).
        Does nothing when the launch is not emulated or the times were given."""
        emulation = self.doc.get("emulation")
        if not emulation or emulation.get("sample_s"):
            return
        saved = self._saved_calibration()
        if saved is not None:  # a restarted attempt keeps the launch's time scale
            emulation.update(saved)
        else:
            emulation.update(self._measure(run_micro_batch, warmup, repeats, emulation))
        self.throttle.sample_s = emulation["sample_s"][emulation["chips"][self.assignment.rank]]

    def _measure(
        self, run_micro_batch: Callable[[], None], warmup: int, repeats: int, emulation: dict
    ) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        for _ in range(warmup):
            run_micro_batch()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run_micro_batch()
            times.append(time.perf_counter() - start)
        measured = torch.tensor([statistics.median(times) / self.assignment.micro_batch])
        dist.all_reduce(measured, op=dist.ReduceOp.MAX)
        reference_s = float(measured) * float(emulation["headroom"])
        speeds = emulation["relative_speed"]
        out = {
            "calibrated_s_per_sample": float(measured),
            "sample_s": sample_seconds(reference_s, emulation["chips"], speeds),
        }
        path = self._calibration_path()
        if self.assignment.rank == 0 and path is not None:
            from argosy.runtime.events import write_json_atomic

            write_json_atomic(path, out)
        return out

    def _calibration_path(self) -> Path | None:
        where = os.environ.get(ENV_MIXED)
        return Path(where).with_name(CALIBRATION_FILE) if where else None

    def _saved_calibration(self) -> dict[str, Any] | None:
        path = self._calibration_path()
        if path is None or not path.exists():
            return None
        return json.loads(path.read_text())

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
                "overrun_s": self.throttle.overrun_s,
                "real_compute_s": self.throttle.compute_s,
            }
        )

    def finish(self, run_dir: Path | None, warmup: int = 2) -> dict[str, Any] | None:
        """Gather every rank's records; rank 0 writes and returns the throughput summary."""
        import torch.distributed as dist

        _per_step_totals(self.records)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.records)
        if self._allreduce is not None:
            self._allreduce.close()
        if self.assignment.rank != 0:
            return None
        summary = throughput_summary(self.doc, gathered, warmup=warmup)
        if run_dir is not None:
            write_throughput(run_dir, summary, gathered)
        return summary


def _per_step_totals(records: list[dict[str, float]]) -> None:
    """Records carry running totals of the throttle's overrun and real compute time; make
    them per step."""
    for key in ("overrun_s", "real_compute_s"):
        before = 0.0
        for r in records:
            total = r[key]
            r[key], before = total - before, total
