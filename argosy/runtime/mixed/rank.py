"""The in-script side of a mixed-chip launch: this rank's assignment, throttle and stats.

    mixed = MixedRank.from_env(rank, world, global_batch=24, micro_batch=4)
    mixed.calibrate(run_one_micro_batch)   # emulated launches: agree on the time scale
    mixed.assignment.samples, mixed.assignment.sample_offset   # this rank's slice
    sync = GradSync(model, mixed.allreduce(), weight=mixed.assignment.weight,
                    pace=mixed.throttle.pace)
    with mixed.throttle.step():
        with mixed.throttle.block(samples=4): ...              # one micro-batch
    mixed.record(step, compute_s, wait_s)
    mixed.maybe_rebalance(step)  # all ranks: may move the batch shares (rebalance)
    mixed.state_dict()           # into each checkpoint; load_state_dict on resume
    mixed.finish(run_dir)        # rank 0 writes <run dir>/mixed/throughput.json

Under `argosy launch --plan`, the launcher's assignment file (`ARGOSY_MIXED`) says what
this rank does; without it every rank gets an even share of `global_batch` (a uniform
run, one group of the host's chip), so the same script runs both.

Rebalancing (`rebalance`, on by default for batch splits over several chip groups; the
document's `rebalance` policy): after each step `maybe_rebalance` keeps this rank's busy
time per sample; every `window_steps` steps the ranks all-reduce their medians and each
computes the same new group shares from the same numbers, so they agree without a
leader. `assignment` then holds this rank's new slice (samples, offset, weight); the
slices still partition the global batch. The shares in use go into checkpoints
(`state_dict`), so a resumed attempt continues on them.
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
    layout_from_doc,
)
from argosy.runtime.mixed.rebalance import (
    RebalancePolicy,
    decide,
    group_sample_s,
    median_sample_s,
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
    shares: list[int] = field(default_factory=list)
    """Samples per step of each chip group now (the plan's until a rebalance)."""
    changes: list[dict[str, Any]] = field(default_factory=list)
    """Every adopted change of shares: step, from, to, measured s/sample, modelled gain."""
    checks: int = 0
    """Rebalance decisions taken (adopted or not) in this attempt."""
    _window: list[tuple[float, int]] = field(default_factory=list)
    _steps_seen: int = 0

    def __post_init__(self) -> None:
        if not self.shares:
            self.shares = self.planned_shares()

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

    def planned_shares(self) -> list[int]:
        return [int(g["samples"]) for g in self.doc["layout"]["groups"]]

    def policy(self) -> RebalancePolicy | None:
        """The launch's rebalance policy, None where it does not apply (off, one group,
        or a layer split: pipeline stages keep the plan's layer counts)."""
        layout = self.doc["layout"]
        given = self.doc.get("rebalance")
        if not given or layout["split"] == "layers" or len(layout["groups"]) < 2:
            return None
        policy = RebalancePolicy.model_validate(given)
        return policy if policy.enabled else None

    def maybe_rebalance(self, step: int) -> bool:
        """After `step`'s record, on every rank: every `window_steps` measured steps, agree
        on the group shares for the measured speeds (a collective: all ranks call this
        at the same steps). True when the shares changed."""
        policy = self.policy()
        if policy is None or not self.records or int(self.records[-1]["step"]) != step:
            return False
        self._steps_seen += 1
        if self._steps_seen <= policy.warmup_steps:
            return False
        last = self.records[-1]
        self._window.append((float(last["compute_s"]), int(last["samples"])))
        if len(self._window) < policy.window_steps:
            return False
        busy, samples = zip(*self._window, strict=True)
        self._window.clear()
        measured = self._pool(median_sample_s(list(busy), list(samples)))
        per_group = group_sample_s(measured, self.group_of_rank())
        devices = [int(g["devices"]) for g in self.doc["layout"]["groups"]]
        self.checks += 1
        if min(per_group) <= 0:
            return False
        decision = decide(self.shares, per_group, devices, policy)
        if not decision.changed:
            return False
        self.changes.append(
            {
                "step": step,
                "from": list(self.shares),
                "to": decision.shares,
                "group_sample_s": [round(t, 6) for t in per_group],
                "modelled_gain": round(decision.gain, 4),
            }
        )
        self.apply_shares(decision.shares)
        return True

    def _pool(self, mine: float) -> list[float]:
        """Every rank's median seconds per sample, the same list on every rank."""
        import torch
        import torch.distributed as dist

        values = torch.zeros(len(self.doc["ranks"]), dtype=torch.float64)
        values[self.assignment.rank] = mine
        dist.all_reduce(values)  # one non-zero term per slot: exact, identical everywhere
        return values.tolist()

    def apply_shares(self, shares: list[int]) -> None:
        """Run on `shares` (per group) from the next step: this rank's new slice."""
        layout = layout_from_doc(self.doc["layout"], shares)
        self.assignment = assign_ranks(layout)[self.assignment.rank]
        self.shares = list(shares)

    def state_dict(self) -> dict[str, Any]:
        """The shares in use and their history, for a checkpoint."""
        return {"shares": list(self.shares), "changes": [dict(c) for c in self.changes]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Resume on a checkpoint's shares (a checkpoint without them keeps the plan's)."""
        if not state:
            return
        self.changes = [dict(c) for c in state.get("changes", [])]
        shares = [int(s) for s in state["shares"]]
        if shares != self.shares:
            self.apply_shares(shares)

    def shares_report(self) -> dict[str, Any]:
        """summary.json's `throughput.shares`: planned, in use at the end, changes."""
        policy = self.policy()
        return {
            "rebalance": policy.model_dump() if policy is not None else None,
            "planned": self.planned_shares(),
            "used": list(self.shares),
            "changes": self.changes,
            "checks": self.checks,
        }

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
                "samples": self.assignment.samples,
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
        summary["shares"] = self.shares_report()
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
