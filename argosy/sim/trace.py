"""The trace format: JSONL, one workload a line (schema in docs/sim_trace.md).

    {"id": "j42", "submit_s": 3600.0, "kind": "eval", "queue": "eval", "priority": 200,
     "chips": ["h100-sxm"], "devices": 8, "work_device_s": 2880.0,
     "checkpoint_interval_s": 0}

Elastic training gives `min_devices`/`max_devices` instead of `devices`. An inference
service (`kind: infer`) gives `devices` = peak replicas (one device each), a daily
`load_profile` (fractions of the peak, one per `profile_step_s`) and `slo_target`.

`read_trace` reports every malformed line as file:line and field; with
`on_error="stop"` the first one raises, with `"skip"` bad lines are left out and listed
in the result, never dropped silently. `write_trace` writes to a temporary file and
renames it, so a crash never leaves a half-written trace that reads as good.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from argosy.core.errors import ConfigError

Kind = Literal["train", "finetune", "eval", "debug", "infer"]


class TraceRecord(BaseModel):
    """One workload of a trace."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    id: str = Field(min_length=1)
    """Unique workload id."""
    submit_s: float = Field(ge=0)
    """Submission time, seconds from the start of the trace."""
    kind: Kind
    """train, finetune, eval, debug or infer."""
    queue: str = Field(min_length=1)
    """Leaf queue the workload is submitted to."""
    priority: int = 0
    """Higher runs first and may preempt lower."""
    chips: list[str] = Field(min_length=1)
    """Accepted chip types, catalog names or aliases."""
    devices: int | None = Field(default=None, gt=0)
    """Fixed gang size (for infer: peak replicas, one device each)."""
    min_devices: int | None = Field(default=None, gt=0)
    """Elastic jobs: fewest devices it runs on."""
    max_devices: int | None = Field(default=None, gt=0)
    """Elastic jobs: most devices it can use."""
    work_device_s: float = Field(default=0.0, ge=0)
    """Work in device-seconds on the reference chip (h100-sxm); not used for infer."""
    checkpoint_interval_s: float = Field(default=0.0, ge=0)
    """Seconds between checkpoints; 0 = none (an interruption loses everything)."""
    load_profile: list[float] | None = None
    """Infer: load per step over a day, fraction of peak in [0, 1]."""
    profile_step_s: float = Field(default=600.0, gt=0)
    """Infer: seconds per load-profile step."""
    slo_target: float = Field(default=0.99, gt=0, le=1)
    """Infer: share of time the service must have the replicas its load needs."""

    @model_validator(mode="after")
    def _shape(self) -> TraceRecord:
        fixed = self.devices is not None
        ranged = self.min_devices is not None or self.max_devices is not None
        if fixed == ranged:
            raise ValueError("give either devices or min_devices and max_devices")
        if ranged and (self.min_devices is None or self.max_devices is None):
            raise ValueError("an elastic job needs both min_devices and max_devices")
        if ranged and self.min_devices > self.max_devices:
            raise ValueError("min_devices is above max_devices")
        if self.kind == "infer":
            if not fixed or not self.load_profile:
                raise ValueError("an infer service needs devices and load_profile")
            if not all(0 <= x <= 1 for x in self.load_profile):
                raise ValueError("load_profile values must lie in [0, 1]")
        elif self.work_device_s <= 0:
            raise ValueError("work_device_s must be positive")
        return self

    @property
    def device_range(self) -> tuple[int, int]:
        if self.devices is not None:
            return self.devices, self.devices
        return int(self.min_devices), int(self.max_devices)


@dataclass
class Trace:
    """Records in submission order, and the lines that were skipped (with why)."""

    records: list[TraceRecord]
    skipped: list[str] = field(default_factory=list)


def read_trace(path: str | Path, *, on_error: Literal["stop", "skip"] = "stop") -> Trace:
    """Parse a JSONL trace; malformed lines raise (stop) or are listed (skip)."""
    path = Path(path)
    try:
        handle = path.open("rb")  # decoded line by line, so a bad byte names its line
    except OSError as err:
        raise ConfigError(f"cannot read trace: {err.strerror}", source=str(path)) from err
    records, skipped, seen = [], [], set()
    with handle:
        for number, raw in enumerate(_lines(handle, path), start=1):
            if not raw.strip():
                continue
            try:
                record = _parse(_text(raw, str(path), number), str(path), number)
                if record.id in seen:
                    raise ConfigError(
                        f"duplicate id '{record.id}'", source=str(path), line=number, field="id"
                    )
                seen.add(record.id)
                records.append(record)
            except ConfigError as err:
                if on_error == "stop":
                    raise
                skipped.append(str(err))
    records.sort(key=lambda r: r.submit_s)
    return Trace(records, skipped)


def _lines(handle, path: Path):  # noqa: ANN202  # yields bytes
    try:
        yield from handle
    except OSError as err:  # a directory, a device gone away
        raise ConfigError(f"cannot read trace: {err.strerror}", source=str(path)) from err


def _text(raw: bytes, source: str, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = f"not UTF-8 text (byte {err.start + 1}); a trace is JSONL, one object a line"
        raise ConfigError(msg, source=source, line=number) from err


def _parse(line: str, source: str, number: int) -> TraceRecord:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"not JSON: {err.msg}", source=source, line=number) from err
    if not isinstance(data, dict):
        msg = f"a trace line is one JSON object, not {type(data).__name__}"
        raise ConfigError(msg, source=source, line=number)
    try:
        return TraceRecord.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise ConfigError(msg, source=source, line=number, field=where) from err


def write_trace(records: list[TraceRecord], path: str | Path) -> None:
    """Write records as JSONL atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        for record in records:
            out.write(record.model_dump_json(exclude_none=True, exclude_defaults=False))
            out.write("\n")
    os.replace(tmp, path)
