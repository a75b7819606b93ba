"""`argosy demo`: the platform in one command, on this machine.

    argosy demo                   # server on a temp home, a training job with a fault, report
    argosy demo --keep            # ... then keep the server and console up until Ctrl-C

It starts `argosy server` (SQLite in a temporary ARGOSY_HOME, the local executor, CPU
slots), prints the console URL and the admin token, submits a small training job
(`examples/train_gpt.py`, CPU, gloo) and, unless `--no-service`, an inference service;
then it injects a fault from outside, as a failing machine would: once the job has
passed `--fault-step`, rank 0 is killed with SIGKILL. The runtime detects it, restarts
the ranks and resumes from the last checkpoint; the demo shows the steps as they go and
ends with the job's goodput report (effective training time and where time was lost).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from argosy.cli.client import Client
from argosy.cli.common import console, err_console
from argosy.cli.paths import writable_dir
from argosy.core.errors import ArgosyError
from argosy.core.net import DEFAULT_PORT, free_port
from argosy.core.procs import env_holds
from argosy.executors.local import JOB_ENV

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
TERMINAL = ("succeeded", "failed", "cancelled")
WATCH_EVERY_S = 0.05
"""How often the demo reads the run's event log: the fault lands on the step it names."""
ASK_EVERY_S = 0.5
"""How often it asks the server for the job's state."""
SERVICE_WAIT_S = 120.0
"""How long the demo waits, once the job ended, for its service's model to load."""
DEMO_PROMPT = "What is a GPU good for?"


def demo(
    keep: bool = typer.Option(False, "--keep", help="Keep the server up until Ctrl-C."),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", min=0, max=65535, help="Port (0: a free one)."
    ),
    steps: int = typer.Option(40, "--steps", min=4, help="Training steps of the job."),
    fault_step: int = typer.Option(
        12, "--fault-step", min=0, help="Kill rank 0 after this step (0: no fault)."
    ),
    ranks: int = typer.Option(1, "--ranks", min=1, max=8, help="Ranks of the job (CPU slots)."),
    service: bool = typer.Option(
        True, "--service/--no-service", help="Also start an inference service."
    ),
    home: Path | None = typer.Option(
        None, "--home", help="State directory (default: a new temp dir)."
    ),
    timeout_s: float = typer.Option(900.0, "--timeout-s", min=10, help="Give up after this long."),
) -> None:
    """Start a server, run a training job through an injected fault, print its goodput."""
    if not EXAMPLE.exists():
        raise ArgosyError(f"argosy demo runs from a source checkout: {EXAMPLE} not found")
    if fault_step >= steps:
        raise ArgosyError(f"--fault-step {fault_step} must be below --steps {steps}")
    home = writable_dir(home, "--home") if home else Path(tempfile.mkdtemp(prefix="argosy-demo-"))
    port = port or free_port()
    slots = ranks + (1 if service else 0)
    with server_process(home, port, slots) as url:
        token = (home / "admin.token").read_text().strip()
        console.print(f"console:     [bold]{url}/[/]  (log in with the admin token)")
        console.print(f"admin token: {token}")
        console.print(f"home:        {home}")
        client = Client(url, token)
        if service:
            _submit_service(client)
        job = _submit_job(client, steps, ranks)
        console.print(f"job:         {url}/jobs/{job['id']}")
        run_dir = _wait_run_dir(home, job["id"])
        final = _follow(client, job["id"], run_dir, steps, fault_step, timeout_s)
        _report(final)
        if service:
            _service_line(client)
        if not keep:
            console.print("the server stops now; `argosy demo --keep` keeps the console up")
        else:
            console.print(f"\nthe console stays up at {url}/ ; Ctrl-C stops the server")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        if service:
            _delete_services(client)
    if final["state"] != "succeeded":
        raise typer.Exit(1)


def _wait_run_dir(home: Path, job_id: str, timeout_s: float = 60.0) -> Path:
    """The job's run directory once the server has made it."""
    from argosy.server.state_dir import run_dir_of

    deadline = time.monotonic() + timeout_s
    while not (found := run_dir_of(home, job_id)).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@contextlib.contextmanager
def server_process(home: Path, port: int, slots: int, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """`argosy server` as a child process (`extra`: more of its flags); stopped (SIGTERM,
    then SIGKILL) on exit."""
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "server.log").open("ab")
    cmd = [sys.executable, "-m", "argosy", "server", "--home", str(home), "--port", str(port)]
    cmd += ["--slots", str(slots), *extra]
    env = os.environ | {"ARGOSY_HOME": str(home)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, home)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen, home: Path, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    with console.status("starting the server ..."):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = (home / "server.log").read_text(errors="replace")[-2000:]
                raise ArgosyError(f"the server exited ({proc.returncode}):\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/api/v1/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
    raise ArgosyError(f"the server did not answer at {url} within {timeout_s:.0f} s")


def _submit_job(client: Client, steps: int, ranks: int) -> dict:
    body = {
        "name": "demo-gpt",
        "script": str(EXAMPLE),
        "args": ["--steps", str(steps), "--ckpt-every", "5", "--step-sleep", "0.2"],
        "nproc_per_node": ranks,
        "workdir": str(EXAMPLE.parents[1]),
    }
    return client.call("POST", "/jobs", json=body)


def _submit_service(client: Client) -> None:
    body = {"name": "demo-chat", "replicas": 1, "threads": 1}
    try:
        client.call("POST", "/services", json=body)
    except ArgosyError as err:
        err_console.print(f"[yellow]no inference service:[/] {escape(str(err))}", emoji=False)


def _follow(
    client: Client, job_id: str, run_dir: Path, steps: int, fault_step: int, timeout_s: float
) -> dict:
    """Show steps and runtime events until the job ends; inject the fault on the way."""
    injector = FaultInjector(run_dir, job_id, rank=0, after_step=fault_step) if fault_step else None
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("pending", total=steps)
        job, asked_s = client.call("GET", f"/jobs/{job_id}"), time.monotonic()
        while True:
            step, events = read_progress(run_dir / "events.jsonl")
            for line in (_describe(e) for e in events):
                if line and line not in seen:
                    seen.add(line)
                    bar.console.print(line)
            if injector is not None and injector.maybe_fire(step):
                bar.console.print(f"[red]injected:[/] SIGKILL to rank 0 after step {step}")
            if time.monotonic() - asked_s >= ASK_EVERY_S:
                job, asked_s = client.call("GET", f"/jobs/{job_id}"), time.monotonic()
            bar.update(task, completed=step, description=job["state"])
            if job["state"] in TERMINAL:
                return job
            if time.monotonic() > deadline:
                raise ArgosyError(f"job {job_id} still {job['state']} after {timeout_s:.0f} s")
            time.sleep(WATCH_EVERY_S)


def read_progress(path: Path) -> tuple[int, list[dict]]:
    """(last step, runtime events other than steps) of a run's event log so far."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return 0, []
    step, events = 0, []
    for line in lines:
        with contextlib.suppress(ValueError):
            e = json.loads(line)
            if e.get("event") == "step":
                step = int(e.get("step", step))
            else:
                events.append(e)
    return step, events


class FaultInjector:
    """Kills one rank of a running job once (SIGKILL), after it passed `after_step`: the
    fault a dying process or machine causes, injected from outside the job. Only a process
    that carries the job's id in its environment is killed (a spawn event's pid may be a
    stranger's by now)."""

    def __init__(self, run_dir: Path, job_id: str, rank: int, after_step: int) -> None:
        self.run_dir, self.job_id, self.rank, self.after_step = run_dir, job_id, rank, after_step
        self.fired = False

    def maybe_fire(self, step: int) -> bool:
        if self.fired or step < self.after_step:
            return False
        pid = self._rank_pid()
        if pid is None or not env_holds(pid, JOB_ENV, self.job_id):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.fired = True
        return self.fired

    def _rank_pid(self) -> int | None:
        _, events = read_progress(self.run_dir / "events.jsonl")
        spawns = [e for e in events if e.get("event") == "spawn" and e.get("pids")]
        return int(spawns[-1]["pids"][self.rank]) if spawns else None


def _describe(e: dict) -> str:
    kind = e.get("event")
    if kind == "fault":
        return f"[red]fault:[/] {e.get('detail', '')}; {e.get('action', '')}"
    if kind == "restart":
        return f"[yellow]restart[/] into attempt {e.get('attempt')}"
    if kind == "resume" and e.get("step"):
        return f"[green]resumed[/] attempt {e.get('attempt')} from step {e.get('step')}"
    return ""


def _report(job: dict) -> None:
    s = job.get("summary") or {}
    console.print(
        f"\njob {job['id']} {job['state']}" + (f": {job['reason']}" if job["reason"] else "")
    )
    if "effective_training_time" not in s:
        console.print("no goodput summary (the run wrote none)")
        return
    table = Table(title="goodput", show_header=True)
    table.add_column("")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    wall = s["wall_s"] or 1.0
    table.add_row("wall", f"{s['wall_s']:.1f}", "100%")
    table.add_row("productive", f"{s['productive_s']:.1f}", f"{s['productive_s'] / wall:.1%}")
    for cause, secs in s.get("lost_s", {}).items():
        table.add_row(f"lost: {cause}", f"{secs:.1f}", f"{secs / wall:.1%}")
    console.print(table)
    console.print(
        f"effective training time {s['effective_training_time']:.1%}; "
        f"{s.get('restarts', 0)} restart(s), {len(s.get('faults', []))} fault(s), "
        f"{s.get('checkpoints', 0)} checkpoint(s). {s.get('how', '')}"
    )


def _service_line(client: Client, timeout_s: float = SERVICE_WAIT_S) -> None:
    """Each service once it is ready (waiting up to `timeout_s` for its model to load),
    with one chat reply from it; or its state and last event when it is not."""
    deadline = time.monotonic() + timeout_s
    with console.status("waiting for the inference service to answer ..."):
        while True:
            items = client.call("GET", "/services").get("items", [])
            ready = all(svc.get("endpoints") for svc in items)
            if ready or time.monotonic() > deadline or any(s["state"] == "failed" for s in items):
                break
            time.sleep(0.5)
    for svc in items:
        where = ", ".join(svc.get("endpoints", [])) or "no endpoint ready yet"
        console.print(f"service {svc['name']}: {svc['state']} ({where})", highlight=False)
        if svc.get("endpoints"):
            _ask_once(client, svc)
        else:
            _last_event(client, svc)
        console.print(
            f"  its API key, while the server runs: argosy service {svc['id']} --key",
            highlight=False,
        )


def _ask_once(client: Client, svc: dict) -> None:
    """One greedy chat request to the service's first endpoint (its `/v1` base URL), its
    reply and speed shown."""
    import httpx

    key = client.call("GET", f"/services/{svc['id']}/key")["api_key"]
    url, headers = svc["endpoints"][0], {"Authorization": f"Bearer {key}"}
    try:
        model = httpx.get(f"{url}/models", headers=headers, timeout=30).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": DEMO_PROMPT}],
                "max_tokens": 24, "temperature": 0}  # fmt: skip
        began = time.monotonic()
        r = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=120)
        r.raise_for_status()
        took, answer = time.monotonic() - began, r.json()
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as err:
        console.print(f"  [yellow]asking it failed:[/] {escape(str(err))}", emoji=False)
        return
    reply = " ".join(answer["choices"][0]["message"]["content"].split())
    tokens = answer.get("usage", {}).get("completion_tokens", 0)
    console.print(f"  asked {DEMO_PROMPT!r}; it answered in {took:.1f} s ({tokens} tokens):",
                  highlight=False)  # fmt: skip
    console.print(f"  {escape(reply)!r}", highlight=False, emoji=False)


def _last_event(client: Client, svc: dict) -> None:
    items = client.call("GET", f"/services/{svc['id']}/events?limit=500")["items"]
    if items:
        last = f"{items[-1]['kind']} {items[-1]['detail']}"
        console.print(f"  last event: {escape(last)}", highlight=False, emoji=False)


def _delete_services(client: Client, timeout_s: float = 60.0) -> None:
    """Delete the demo's services and wait until their replicas stopped (a server keeps
    replicas running across its own restarts, so stopping the server alone leaves them)."""
    items = client.call("GET", "/services").get("items", [])
    for svc in items:
        client.call("DELETE", f"/services/{svc['id']}")
    deadline = time.monotonic() + timeout_s
    for svc in items:
        while time.monotonic() < deadline:
            state = client.call("GET", f"/services/{svc['id']}")["state"]
            if state in ("deleted", "failed"):
                break
            time.sleep(0.2)
