"""A job that leaves a process behind: out of its session, its environment cleared, so
that nothing but its cgroup says whose it is. It writes that process's pid to
`$HOME/lingering.pid` (HOME is the run directory), then waits for `$HOME/release` and
exits 0."""

import os
import subprocess
import time
from pathlib import Path

home = Path(os.environ["HOME"])
pid_file = home / "lingering.pid"
quit_job = 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300'
subprocess.Popen(["setsid", "env", "-i", "/bin/sh", "-c", quit_job, str(pid_file)])
while not (home / "release").exists():
    time.sleep(0.05)
print("released", flush=True)
