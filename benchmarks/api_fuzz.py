"""API fuzzing benchmark: schemathesis against /api/v1 of a fresh `argosy server` for a
fixed time, stateless and stateful, as the admin and as a queue token (issue 31).

    .venv/bin/python benchmarks/api_fuzz.py                # 5 minutes
    .venv/bin/python benchmarks/api_fuzz.py --minutes 1 --out runs/api-fuzz

Alternates two kinds of rounds until the time is up:

1. Stateless: every operation of the OpenAPI schema, with data valid by the schema and
   data that breaks it, as the admin and as team-a's token (`--examples` cases each).
2. Stateful: `--scenarios` sequences of up to `--steps` calls that follow the links
   schemathesis infers (create a job, read it, cancel it, list its events; create a
   token, revoke it; ...), alternating the two tokens.

Every answer is checked: not a 5xx, status code, content type, headers and body as the
schema declares. The server's queues have a ceiling of 0 devices, so nothing the fuzzer
gets accepted ever starts (tests/server/fuzz_helpers.py). Prints the operations
covered, requests sent, answers by status, 5xx, schema violations (one example each),
tracebacks in the server's log and jobs that ran, and writes them to
`<out>/summary.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))
from fuzz_helpers import (  # noqa: E402
    QUEUE_OF,
    Tally,
    fuzz_operation,
    nothing_ran,
    operations,
    run_stateful,
    start_fuzz_server,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="How long to fuzz.")
    p.add_argument(
        "--examples", type=int, default=5, help="Stateless cases per operation, mode, token."
    )
    p.add_argument("--scenarios", type=int, default=30, help="Stateful scenarios per round.")
    p.add_argument("--steps", type=int, default=10, help="Most calls per scenario.")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "api-fuzz")
    args = p.parse_args()

    import hypothesis.reporting
    import schemathesis

    root = Path(tempfile.mkdtemp(prefix="argosy-fuzz-"))
    server, principals = start_fuzz_server(root)
    tally = Tally()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    rounds = {"stateless": 0, "stateful": 0}
    scenarios = 0
    try:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        ops = operations(schema)
        with hypothesis.reporting.with_reporter(lambda _text: None):  # seeds of Unsatisfiable
            while time.monotonic() < deadline:
                for operation in ops:
                    for mode in schemathesis.GenerationMode:
                        for who in QUEUE_OF:
                            if time.monotonic() < deadline:
                                fuzz_operation(
                                    operation, mode, who, principals, tally, args.examples
                                )
                rounds["stateless"] += 1
                if time.monotonic() < deadline:
                    scenarios += run_stateful(schema, principals, tally, args.scenarios, args.steps)
                    rounds["stateful"] += 1
                progress(started, tally, len(ops))
        elapsed_s = time.monotonic() - started
        log = (server.home.parent / f"server-{server.port}.log").read_text(errors="replace")
        ran = nothing_ran(server)
    finally:
        server.kill()
    summary = tally.summary(len(ops)) | {
        "seconds": round(elapsed_s, 1),
        "requests_per_s": round(tally.requests / elapsed_s, 1),
        "rounds": rounds,
        "stateful_scenarios": scenarios,
        "stateful_restarts": tally.restarts,
        "tracebacks_in_server_log": log.count("Traceback"),
        "jobs_that_ran": len(ran),
        "uncovered": sorted({o.label for o in ops} - set(tally.by_operation)),
        "requests_by_operation": dict(sorted(tally.by_operation.items())),
        "examples": tally.examples,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "schemathesis": schemathesis.__version__ if hasattr(schemathesis, "__version__") else "",
    }
    report(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out / 'summary.json'}")
    bad = summary["server_errors"] or summary["schema_violations"] or summary["jobs_that_ran"]
    sys.exit(1 if bad or summary["tracebacks_in_server_log"] else 0)


def progress(started: float, tally: Tally, total: int) -> None:
    print(
        f"{time.monotonic() - started:6.0f}s  {tally.requests} requests, "
        f"{len(tally.by_operation)}/{total} operations, {len(tally.server_errors)} 5xx, "
        f"{sum(tally.violations.values())} failed checks",
        flush=True,
    )


def report(s: dict) -> None:
    print()
    print(f"operations covered   {s['operations_covered']}/{s['operations_total']}")
    print(f"requests sent        {s['requests']} in {s['seconds']} s ({s['requests_per_s']}/s)")
    print(f"rounds               {s['rounds']} ({s['stateful_scenarios']} stateful scenarios)")
    print(f"answers by status    {s['statuses']}")
    print(f"5xx                  {s['server_errors']}")
    print(f"schema violations    {s['schema_violations']}  {s['violations_by_check']}")
    print(f"server tracebacks    {s['tracebacks_in_server_log']}")
    print(f"jobs that ran        {s['jobs_that_ran']}")
    if s["uncovered"]:
        print(f"not reached          {', '.join(s['uncovered'])}")
    for title, example in s["examples"].items():
        print(f"\n--- {title}\n{example[:2000]}")


if __name__ == "__main__":
    main()
