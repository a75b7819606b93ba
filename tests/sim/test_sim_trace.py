"""Trace files: every malformed line is reported with file:line and field."""

import json

import pytest

from argosy.core.errors import ConfigError
from argosy.sim.trace import TraceRecord, read_trace, write_trace

GOOD = {"id": "j1", "submit_s": 5.0, "kind": "eval", "queue": "eval", "priority": 1,
        "chips": ["h100"], "devices": 8, "work_device_s": 80.0}  # fmt: skip


def lines_file(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({**GOOD, "devices": 0}, "devices"),
        ({**GOOD, "kind": "batch"}, "kind"),
        ({**GOOD, "devcies": 8}, "devcies"),
        ({k: v for k, v in GOOD.items() if k != "queue"}, "queue"),
        ({**GOOD, "min_devices": 4, "max_devices": 2, "devices": None}, None),
        ("{not json", None),
    ],
    ids=["zero-devices", "unknown-kind", "typo-key", "missing-queue", "min-above-max", "not-json"],
)
def test_malformed_lines_stop_with_file_line_and_field(tmp_path, bad, field):
    path = lines_file(tmp_path, [GOOD, bad])
    with pytest.raises(ConfigError) as err:
        read_trace(path)
    assert err.value.line == 2 and str(path) in str(err.value)
    if field:
        assert err.value.field == field


def test_skip_mode_keeps_good_lines_and_lists_the_bad_ones(tmp_path):
    path = lines_file(tmp_path, [GOOD, {**GOOD, "id": "j2", "devices": -1}, {**GOOD, "id": "j3"},
                                 {**GOOD, "id": "j3"}])  # fmt: skip
    trace = read_trace(path, on_error="skip")
    assert [r.id for r in trace.records] == ["j1", "j3"]
    assert len(trace.skipped) == 2
    assert ":2 field 'devices'" in trace.skipped[0] and "duplicate id" in trace.skipped[1]


def test_write_is_atomic_and_round_trips(tmp_path):
    records = [TraceRecord.model_validate(GOOD)]
    path = tmp_path / "t.jsonl"
    write_trace(records, path)
    assert read_trace(path).records == records
    assert not list(tmp_path.glob("*.tmp"))
