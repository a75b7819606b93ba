"""Verdicts on vendor health signals (ECC, row remapping, XID, hardware slowdown).

The backend reports raw counters (`hardware.backends.signals`); the rules here decide.
One check per device and signal, named `<signal>.dev<k>`. The rules:

| signal          | degraded at | failed at | why                                           |
|-----------------|------------:|----------:|-----------------------------------------------|
| ecc_uncorrected |           - |         1 | uncorrectable memory error: data was lost      |
| ecc_corrected   |        1000 |         - | a storm of corrected errors precedes failures  |
| remap_pending   |           1 |         - | a row remap waits for a reset (drain and reset)|
| remap_failed    |           - |         1 | remapping ran out of spare rows: needs service |
| xid_critical    |           - |         1 | the driver reported a critical XID event       |
| hw_slowdown     |           1 |         - | thermal or power brake: the device is slow     |
| power_capped    |         0.1 |         - | limit 10%+ below default: it cannot run full   |
| thermal_throttle|           1 |         - | clocks held down for temperature: it is slow   |

The check's detail carries the vendor's reason (which slowdown, the limit against the
default in watts, the temperature).
"""

from __future__ import annotations

from collections.abc import Sequence

from argosy.hardware.backends.signals import VendorSignal
from argosy.health.verdict import CheckResult, Verdict, not_applicable

RULES: dict[str, tuple[float | None, float | None]] = {
    "ecc_uncorrected": (None, 1),
    "ecc_corrected": (1000, None),
    "remap_pending": (1, None),
    "remap_failed": (None, 1),
    "xid_critical": (None, 1),
    "hw_slowdown": (1, None),
    "power_capped": (0.1, None),
    "thermal_throttle": (1, None),
}
"""signal -> (degraded at or above, failed at or above); None: never."""


def signal_verdict(signal: VendorSignal) -> Verdict:
    """The verdict of one raw counter under `RULES`."""
    degraded_at, failed_at = RULES[signal.name]
    if failed_at is not None and signal.value >= failed_at:
        return Verdict.FAILED
    if degraded_at is not None and signal.value >= degraded_at:
        return Verdict.DEGRADED
    return Verdict.HEALTHY


def signal_checks(signals: Sequence[VendorSignal] | None, reason: str = "") -> list[CheckResult]:
    """One check per signal; a single not-applicable check when none could be read."""
    if not signals:
        return [not_applicable("vendor_signals", "count", reason or "no signals reported")]
    return [
        CheckResult(
            name=f"{signal.name}.dev{signal.device_index}",
            value=signal.value,
            unit="share" if signal.name == "power_capped" else "count",
            expected=0.0,
            verdict=signal_verdict(signal),
            detail=_rule_text(signal),
        )
        for signal in signals
    ]


def _rule_text(signal: VendorSignal) -> str:
    degraded_at, failed_at = RULES[signal.name]
    rule = ", ".join(
        f"{word} at {limit:g}"
        for word, limit in (("degraded", degraded_at), ("failed", failed_at))
        if limit is not None
    )
    return f"{signal.detail}; {rule}" if signal.detail else rule
