"""The simulator report page's tables of idle device-time and of reservations, built from
whatever a report holds: a report from before those keys shows no such rows."""

from __future__ import annotations

from argosy.server.console.simreports import backfill_rows, idle_rows

NEW = {
    "policy": "argosy",
    "idle": {"all": {"allocated": 0.96, "blocked_whole": 0.021}},
    "backfill": {
        "reserved": 12,
        "reserved_started": 11,
        "late_p50_s": 0.0,
        "estimates": {"median_abs_error": 0.081},
    },  # fmt: skip
    "resize_churn": {"resizes_per_job_day": 2.5, "stall_share": 0.004},
}
OLD = {"policy": "quota", "idle": {"all": {"allocated": 0.98}}}


def _row(rows, name):
    return next(r["values"] for r in rows if r["name"] == name)


def test_rows_carry_one_value_per_run_and_none_where_a_run_lacks_it():
    idle = idle_rows([NEW, OLD])
    assert _row(idle, "allocated") == [0.96, 0.98]
    assert _row(idle, "blocked whole") == [0.021, None]
    assert "no work" not in [r["name"] for r in idle]  # in no run: no row
    rows = backfill_rows([NEW, OLD])
    assert _row(rows, "workloads reserved") == [12.0, None]
    assert _row(rows, "estimate error, median") == [0.081, None]
    assert _row(rows, "resizes per elastic job-day") == [2.5, None]


def test_a_report_without_the_new_keys_has_no_backfill_rows():
    assert backfill_rows([OLD]) == []
    assert backfill_rows([{"policy": "x", "backfill": {"reserved": True}}]) == []  # no bools
