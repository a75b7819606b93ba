"""Warm standby: a process with torch imported runs the script it is handed, as a cold one would."""

import os
import sys
from pathlib import Path

from argosy.runtime import warm
from argosy.runtime.group import base_env, can_use_standby

SCRIPT = """
import os, sys
print("rank", os.environ["RANK"], "argv", sys.argv[1:], "main", __name__)
print("torch preloaded", "torch" in sys.modules, file=sys.stderr)
sys.exit(int(os.environ["CODE"]))
"""


def test_standby_runs_the_script_with_the_rank_env_log_and_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = warm.start_standby(base_env())
    env = {"RANK": "3", "CODE": "7", "PATH": os.environ["PATH"]}
    log = tmp_path / "rank3.log"
    assert warm.assign(proc, env=env, argv=[str(script), "--x", "1"], cwd=str(tmp_path), log=log)
    assert proc.wait(timeout=120) == 7
    text = log.read_text()
    assert "rank 3 argv ['--x', '1'] main __main__" in text
    assert "torch preloaded True" in text


def test_a_standby_that_died_is_refused(tmp_path: Path) -> None:
    proc = warm.start_standby(base_env())
    proc.kill()
    proc.wait()
    assert not warm.assign(proc, env={}, argv=["x.py"], cwd=str(tmp_path), log=tmp_path / "l")


def test_only_python_scripts_of_this_interpreter_use_standbys() -> None:
    assert can_use_standby([sys.executable, "train.py", "--steps", "3"])
    assert not can_use_standby(["/bin/echo", "hi"])
    assert not can_use_standby([sys.executable, "-m", "module"])
