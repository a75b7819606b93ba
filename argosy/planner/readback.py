"""What an emitted config means, read back, and how it compares with the plan.

Contract: every emitter has a reader that turns its output into `Semantics` (each degree,
micro-batch, global batch, recompute, sharding as the framework's lowest equivalent ZeRO
stage, precision); `expected(plan, global_batch, framework)` is what the plan asks for in
the same terms, and `mismatches(want, got)` lists every field that differs, so "zero
semantic mismatches" is checkable on argosy's own read-back (tests, property-tested over
plans) and on the real parsers' (benchmarks/emit_check.py). `EmitRefusedError` is raised by an
emitter for a plan its framework cannot run, with the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from argosy.core.errors import ArgosyError
from argosy.planner.frameworks import load_framework
from argosy.planner.parallel import Parallel


class EmitRefusedError(ArgosyError):
    """The framework cannot run this plan; the message says why."""


@dataclass(frozen=True)
class Semantics:
    """The parts of a plan a launch must reproduce exactly."""

    tp: int
    pp: int
    vpp: int
    dp: int
    cp: int
    ep: int
    mbs: int
    global_batch: int
    recompute: str
    zero: int
    precision: str
    recompute_layers: int = 0
    """Full recompute of only the first k layers of each model chunk; 0: all or n/a."""
    etp: int = 0
    """Tensor-parallel degree of the routed experts; 0 for a dense model."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def canonical_zero(framework: str, zero: int) -> int:
    """The lowest ZeRO stage that behaves as `zero` in `framework` (Megatron's distributed
    optimizer is both 1 and 2; torchtitan's zero 0 and 1 both replicate)."""
    profile = load_framework(framework)
    this = profile.stage(zero).model_dump(exclude={"note"})
    for z in sorted(profile.zero):
        if profile.stage(z).model_dump(exclude={"note"}) == this:
            return z
    return zero


def expected(plan: Parallel, global_batch: int, framework: str, moe: bool = False) -> Semantics:
    """The semantics `plan` asks of `framework`'s launch (`moe`: the model routes experts)."""
    return Semantics(
        tp=plan.tp, pp=plan.pp, vpp=plan.vpp, dp=plan.dp, cp=plan.cp, ep=plan.ep, mbs=plan.mbs,
        global_batch=global_batch, recompute=plan.recompute,
        zero=canonical_zero(framework, plan.zero), precision="fp8" if plan.fp8 else "bf16",
        recompute_layers=plan.recompute_layers if plan.recompute == "full" else 0,
        etp=plan.expert_tp if moe else 0,
    )  # fmt: skip


def mismatches(want: Semantics, got: Semantics | dict) -> list[str]:
    """`field: planned X, emitted Y` for each field that differs."""
    have = got if isinstance(got, dict) else got.as_dict()
    return [
        f"{key}: planned {value}, emitted {have.get(key)}"
        for key, value in want.as_dict().items()
        if have.get(key) != value
    ]
