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


# -- CUDA's context in the standby (a GPU restart is mostly CUDA's own start) -------------
FAKE_WARMED = (
    "import sys; from argosy.runtime import warm; "
    "warm.warm_cuda = lambda device: device is not None; sys.exit(warm.main())"
)


def _standby_as_if_warmed(env: dict[str, str]):
    """A standby whose CUDA start is taken as done (this host has no GPU)."""
    import subprocess

    return subprocess.Popen(
        [sys.executable, "-c", FAKE_WARMED],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _run(proc, tmp_path: Path, visible: str | None) -> str:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {"RANK": "0", "CODE": "0", "PATH": os.environ["PATH"]}
    env |= {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if visible is not None:
        env[warm.VISIBLE] = visible
    log = tmp_path / "rank0.log"
    assert warm.assign(proc, env=env, argv=[str(script)], cwd=str(tmp_path), log=log)
    assert proc.wait(timeout=120) == 0
    return log.read_text()


def test_a_warmed_standby_runs_the_script_in_place_when_the_devices_are_the_same(tmp_path):
    env = base_env() | {warm.ENV_CUDA: "0", warm.VISIBLE: "0,1"}
    assert "torch preloaded True" in _run(_standby_as_if_warmed(env), tmp_path, "0,1")


def test_a_warmed_standby_starts_fresh_when_the_rank_sees_other_devices(tmp_path):
    """Its context would be for the devices it saw: the script runs in a new interpreter
    (with the rank's environment, log and exit code, like a cold start)."""
    env = base_env() | {warm.ENV_CUDA: "0", warm.VISIBLE: "0,1"}
    text = _run(_standby_as_if_warmed(env), tmp_path, "1")
    assert "rank 0 argv [] main __main__" in text
    assert "torch preloaded False" in text


def test_without_a_gpu_a_standby_told_to_warm_cuda_still_runs_the_script(tmp_path):
    env = base_env() | {warm.ENV_CUDA: "0"}
    assert not warm.warm_cuda("0") or os.path.exists("/dev/nvidia0")
    assert "torch preloaded True" in _run(warm.start_standby(env), tmp_path, None)


def test_the_agent_warms_each_standby_on_its_rank_s_device(monkeypatch):
    from types import SimpleNamespace

    import numpy as np

    from argosy.runtime.agent import Agent
    from argosy.runtime.board import ROW, Slot
    from argosy.runtime.config import RuntimeConfig

    started: list[dict[str, str]] = []
    monkeypatch.setattr(warm, "start_standby", lambda env: started.append(env) or env)
    snap = np.zeros((6, ROW))
    snap[4, Slot.CUDA_DEVICE] = 3  # rank 4 (local 0 here) works on cuda:2
    snap[5, Slot.CUDA_DEVICE] = 0  # rank 5 has not started CUDA
    agent = SimpleNamespace(
        config=RuntimeConfig(),
        spec=SimpleNamespace(
            command=[sys.executable, "t.py"], nproc_per_node=2, first_rank=4, run_id="r-7"
        ),
        standby=[],
    )
    Agent._start_standby(agent, snap)
    assert [env.get(warm.ENV_CUDA) for env in started] == ["2", None]
    assert {env["ARGOSY_CKPT_JOB"] for env in started} == {"r-7"}  # found at the run's end
    started.clear()
    agent.config = RuntimeConfig(warm_cuda=False)  # a job that needs every byte
    Agent._start_standby(agent, snap)
    assert [env.get(warm.ENV_CUDA) for env in started] == [None, None]


def test_a_rank_says_which_cuda_device_it_works_on(monkeypatch):
    from argosy.hardware.backends import cuda
    from argosy.runtime.board import Slot
    from argosy.runtime.hooks import Runtime

    rt = Runtime(env={})
    rt.restored(0)
    assert rt._row.get(Slot.CUDA_DEVICE) == 0  # no CUDA started in this process
    monkeypatch.setattr(cuda, "current_device", lambda: 2)
    rt.restored(0)
    assert rt._row.get(Slot.CUDA_DEVICE) == 3


PREWARMED = """
from argosy.checkpoint import standby
print("persisters waiting", standby.waiting(), "alive", standby._WAITING[0].poll() is None)
"""


def test_a_standby_told_first_starts_its_rank_s_persister_ahead(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(PREWARMED)
    proc = warm.start_standby(base_env())
    assert warm.prewarm_persister(proc) and warm.prewarm_persister(proc)  # twice: one
    log = tmp_path / "rank0.log"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    assert warm.assign(proc, env=env, argv=[str(script)], cwd=str(tmp_path), log=log)
    assert proc.wait(timeout=120) == 0
    assert "persisters waiting 1 alive True" in log.read_text()


def test_the_agent_asks_for_persisters_once_the_attempt_checkpointed(monkeypatch) -> None:
    from types import SimpleNamespace

    import numpy as np

    from argosy.runtime.agent import Agent
    from argosy.runtime.board import ROW, Slot

    asked: list[object] = []
    monkeypatch.setattr(warm, "prewarm_persister", lambda proc: asked.append(proc) or True)
    agent = SimpleNamespace(
        spec=SimpleNamespace(nproc_per_node=2, first_rank=0),
        standby=["a", "b"],
        _persisters_asked=False,
    )
    snap = np.zeros((2, ROW))
    Agent._prewarm_persisters(agent, snap)
    assert asked == [] and not agent._persisters_asked  # no checkpoint yet: no persisters
    snap[1, Slot.CKPT_COUNT] = 1
    Agent._prewarm_persisters(agent, snap)
    assert asked == ["a", "b"] and agent._persisters_asked
