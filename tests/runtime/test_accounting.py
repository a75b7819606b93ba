"""Runtime accounting a user can trust: restarts as the events record them, one run per
launch in a reused run directory, console lines per fault and restart, `--tee`, paths that
cannot be written, a launcher killed with SIGKILL. Real launcher and rank processes; the
scripts are tiny (no torch) so each launch takes about a second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import REPO, argosy, summary

from argosy.runtime.board import default_board_path
from argosy.runtime.events import read_events

SCRIPT = """\
import os, sys
print(f"hello from rank {os.environ['RANK']} attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}")
print(f"tag {sys.argv[2]}", end="")   # a last line without its newline
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(SCRIPT)
    return path


def launch(run: Path, script: Path, *extra: str, code: int = 0, tag: str = "a", nproc: int = 1):  # noqa: ANN201
    args = ["launch", "--quiet", "--nproc-per-node", str(nproc), "--run-dir", str(run), *extra]
    return argosy(*args, str(script), str(code), tag, timeout=120)


@pytest.mark.parametrize("budget", [0, 1, 3], ids=lambda b: f"max_restarts={b}")
def test_restarts_reported_are_the_restarts_in_the_events(
    tmp_path: Path, script: Path, budget: int
) -> None:
    run = tmp_path / "run"
    done = launch(run, script, "--max-restarts", str(budget), code=3)
    assert done.returncode == 1, done.stderr
    events = read_events(run / "events.jsonl")
    want_restarts = sum(1 for e in events if e["event"] == "restart")
    s = summary(run)
    assert s["restarts"] == want_restarts == budget
    assert s["attempts"] == budget + 1 and s["cause"]["kind"] == "exit"
    assert f"{budget} restart(s)" in done.stdout
    # one console line per fault and per restart, as the agent saw them
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("[argosy]")]
    assert sum("fault: rank 0 exited with code 3" in ln for ln in lines) == budget + 1
    assert sum(" restart " in f" {ln} " and " of " in ln for ln in lines) == budget
    assert any(f"giving up after {budget} restart(s)" in ln for ln in lines)
    health = json.loads((run / "node_health.json").read_text())
    assert health["evidence"] == [] and health["record"]["state"] == "healthy"  # the script's fault


def test_repeated_crashes_count_against_the_node(tmp_path: Path) -> None:
    crasher = tmp_path / "crash.py"
    crasher.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run = tmp_path / "run"
    done = argosy(
        *("launch", "--quiet", "--nproc-per-node", "1", "--max-restarts", "2"),
        *("--run-dir", str(run), str(crasher)),
    )
    assert done.returncode == 1, done.stderr
    health = json.loads((run / "node_health.json").read_text())
    assert [e["kind"] for e in health["evidence"]] == ["fault"] * 3
    assert [e["rank"] for e in health["evidence"]] == [0, 0, 0]
    assert health["record"]["state"] == "cordoned" and not health["record"]["in_service"]
    (change,) = health["transitions"]
    assert (change["before"], change["after"]) == ("healthy", "cordoned")
    assert summary(run)["node_health"]["state"] == "cordoned"


def test_the_default_budget_of_three_reports_three_restarts(tmp_path: Path, script: Path) -> None:
    run = tmp_path / "run"
    launch(run, script, code=3)
    events = read_events(run / "events.jsonl")
    assert summary(run)["restarts"] == 3 == sum(e["event"] == "restart" for e in events)


def test_a_second_launch_into_a_run_dir_keeps_the_first_in_its_history(
    tmp_path: Path, script: Path
) -> None:
    run = tmp_path / "run"
    assert launch(run, script, "--max-restarts", "1", code=3, tag="first").returncode == 1
    assert launch(run, script, tag="second").returncode == 0
    assert summary(run)["status"] == "completed" and summary(run)["restarts"] == 0
    assert "tag second" in (run / "logs" / "attempt0" / "rank0.log").read_text()
    assert not (run / "logs" / "attempt1").exists()  # the first run's attempt 1 moved away
    (earlier,) = sorted((run / "history").iterdir())
    assert "tag first" in (earlier / "logs" / "attempt0" / "rank0.log").read_text()
    assert json.loads((earlier / "summary.json").read_text())["restarts"] == 1
    shown = argosy("runs", "show", "--json", str(run))
    data = json.loads(shown.stdout)
    assert data["status"] == "completed"
    assert [r["status"] for r in data["earlier_runs"]] == ["failed"]
    table = argosy("runs", "show", "--no-plot", str(run), columns=200)
    assert table.returncode == 0 and "earlier runs" in table.stdout


def test_tee_prefixes_every_rank_line(tmp_path: Path, script: Path) -> None:
    done = launch(tmp_path / "run", script, "--tee", nproc=2, tag="x")
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank{rank}]: hello from rank {rank} attempt 0" in done.stdout
        assert f"[rank{rank}]: tag x" in done.stdout  # the line without a newline too


def test_runs_show_after_a_straggler_warning(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    events = [
        {"event": "start", "t": 0.0, "run_id": "r1"},
        {"event": "spawn", "attempt": 0, "t": 0.1},
        {"event": "resume", "attempt": 0, "step": 0, "t": 1.0},
        *[
            {"event": "step", "attempt": 0, "step": s, "loss": 1.0 / s, "t": 1.0 + s}
            for s in (1, 2)
        ],
        {
            "event": "fault",
            "kind": "straggler",
            "rank": 1,
            "attempt": 0,
            "action": "warn",
            "detail": "rank 1 computes 2.00x slower than its peers",
            "injected_at_s": None,
            "detected_at_s": 2.5,
            "slowdown": 2.0,
            "t": 2.5,
        },
        {"event": "end", "status": "completed", "t": 3.5},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    done = argosy("runs", "show", str(run), columns=200)
    assert done.returncode == 0, done.stderr
    assert "straggler" in done.stdout and "warn" in done.stdout
    assert (run / "timeline.png").stat().st_size > 0


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "--nproc-per-node", "1", "--run-dir", "{file}/sub", "{script}"],
        ["runs", "show", "{run}"],
    ],
    ids=["launch --run-dir under a file", "runs show where timeline.png is a directory"],
)
def test_paths_that_cannot_be_written_exit_2_naming_them(
    tmp_path: Path, script: Path, args: list[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    run = tmp_path / "run"
    (run / "timeline.png").mkdir(parents=True)
    (run / "events.jsonl").write_text(json.dumps({"event": "start", "t": 0.0}) + "\n")
    filled = [a.format(file=blocker, script=script, run=run) for a in args]
    done = argosy(*filled, columns=200)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert ("--run-dir" if args[0] == "launch" else "--plot") in done.stderr


def test_a_launcher_killed_hard_leaves_a_run_that_reads_as_interrupted_and_no_board(
    tmp_path: Path,
) -> None:
    proc, run, sleeper = _launch_a_sleeper(tmp_path)
    events_path = run / "events.jsonl"
    start = read_events(events_path)[0]
    spawn = next(e for e in read_events(events_path) if e["event"] == "spawn")
    board = default_board_path(start["run_id"], owner_pid=proc.pid)
    assert board.exists()
    busy = argosy("launch", "--nproc-per-node", "1", "--run-dir", str(run), str(sleeper))
    assert busy.returncode == 2 and "in use by a running launcher" in busy.stderr
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in spawn["pids"]:  # the orphaned rank: ours to stop
        os.killpg(pid, signal.SIGKILL)
    assert summary(run)["status"] == "running"  # what the launcher left: never a stale summary
    shown = json.loads(argosy("runs", "show", "--json", str(run)).stdout)
    assert shown["status"] == "interrupted"
    quick = tmp_path / "quick.py"
    quick.write_text("pass\n")
    other = tmp_path / "other"
    assert launch(other, quick).returncode == 0
    assert not board.exists()  # reaped by the next launch: its owner is dead


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _launch_a_sleeper(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """`argosy launch` of one rank that sleeps a minute, once its rank was spawned:
    (launcher process, run dir, script)."""
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "argosy", "launch", "--quiet", "--nproc-per-node", "1"]
    proc = subprocess.Popen(
        [*cmd, "--run-dir", str(run), str(sleeper)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_ignore_sigint,  # as a shell's background job: the launcher must still stop
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and '"spawn"' not in _text(run / "events.jsonl"):
        time.sleep(0.1)
    return proc, run, sleeper


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_a_stopped_launcher_leaves_an_interrupted_summary_and_nothing_running(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc, run, _ = _launch_a_sleeper(tmp_path)
    events_path = run / "events.jsonl"
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 130
    s = summary(run)
    assert s["status"] == "interrupted" and s["cause"]["kind"] == "interrupted"
    events = read_events(events_path)
    spawn = next(e for e in events if e["event"] == "spawn")
    with pytest.raises(ProcessLookupError):
        os.kill(spawn["pids"][0], 0)
    board = default_board_path(events[0]["run_id"], owner_pid=proc.pid)
    assert not board.exists()


def test_garbled_and_over_nested_event_lines_are_skipped() -> None:
    from argosy.runtime.events import parse_events

    text = "\n".join(["{not json", "[" * 100_000 + "]" * 100_000, '{"event": "start"}', "[1]"])
    assert parse_events(text) == [{"event": "start"}]
