"""One checkpoint store per job: `argosy launch --ckpt-dir` hands every rank the same
ARGOSY_CKPT_DIR, and a multi-node launch whose nodes do not see one store fails at once.

The two-node launches run two real launchers on this host with a tiny script (no torch,
no rendezvous): with one store both proceed; with a store per node, node rank 0 exits 2
within the probe timeout, naming the node it cannot see and what to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import REPO

from argosy.core.net import free_port
from argosy.runtime import hooks, shared_store
from argosy.runtime.shared_store import StoreNotSharedError

SCRIPT = """\
import os
from pathlib import Path

from argosy.runtime import hooks

store = hooks.checkpoint_dir()
store.mkdir(parents=True, exist_ok=True)
(store / f"rank{os.environ['RANK']}.txt").write_text(os.environ["ARGOSY_CKPT_DIR"])
"""


def _launch(script: Path, run: Path, store: Path, node_rank: int, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "argosy", "--set", "runtime.store_probe_timeout_s=3"]
    command += ["launch", "--quiet", "--nproc-per-node", "1", "--nnodes", "2"]
    command += ["--node-rank", str(node_rank), "--master-port", str(port)]
    command += ["--run-dir", str(run), "--ckpt-dir", str(store), str(script)]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _two_nodes(tmp_path: Path, stores: tuple[Path, Path]) -> list[tuple[int, str, float]]:
    script = tmp_path / "store.py"
    script.write_text(SCRIPT)
    port = free_port()
    t0 = time.monotonic()
    procs = [_launch(script, tmp_path / f"node{i}", stores[i], i, port) for i in (0, 1)]
    out = []
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        out.append((proc.returncode, err, time.monotonic() - t0))
    return out


def test_two_nodes_with_one_store_both_proceed_and_ranks_get_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (node0, err0, _), (node1, err1, _) = _two_nodes(tmp_path, (store, store))
    assert (node0, node1) == (0, 0), err0 + err1
    assert (store / "rank0.txt").read_text() == str(store)
    assert (store / "rank1.txt").read_text() == str(store)
    assert not (store / shared_store.PROBES).exists() or not any(
        (store / shared_store.PROBES).iterdir()
    )  # node rank 0 removed the probes once it saw them all


def test_two_nodes_with_a_store_each_fail_at_once_saying_why(tmp_path: Path) -> None:
    stores = (tmp_path / "store0", tmp_path / "store1")
    (node0, err0, took), _ = _two_nodes(tmp_path, stores)
    assert node0 == 2, err0
    message = " ".join(err0.split())
    assert f"node rank 0 cannot see node 1's probe in {stores[0]}" in message
    assert "every node must mount the same checkpoint store (a shared filesystem)" in message
    assert "--ckpt-dir" in message
    assert took < 20, f"node rank 0 took {took:.1f} s to fail"
    assert not (stores[0] / "rank0.txt").exists()  # no rank of node 0 ever started
    assert not (tmp_path / "node0" / "events.jsonl").exists()


def test_node_rank_0_waits_for_late_nodes_and_names_every_missing_one(tmp_path: Path) -> None:
    gang = shared_store.gang_id({}, "10.0.0.1", 29500)
    assert gang == "10.0.0.1-29500"
    assert shared_store.gang_id({shared_store.ENV_GANG: "argosy-j/1"}, "x", None) == "argosy-j_1"
    shared_store.write_probe(tmp_path, gang, 0)
    with pytest.raises(StoreNotSharedError, match="the probes of nodes 1, 2 in"):
        shared_store.wait_for_nodes(tmp_path, gang, 3, timeout_s=0.2, poll_s=0.05)
    shared_store.write_probe(tmp_path, gang, 1)
    shared_store.write_probe(tmp_path, gang, 2)
    shared_store.wait_for_nodes(tmp_path, gang, 3, timeout_s=0.2)
    assert not (tmp_path / shared_store.PROBES / gang).exists()


def test_checkpoint_dir_is_the_store_else_the_run_dir_s_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(hooks.ENV_CKPT_DIR, raising=False)
    monkeypatch.delenv(hooks.ENV_RUN_DIR, raising=False)
    assert hooks.checkpoint_dir("runs/x") == Path("runs/x/checkpoints")
    monkeypatch.setenv(hooks.ENV_RUN_DIR, str(tmp_path / "run"))
    assert hooks.checkpoint_dir("runs/x") == tmp_path / "run" / "checkpoints"
    monkeypatch.setenv(hooks.ENV_CKPT_DIR, str(tmp_path / "store"))
    assert hooks.checkpoint_dir("runs/x") == tmp_path / "store"


SIZES_SCRIPT = """\
import os
from pathlib import Path

from argosy.runtime import hooks

store = hooks.checkpoint_dir()
store.mkdir(parents=True, exist_ok=True)
line = f"{os.environ['RANK']} {os.environ['LOCAL_RANK']} {os.environ['WORLD_SIZE']}"
(store / f"rank{os.environ['RANK']}.txt").write_text(line)
"""


def test_nodes_of_different_sizes_get_one_rank_numbering(tmp_path: Path) -> None:
    """A packed placement: node 0 runs 2 ranks, node 1 one; ranks 0-2 over a world of 3."""
    script, store, port = tmp_path / "sizes.py", tmp_path / "store", free_port()
    script.write_text(SIZES_SCRIPT)
    procs = []
    for node, nproc in ((0, 2), (1, 1)):
        command = [sys.executable, "-m", "argosy", "launch", "--quiet", "--nnodes", "2"]
        command += ["--nproc-per-node", str(nproc), "--node-sizes", "2,1"]
        command += ["--node-rank", str(node), "--master-port", str(port)]
        command += ["--run-dir", str(tmp_path / f"node{node}"), "--ckpt-dir", str(store)]
        procs.append(subprocess.Popen([*command, str(script)], cwd=REPO, stderr=subprocess.PIPE))
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    got = sorted((store / f"rank{r}.txt").read_text() for r in range(3))
    assert got == ["0 0 3", "1 1 3", "2 0 3"]


@pytest.mark.parametrize(
    ("sizes", "nproc", "want"),
    [("2,x", 2, "list of counts"), ("2", 2, "needs 2 positive"), ("1,1", 2, "gives node rank 0")],
)
def test_bad_node_sizes_exit_2_naming_the_option(tmp_path: Path, sizes, nproc, want) -> None:
    command = [sys.executable, "-m", "argosy", "launch", "--nnodes", "2", "--node-sizes", sizes]
    command += ["--nproc-per-node", str(nproc), "--run-dir", str(tmp_path), "x.py"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and want in done.stderr and "Traceback" not in done.stderr
