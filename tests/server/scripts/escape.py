"""A hostile job for the tenant-isolation test: it tries every way we know to reach a
token of the control plane or another tenant's data, writes what each try gave to
`<run dir>/report.json`, and then plants links where the server reads job files.

    escape.py --other-run RUN_DIR_OF_ANOTHER_TENANT [--hold-s S]

Each probe records "denied" (an error), "nothing" (read, no secret in it) or "LEAK"
(a token or the other tenant's marker came back), with what it read (cut short).
`--hold` makes it the victim instead: it writes a secret into its run directory and
waits, so the attacker has something to look for.
"""

import argparse
import glob
import json
import os
import re
import secrets
import time
from pathlib import Path

TOKEN = re.compile(rb"argosy_[A-Za-z0-9_.\-]{16,}")
MARKER = b"tenant-b-secret-"

p = argparse.ArgumentParser()
p.add_argument("--other-run", default="")
p.add_argument("--hold-s", type=float, default=0.0)
args = p.parse_args()
run = Path(os.environ["ARGOSY_RUN_DIR"])

if args.hold_s:
    (run / "secret.txt").write_bytes(MARKER + secrets.token_hex(8).encode())
    (run / "ready").write_text("")
    deadline = time.monotonic() + args.hold_s
    while time.monotonic() < deadline and not (run / "release").exists():
        time.sleep(0.1)
    raise SystemExit(0)

report: dict[str, dict[str, str]] = {}


def probe(name: str, read) -> None:  # noqa: ANN001
    try:
        data = read()
    except Exception as err:  # noqa: BLE001 - every failure is a refusal here
        report[name] = {"result": "denied", "detail": type(err).__name__}
        return
    data = data if isinstance(data, bytes) else str(data).encode()
    leak = TOKEN.search(data) or MARKER in data
    report[name] = {"result": "LEAK" if leak else "nothing", "detail": data[:200].decode("latin1")}


def read_bytes(path: str | Path) -> bytes:
    return Path(path).read_bytes()


home = run.parent.parent  # <home>/runs/<job id>
probe("env", lambda: "\n".join(f"{k}={v}" for k, v in os.environ.items()))
for name in ("admin.token", "argosy.db", "argosy.db-wal", "logs/access.log", "server.log"):
    probe(f"home/{name}", lambda n=name: read_bytes(home / n))
probe("home listing", lambda: "\n".join(os.listdir(home)))
probe("runs listing", lambda: "\n".join(os.listdir(run.parent)))
for guess in ("/var/lib/argosy/admin.token", "/root/.argosy/admin.token"):
    probe(guess, lambda g=guess: read_bytes(g))
probe("attempt records", lambda: "\n".join(os.listdir(run / "server")))
if args.other_run:
    other = Path(args.other_run)
    probe("other tenant listing", lambda: "\n".join(os.listdir(other)))
    probe("other tenant secret", lambda: read_bytes(other / "secret.txt"))
    probe("other tenant plant", lambda: (other / "planted").write_text("x"))


def proc_environs() -> bytes:
    found = b""
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            data = read_bytes(path)
        except OSError:
            continue
        if TOKEN.search(data) or MARKER in data or b"ARGOSY_HOME" in data:
            found += path.encode() + b": " + data[:300] + b"\n"
    if found:
        return found + b" argosy_proc_environ_leak_marker"
    raise PermissionError("no other process's environment readable")


def signals_others() -> bytes:
    me = os.getuid()
    hit = []
    for path in glob.glob("/proc/[0-9]*"):
        pid = int(path.rsplit("/", 1)[1])
        try:
            if os.stat(path).st_uid == me:
                continue
            os.kill(pid, 0)
        except OSError:
            continue
        hit.append(pid)
    if hit:
        return f"argosy_could_signal_{hit}".encode()
    raise PermissionError("no foreign process may be signalled")


probe("/proc environ", proc_environs)
probe("signal foreign processes", signals_others)


def shm_heads() -> bytes:
    out = b""
    for path in glob.glob("/dev/shm/*") + glob.glob("/dev/shm/*/*"):  # slot folders too
        if os.path.isfile(path) and os.stat(path).st_uid != os.getuid():
            with open(path, "rb") as f:
                out += f.read(1 << 20)
    return out


probe("other users' shared memory", shm_heads)
probe("hard link to the admin token", lambda: os.link(home / "admin.token", run / "hard"))
(run / "report.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report), flush=True)

# Plant links where the server reads: this rank's log, and a fake summary.
for log in glob.glob(str(run / "logs" / "attempt*" / "rank0.log")):
    tmp = Path(log + ".lnk")
    tmp.symlink_to(home / "admin.token")
    os.replace(tmp, log)
(run / "node_health.json").unlink(missing_ok=True)
(run / "node_health.json").symlink_to(home / "admin.token")
