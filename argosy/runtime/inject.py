"""Fault injection specs: `kind:key=value:...`, parsed and checked before anything starts.

    parse_injection("kill:rank=1:step=30")          -> Injection(kind="kill", rank=1, step=30)
    parse_injection("slow:rank=1:factor=2:from_step=10")
    parse_injection("exit:rank=0:at_s=120:code=1")  # trigger by seconds since launch

A trigger is `step=` (fire when the rank begins that step) or `at_s=` (fire at the first
step begun that many seconds after launch). Each injection fires once per run: the agent
drops fired injections when it restarts the group. A bad spec raises ArgosyError with the
expected form, which the CLI turns into exit code 2.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from argosy.core.errors import ArgosyError, UnknownNameError


@dataclass(frozen=True)
class InjectionKind:
    """The fields one kind of injection takes."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    form: str
    fault: str
    """The fault kind the watchdog should report: crash, hang, straggler or exit."""


KINDS: dict[str, InjectionKind] = {
    "kill": InjectionKind(("rank",), ("step", "at_s"), "kill:rank=R:step=S", "crash"),
    "hang": InjectionKind(("rank",), ("step", "at_s"), "hang:rank=R:step=S", "hang"),
    "exit": InjectionKind(("rank",), ("step", "at_s", "code"), "exit:rank=R:step=S:code=C", "exit"),
    "slow": InjectionKind(
        ("rank", "factor"), ("from_step", "at_s"), "slow:rank=R:factor=F:from_step=S", "straggler"
    ),
}
_INTS = {"rank", "step", "from_step", "code"}
_FLOATS = {"factor", "at_s"}


@dataclass(frozen=True)
class Injection:
    """One fault to inject into one rank."""

    kind: str
    rank: int
    step: int | None = None
    at_s: float | None = None
    factor: float = 1.0
    code: int = 1

    @property
    def fault(self) -> str:
        return KINDS[self.kind].fault

    def due(self, step: int, since_launch_s: float) -> bool:
        """Whether the injection fires (or, for slow, applies) at the start of `step`."""
        if self.step is not None and step < self.step:
            return False
        return not (self.at_s is not None and since_launch_s < self.at_s)

    def describe(self) -> str:
        trigger = f"step {self.step}" if self.step is not None else f"{self.at_s:g} s"
        return f"{self.kind} rank {self.rank} at {trigger}"


def _forms() -> str:
    return "; ".join(k.form for k in KINDS.values()) + " (or at_s=SECONDS instead of the step)"


def parse_injection(spec: str, world_size: int | None = None) -> Injection:
    """Parse one `--inject` value; ArgosyError with the expected forms when malformed."""
    head, *parts = spec.strip().split(":")
    if head.lower() not in KINDS:
        err = UnknownNameError("injection kind", head, KINDS)
        raise ArgosyError(f"--inject '{spec}': {err}; forms: {_forms()}")
    kind = KINDS[head.lower()]
    fields: dict[str, float | int] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in (*kind.required, *kind.optional):
            raise ArgosyError(f"--inject '{spec}': unexpected '{part}'; expected {kind.form}")
        fields[key] = _number(spec, key, value, kind.form)
    missing = [k for k in kind.required if k not in fields]
    if missing:
        raise ArgosyError(f"--inject '{spec}': missing {', '.join(missing)}; expected {kind.form}")
    if "from_step" in fields:
        fields["step"] = fields.pop("from_step")
    if "step" not in fields and "at_s" not in fields:
        raise ArgosyError(f"--inject '{spec}': needs a step or at_s trigger; expected {kind.form}")
    injection = Injection(kind=head.lower(), **fields)  # type: ignore[arg-type]
    _check_ranges(spec, injection, world_size, kind.form)
    return injection


def _number(spec: str, key: str, value: str, form: str) -> float | int:
    try:
        return int(value) if key in _INTS else float(value)
    except ValueError:
        kind = "an integer" if key in _INTS else "a number"
        raise ArgosyError(f"--inject '{spec}': {key} must be {kind}; expected {form}") from None


def _check_ranges(spec: str, inj: Injection, world_size: int | None, form: str) -> None:
    if inj.rank < 0 or (world_size is not None and inj.rank >= world_size):
        top = f" (world size {world_size})" if world_size is not None else ""
        raise ArgosyError(f"--inject '{spec}': rank {inj.rank} out of range{top}; expected {form}")
    if inj.step is not None and inj.step < 1:
        raise ArgosyError(f"--inject '{spec}': steps count from 1; expected {form}")
    if inj.at_s is not None and inj.at_s < 0:
        raise ArgosyError(f"--inject '{spec}': at_s must be >= 0; expected {form}")
    if inj.kind == "slow" and inj.factor <= 1.0:
        raise ArgosyError(
            f"--inject '{spec}': factor must be > 1, a slowdown (3: each step takes 3x as "
            f"long; --emulate-slow takes the speed instead, 1/3); expected {form}"
        )


def encode(injections: dict[int, Injection]) -> str:
    """The environment value that hands a rank its injections, keyed by run-wide index."""
    return json.dumps({str(i): asdict(inj) for i, inj in injections.items()})


def decode(text: str) -> dict[int, Injection]:
    return {int(i): Injection(**fields) for i, fields in json.loads(text or "{}").items()}
