"""Console page times with 10,000 jobs stored (issue 13 target: every page < 1 s).

Fills a fresh store with 10,000 finished jobs (spread over the last 24 h, each with a
runtime summary, so the overview's utilization series has work to do) and their events,
starts a real `argosy server` process on it, logs in through /login like a browser, and
times every page (full GET over HTTP, median of `--repeats`). The REST API's own job
list (`GET /api/v1/jobs?limit=50`) is timed in the same run as the peer: each page's
ratio to it says what rendering a page costs beyond reading a page of jobs.

    .venv/bin/python benchmarks/console.py [--jobs 10000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from argosy.cli.demo import server_process
from argosy.core.net import free_port
from argosy.server.store import Store

STATES = ("succeeded", "failed", "cancelled")


def fill(home: Path, num_jobs: int, seed: int = 0) -> str:
    """Store `num_jobs` finished jobs; returns the id of one to open its page."""
    rng = random.Random(seed)
    store = Store(f"sqlite:///{home}/argosy.db")
    now = time.time()
    job_id = ""
    for i in range(num_jobs):
        spec = {
            "name": f"job-{i:05d}",
            "queue": "default",
            "script": "/bin/true",
            "args": ["--steps", "100"],
            "nproc_per_node": rng.choice((1, 2)),
            "nnodes": 1,
        }
        row, _ = store.insert_job(spec, now=now - 86_400 + i * 86_400 / num_jobs)
        start = row["created_at"] + rng.uniform(1, 60)
        summary = {"effective_training_time": round(rng.uniform(0.5, 0.99), 3), "wall_s": 100.0}
        summary |= {"productive_s": 90.0, "lost_s": {}, "restarts": 0, "checkpoints": 3}
        store.update_job(
            row["id"],
            {
                "state": rng.choice(STATES),
                "attempts": 1,
                "started_at": start,
                "finished_at": start + rng.uniform(60, 3600),
                "summary": summary,
            },
            event=("succeeded", "attempt 1 exited 0"),
        )
        job_id = row["id"]
    store.close()
    return job_id


def timed(client: httpx.Client, path: str, repeats: int, **kw: object) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = client.get(path, **kw)
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="argosy-console-bench-"))
    t0 = time.perf_counter()
    job_id = fill(home, args.jobs)
    print(f"stored {args.jobs} jobs in {time.perf_counter() - t0:.1f} s ({home})")
    with server_process(home, free_port(), slots=2) as url, httpx.Client(base_url=url) as c:
        token = (home / "admin.token").read_text().strip()
        c.post("/login", data={"token": token})
        older = 5000 if args.jobs > 5000 else None
        pages = {
            "/ (overview, 24 h chart)": ("/?window_h=24", {}),
            "/queues": ("/queues", {}),
            "/jobs (newest 50)": ("/jobs", {}),
            "/jobs?state=failed": ("/jobs?state=failed", {}),
            "/jobs?name=job-0999 (prefix)": ("/jobs?name=job-0999", {}),
            "/jobs older page": (f"/jobs?before={older}" if older else "/jobs", {}),
            "/jobs/{id}": (f"/jobs/{job_id}", {}),
            "/nodes": ("/nodes", {}),
            "/services": ("/services", {}),
            "/sim": ("/sim", {}),
            "peer: GET /api/v1/jobs?limit=50": (
                "/api/v1/jobs?limit=50",
                {"headers": {"Authorization": f"Bearer {token}"}},
            ),
        }
        results = {name: timed(c, path, args.repeats, **kw) for name, (path, kw) in pages.items()}
    peer = statistics.median(results["peer: GET /api/v1/jobs?limit=50"])
    table = Table(title=f"console pages with {args.jobs} jobs stored ({args.repeats} repeats)")
    for col in ("page", "median ms", "max ms", "x API list", "< 1 s"):
        table.add_column(col, justify="left" if col == "page" else "right")
    for name, xs in results.items():
        med = statistics.median(xs)
        table.add_row(
            name,
            f"{med * 1000:.1f}",
            f"{max(xs) * 1000:.1f}",
            f"{med / peer:.2f}",
            "yes" if max(xs) < 1 else "NO",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
