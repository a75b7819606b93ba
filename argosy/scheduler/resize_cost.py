"""What a planned resize of an elastic job costs, by the job's size and state.

A resize is a checkpoint-resume on argosy's runtime: a blocking snapshot of every rank's
training state to host memory, a restart of the job on its new device count (hand-off to
warm standby processes, rendezvous, communicator init), and a restore of each rank's new
shard from host memory. Every device of the job stands still for the sum:

    resize_s(state, before, after) = state / before / snapshot_gbps      (per-rank copy)
                                   + restart_s(after)                   (by world size)
                                   + state / after / restore_gbps       (per-rank load)

`restart_s(ranks)` is piecewise linear in the rank count through calibration points,
each with its source, and continues past the last one with the last segment's slope
(communicator init and rendezvous grow with the world size: MegaScale's 2,048 and
10,000-GPU figures are 3.1 ms per added rank apart). The points:

    2 ranks       1.29 s   measured here: the runtime's warm-standby restart of a 2-rank
                           job (benchmarks/RESULTS.md, "Runtime": 1.49 / 1.29 / 0.61 s)
    2,048 ranks   5.0 s    MegaScale (Jiang et al., NSDI'24; fault_model.json source
                           `megascale`): communicator-group initialisation of a
                           2,048-GPU job, under 5 s after their fixes (1,047 s before)
    10,000 ranks  30.0 s   MegaScale: under 30 s for more than 10,000 GPUs

Snapshot and restore scale with the state per rank (weights, gradients and Adam
moments, 16 bytes per parameter, sharded over the job's ranks):

    snapshot_gbps 3.4      DLRover flash checkpoint, GLM-65B on 1,536 H800: 0.2 s
                           blocking for 65e9 x 16 B / 1,536 = 0.68 GB per rank
                           (reference/checkpointing.md, fault_model.json time_costs)
    restore_gbps  8.2      measured here: restore from shared memory + load_state_dict,
                           3.02 GB in 0.37 s (reference/checkpointing.md)

A job whose state is not known (`state_bytes` 0) is priced at DLRover's 0.68 GB per
rank. Example: a 70B model (1.1 TB of state) resized from 512 to 448 H100s stalls
0.65 + 2.10 + 0.31 = 3.1 s, where the runtime's 10,000-rank budget charged 45.2 s.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

BYTES_PER_PARAM = 16.0
"""Mixed-precision Adam: bf16 weights and gradients, fp32 master weights and two moments
(ZeRO, Rajbhandari et al. 2020: 16 bytes per parameter)."""
GB = 1e9
MEMO_ENTRIES = 1 << 18


@dataclass(frozen=True)
class RestartPoint:
    """One calibration point of the restart curve: `ranks` restart in `seconds`."""

    ranks: int
    seconds: float
    source: str


RESTART_POINTS: tuple[RestartPoint, ...] = (
    RestartPoint(2, 1.29, "argosy runtime, warm-standby restart of 2 ranks (RESULTS.md)"),
    RestartPoint(2048, 5.0, "MegaScale NSDI'24: communicator init of 2,048 GPUs, < 5 s"),
    RestartPoint(10000, 30.0, "MegaScale NSDI'24: communicator init of > 10,000 GPUs, < 30 s"),
)


@dataclass(frozen=True)
class ResizeCost:
    """Seconds a planned resize stops every device of a job (see the module docstring)."""

    restart_points: tuple[RestartPoint, ...] = RESTART_POINTS
    snapshot_gbps: float = 3.4
    restore_gbps: float = 8.2
    unknown_state_gb_per_rank: float = 65e9 * BYTES_PER_PARAM / 1536 / GB
    _ranks: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _seconds: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _memo: dict[tuple[float, int, int], float] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        points = sorted(self.restart_points, key=lambda p: p.ranks)
        if len(points) < 2 or len({p.ranks for p in points}) != len(points):
            raise ValueError("restart_points needs two or more distinct rank counts")
        if any(b.seconds < a.seconds for a, b in zip(points, points[1:], strict=False)):
            raise ValueError("restart_points must not fall as the rank count grows")
        object.__setattr__(self, "_ranks", tuple(p.ranks for p in points))
        object.__setattr__(self, "_seconds", tuple(p.seconds for p in points))

    def restart_s(self, ranks: int) -> float:
        """Restart of a job on `ranks` ranks: through the points, flat below the first,
        the last segment's slope past the last."""
        xs, ys = self._ranks, self._seconds
        if ranks <= xs[0]:
            return ys[0]
        i = min(bisect_right(xs, ranks), len(xs) - 1)
        slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + slope * (ranks - xs[i - 1])

    def state_gb_per_rank(self, state_bytes: float, ranks: int) -> float:
        if state_bytes <= 0:
            return self.unknown_state_gb_per_rank
        return state_bytes / GB / max(1, ranks)

    def seconds(self, state_bytes: float, before: int, after: int) -> float:
        """Stall of a resize from `before` to `after` devices of a job holding
        `state_bytes` of training state (0: unknown). Memoised: the scheduler asks for
        the same few job sizes every cycle."""
        key = (state_bytes, before, after)
        cost = self._memo.get(key)
        if cost is None:
            if len(self._memo) > MEMO_ENTRIES:
                self._memo.clear()
            snapshot = self.state_gb_per_rank(state_bytes, before) / self.snapshot_gbps
            restore = self.state_gb_per_rank(state_bytes, after) / self.restore_gbps
            cost = self._memo[key] = snapshot + self.restart_s(after) + restore
        return cost


def training_state_bytes(params: float) -> float:
    """Bytes of training state of a model with `params` parameters."""
    return params * BYTES_PER_PARAM
