"""How long taking in one exit holds the server's event loop: what the job left parsed on
the loop vs parsed ahead in a worker thread (`argosy.server.read_ahead`), in one run.

    .venv/bin/python benchmarks/server_exit_read.py                 # about 20 s
    .venv/bin/python benchmarks/server_exit_read.py --steps 200000 --rounds 5

A real control loop (`Control`, SQLite store) over an in-memory executor runs one job; its
launcher "dies" with `summary.json` still the running placeholder and an event log of
`--steps` steps (200,000 steps: 15.5 MB), so taking in the exit summarizes the log. A
probe coroutine on the same loop sleeps 1 ms at a time and records the longest gap
between its wake-ups: how long any request would have waited. The peer is the same loop
with the read-ahead off (the parse on the loop, as before). Rounds alternate the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from argosy.executors.base import NodeInfo  # noqa: E402
from argosy.executors.fake import FakeExecutor  # noqa: E402
from argosy.server.config import ServerConfig  # noqa: E402
from argosy.server.control import Control  # noqa: E402
from argosy.server.spec import JobSpec  # noqa: E402
from argosy.server.store import Store  # noqa: E402


def _event_log(steps: int) -> str:
    lines = [json.dumps({"event": "spawn", "t": 0.1, "attempt": 0})]
    lines += [
        json.dumps({"event": "step", "t": 1 + 0.1 * k, "attempt": 0, "step": k + 1, "loss": 2.0})
        for k in range(steps)
    ]
    return "\n".join(lines) + "\n"


async def _longest_gap(stop: asyncio.Event) -> float:
    gap, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    return gap


async def _take_in(ctl: Control) -> float:
    stop = asyncio.Event()
    probe = asyncio.ensure_future(_longest_gap(stop))
    await asyncio.sleep(0.05)
    await ctl._step_in_parts()
    await asyncio.sleep(0.05)
    stop.set()
    return await probe


def one_round(log: str, ahead: bool) -> tuple[float, bool]:
    """(the loop's longest hold in s, whether the attempt got its figures from the log)."""
    with tempfile.TemporaryDirectory() as home:
        config = ServerConfig(home=Path(home), min_cycle_gap_s=0.0, allow_root_jobs=True)
        store = Store(config.database_url)
        fake = FakeExecutor([NodeInfo("n0", "cpu", 1)])
        ctl = Control(config, store, fake)
        ctl.recover()
        job_id = ctl.submit(JobSpec(name="j", script="s.py"), None, "")[0]["id"]
        ctl.step()
        run_dir = ctl.run_dir(job_id)
        (run_dir / "summary.json").write_text('{"status": "running"}')
        (run_dir / "events.jsonl").write_text(log)
        later = time.time_ns() + 10**6
        for name in ("summary.json", "events.jsonl"):
            os.utime(run_dir / name, ns=(later, later))
        fake.finish(job_id, 137)
        if not ahead:
            ctl._reader_of = lambda e: None  # type: ignore[method-assign]
        hold = asyncio.run(_take_in(ctl))
        summary = ctl.job(job_id)["summary"] or {}
        ctl.services.close()
        store.close()
        return hold, bool(summary.get("from_events"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    log = _event_log(args.steps)
    print(f"event log of {args.steps} steps: {len(log) / 1e6:.1f} MB", flush=True)
    holds: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for ahead in (False, True):
            hold, used = one_round(log, ahead)
            assert used, "the attempt's figures did not come from its log"
            holds[ahead].append(hold)
            name = "read ahead" if ahead else "on the loop"
            print(f"round {r + 1}: {name:11s} longest hold {hold * 1000:7.1f} ms", flush=True)
    inline, ahead_ = statistics.median(holds[False]), statistics.median(holds[True])
    print(f"\n| exit of a {len(log) / 1e6:.1f} MB event log | longest loop hold, median |")
    print("|---|---|")
    print(f"| parsed on the loop (before) | {inline * 1000:.0f} ms |")
    print(f"| parsed ahead in a thread | {ahead_ * 1000:.0f} ms |")
    print(f"| ratio | {ahead_ / inline:.3f} |")


if __name__ == "__main__":
    main()
