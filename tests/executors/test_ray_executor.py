"""The Ray executor on a real two-node Ray cluster (head + worker by `ray start`): a gang
across both nodes as one placement group whose node ranks share one checkpoint store (a
torch DCP step written by all four ranks and committed once), and a worker node lost
mid-run: the attempt fails, the job resumes on the other node from its checkpoint, the
event log says why;
a node that joins the cluster later is seen by the running server and placed on. The
server answers at once while Ray waits for resources; every end of an attempt (success,
failure, cancel, a stop before Ray placed it) leaves no placement group or actor behind,
and a restarted server removes the ones nobody adopted.

One cluster for this module and test_ray_fake.py (Ray's start-up is the expensive part;
conftest.py); the node-loss tests kill nodes, so they run last, and start the worker again.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from ray_helpers import RayCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_helpers import TERMINAL, fast_config, job_body, wait_for  # noqa: E402

from argosy.server.app import create_app  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(ray_cluster: RayCluster) -> RayCluster:
    """The cluster shared with test_ray_fake.py's real harness (conftest.py)."""
    return ray_cluster


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server") / "home"


@pytest.fixture(scope="module")
def client(cluster: RayCluster, home: Path) -> Iterator[TestClient]:
    config = fast_config(home, executor="ray", ray_address=cluster.address, nodes_interval_s=0.5)
    with TestClient(create_app(config)) as c:
        c.headers["Authorization"] = "Bearer " + (home / "admin.token").read_text().strip()
        yield c


def test_inventory_has_both_nodes_with_their_chip_resources(client: TestClient) -> None:
    nodes = client.get("/api/v1/nodes").json()
    assert sorted((n["name"], n["chip"], n["devices"]) for n in nodes) == [
        ("head", "cpu", 2),
        ("worker", "cpu", 2),
    ]  # named by their `argosy.io/node` labels


def test_a_gang_spans_both_nodes_in_one_placement_group(client: TestClient, home: Path) -> None:
    body = job_body("gang", nproc_per_node=2, nnodes=2, args=["--steps", "3"])
    job = client.post("/api/v1/jobs", json=body).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded", done
    assert sorted(done["placement"]["nodes"].values()) == [2, 2]
    run = home / "runs" / job["id"]
    for node_dir in (run, run / "node1"):  # node rank 0 and 1 each ran their two ranks
        assert len((node_dir / "starts.txt").read_text().split("\n")) == 3
    assert_freed(job["id"], within_s=5)


STORE_SCRIPT = """\
import os
from pathlib import Path

from argosy.runtime import hooks

store = hooks.checkpoint_dir()
(store / f"rank{os.environ['RANK']}.txt").write_text(f"{store} {os.environ['GROUP_RANK']}")
"""


def test_every_node_rank_of_a_gang_checkpoints_into_the_job_s_one_store(
    client: TestClient, home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "store.py"
    script.write_text(STORE_SCRIPT)
    body = job_body("store", nproc_per_node=2, nnodes=2, args=[], script=str(script))
    job = client.post("/api/v1/jobs", json=body | {"workdir": str(tmp_path)}).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded", done
    run = home / "runs" / job["id"]
    store = run / "checkpoints"
    assert sorted(done["placement"]["nodes"].values()) == [2, 2]
    seen = sorted((store / f"rank{r}.txt").read_text() for r in range(4))
    assert seen == [f"{store} {node}" for node in (0, 0, 1, 1)]  # from both node ranks
    assert (run / "node1" / "events.jsonl").exists()  # node logs stay apart
    assert not any((store / ".nodes").iterdir())  # probes seen by node rank 0, then removed
    assert_freed(job["id"], within_s=5)


def test_a_torch_gang_commits_each_checkpoint_once_from_both_nodes(
    client: TestClient, home: Path
) -> None:
    """train_gpt.py on two nodes (2 ranks each): every rank writes its shard of the same
    DCP step directory and the two-phase commit spans the nodes, without a restart."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
    tiny = ["--steps", "4", "--ckpt-every", "2", "--dim", "16", "--layers", "1"]
    tiny += ["--heads", "1", "--batch", "2", "--block", "8"]
    body = job_body("dcp", nproc_per_node=2, nnodes=2, args=tiny, script=str(example))
    job = client.post("/api/v1/jobs", json=body).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=120)
    assert done["state"] == "succeeded", done
    run = home / "runs" / job["id"]
    from argosy.checkpoint.disk import committed_steps, read_manifest

    store = run / "checkpoints"
    assert committed_steps(store)[-1] == 4
    manifest = read_manifest(store / "step_000000000004")
    assert manifest["world_size"] == 4
    assert {f"__{r}_0.distcp" for r in range(4)} <= set(manifest["files"])  # both nodes
    for node_dir in (run, run / "node1"):
        summary = json.loads((node_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["restarts"] == 0, summary


def test_a_failed_job_leaves_nothing_in_ray(client: TestClient) -> None:
    body = job_body("fails", nproc_per_node=1, args=["--fail"], max_restarts=0)
    job = client.post("/api/v1/jobs", json=body).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=60)
    assert done["state"] == "failed", done
    assert_freed(job["id"], within_s=5)


def test_the_server_answers_while_ray_cannot_place_a_job_and_cancel_frees_it(
    client: TestClient,
) -> None:
    """Ray's chips are held outside argosy, so the job's placement group waits; the
    server still answers at once, and a cancel frees the group within seconds."""
    from ray.util import placement_group, remove_placement_group

    blocker = placement_group([{"chip:cpu": 2}, {"chip:cpu": 2}], strategy="STRICT_SPREAD")
    assert blocker.wait(30)
    try:
        body = job_body("waits", nproc_per_node=2)
        job = client.post("/api/v1/jobs", json=body).json()
        wait_for(client, job["id"], {"running"}, timeout_s=30)
        assert argosy_groups().get(f"argosy-{job['id']}-1") == "PENDING"
        worst = 0.0
        for _ in range(20):  # the control loop polls the waiting attempt meanwhile
            t0 = time.monotonic()
            assert client.get("/api/v1/health").status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.1)
        assert worst < 0.5, f"/api/v1/health took {worst:.2f} s while Ray waited"
        assert client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        done = wait_for(client, job["id"], TERMINAL, timeout_s=10)
        assert done["state"] == "cancelled", done
        assert_freed(job["id"], within_s=5)
    finally:
        remove_placement_group(blocker)


def test_an_unplaceable_request_never_blocks_the_executor(client: TestClient) -> None:
    """More chips than the node has: Ray waits forever, the executor's calls do not."""
    from argosy.executors.base import LaunchRequest
    from argosy.executors.ray import RayExecutor, RayOptions

    executor = RayExecutor(RayOptions(stop_grace_s=5))
    try:
        node = executor.inventory()[0]
        request = LaunchRequest(
            job_id="toolarge",
            attempt=1,
            script="x.py",
            args=(),
            nproc_per_node=1,
            run_dir=Path("/nonexistent"),
            nodes={node.name: node.devices + 1},
            chip=node.chip,
        )
        calls = [
            lambda: executor.start(request),
            *[executor.poll, executor.inventory] * 10,
            lambda: executor.stop("toolarge"),
        ]
        worst = 0.0
        for call in calls:
            t0 = time.monotonic()
            call()
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
        assert worst < 0.05, f"a call took {worst:.3f} s"
        deadline = time.monotonic() + 5
        while not (exits := executor.poll()):
            assert time.monotonic() < deadline, "the stop never ended the attempt"
            time.sleep(0.05)
        assert [(e.job_id, e.lost) for e in exits] == [("toolarge", True)], exits
        assert "placed" in exits[0].reason
        assert_freed("toolarge", within_s=5)
    finally:
        executor.close()


def test_a_restarted_server_removes_what_nobody_adopted(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """Leftovers of attempts the store does not know (a ghost group and actor) go at
    start-up."""
    import ray
    from ray.util import placement_group

    from argosy.executors.ray import NAMESPACE, NodeRunner

    placement_group([{"chip:cpu": 1}], name="argosy-ghost-1", lifetime="detached")
    runner = ray.remote(num_cpus=0)(NodeRunner)
    runner.options(name="argosy-ghost-1-0", namespace=NAMESPACE, lifetime="detached").remote()
    assert "argosy-ghost-1" in argosy_groups() and "argosy-ghost-1-0" in argosy_actors()
    config = fast_config(tmp_path / "home", executor="ray", ray_address=cluster.address)
    with TestClient(create_app(config)):
        assert_freed("ghost", within_s=10)


def test_a_launcher_dies_with_its_actor(cluster: RayCluster, tmp_path: Path) -> None:
    """No orphan outlives the actor that started it (on a worker host whose raylet dies,
    the actor goes with it)."""
    import ray

    from argosy.core.procs import signal_by_env
    from argosy.executors.local import JOB_ENV
    from argosy.executors.ray import NAMESPACE, NodeRunner

    runner = ray.remote(num_cpus=0)(NodeRunner).options(namespace=NAMESPACE).remote()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    log = str(tmp_path / "orphan.log")
    ray.get(runner.start.remote(sleeper, {JOB_ENV: "orphan"}, None, log), timeout=30)
    assert signal_by_env(JOB_ENV, "orphan", 0) == 1
    ray.kill(runner)
    deadline = time.monotonic() + 10
    while signal_by_env(JOB_ENV, "orphan", 0):
        assert time.monotonic() < deadline, "the launcher outlived its actor"
        time.sleep(0.1)


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only under root")
def test_under_root_a_gang_runs_as_its_queue_s_user_on_every_node(cluster: RayCluster) -> None:
    """A root server (jobs not allowed root) on Ray: each node rank runs as the queue's
    job user, the run directory on the shared storage is root's with that user's group,
    and the attempt's records root's, as with the local executor."""
    import pwd

    from argosy.executors.isolation import user_name_for
    from argosy.server.state_dir import run_dir_of

    root = Path(tempfile.mkdtemp(prefix="argosy-ray-users-", dir="/tmp"))
    os.chmod(root, 0o711)  # job users pass through to runs/ (no local fallback on Ray)
    (root / "queues.yaml").write_text("queues:\n  - name: org\n    children:\n      - name: t-a\n")
    config = fast_config(
        root / "home",
        executor="ray",
        ray_address=cluster.address,
        allow_root_jobs=False,
        queues_file=root / "queues.yaml",
    )
    from argosy.executors.ray_address import asks_for_token

    assert asks_for_token(cluster.address)  # the cluster asks for Ray's token: the server starts
    try:
        with TestClient(create_app(config)) as c:
            c.headers["Authorization"] = "Bearer " + (root / "home/admin.token").read_text().strip()
            body = job_body("users", nproc_per_node=2, nnodes=2, queue="t-a")
            job = c.post("/api/v1/jobs", json=body).json()
            done = wait_for(c, job["id"], TERMINAL, timeout_s=90)
            assert done["state"] == "succeeded", done
        user = pwd.getpwnam(user_name_for("argosy-job", "t-a"))
        run = run_dir_of(root / "home", job["id"])
        info = run.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, user.pw_gid, 0o1770)
        for node_dir in (run, run / "node1"):  # each node rank's files are the job user's
            assert (node_dir / "starts.txt").stat().st_uid == user.pw_uid
        records = run / "server" / "attempt1"
        assert (records.stat().st_uid, stat.S_IMODE(records.stat().st_mode)) == (0, 0o711)
        for i in (0, 1):
            assert (records / f"node{i}.log").stat().st_uid == user.pw_uid
    finally:
        shutil.rmtree(root, ignore_errors=True)


def argosy_groups() -> dict[str, str]:
    """Name -> state of every argosy placement group Ray has not removed."""
    from ray.util import placement_group_table

    table = placement_group_table().values()
    return {
        p["name"]: p["state"]
        for p in table
        if p["name"].startswith("argosy-") and p["state"] != "REMOVED"
    }


def argosy_actors() -> set[str]:
    from ray.util import list_named_actors

    return {a for a in list_named_actors() if a.startswith("argosy-")}


def assert_freed(job_id: str, within_s: float) -> None:
    """No placement group or actor of the job is left in Ray within `within_s`."""
    prefix = f"argosy-{job_id}-"
    deadline = time.monotonic() + within_s
    while True:
        left = [x for x in [*argosy_groups(), *argosy_actors()] if x.startswith(prefix)]
        if not left:
            return
        assert time.monotonic() < deadline, f"still in Ray after {within_s} s: {left}"
        time.sleep(0.1)


def test_a_lost_worker_node_fails_the_attempt_and_the_job_resumes(
    client: TestClient, cluster: RayCluster, home: Path
) -> None:
    head, worker = "head", "worker"  # the nodes' `argosy.io/node` labels
    client.post(f"/api/v1/nodes/{head}/cordon")  # the job must land on the worker
    body = job_body("lose", nproc_per_node=2, args=["--steps", "80", "--step-s", "0.1"])
    job = client.post("/api/v1/jobs", json=body | {"checkpoint_every": 2})
    job = job.json()
    running = wait_for(client, job["id"], {"running"}, timeout_s=60)
    assert next(iter(running["placement"]["nodes"])) == worker
    ckpt = home / "runs" / job["id"] / "ckpt.txt"
    deadline = time.monotonic() + 60
    while not (ckpt.exists() and int(ckpt.read_text()) >= 4):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cluster.kill_worker()
    lost = wait_for(
        client, job["id"], {"pending", "admitted", "running"} - {"running"} | TERMINAL, timeout_s=60
    )
    # the actor's death or Ray's verdict on its node, whichever the executor sees first
    why = lost["reason"]
    assert lost["attempts"] == 1 and ("died" in why or "is dead" in why), lost
    client.post(f"/api/v1/nodes/{head}/uncordon")
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded" and done["attempts"] == 2, done
    assert next(iter(done["placement"]["nodes"])) == head
    firsts = [
        int(line.split()[1])
        for line in (home / "runs" / job["id"] / "starts.txt").read_text().split("\n")
        if line
    ]
    assert firsts[:2] == [1, 1] and min(firsts[2:]) >= 5  # two ranks each time
    events = client.get("/api/v1/events", params={"limit": 500}).json()["items"]
    kinds = {(e["kind"], e["job_id"]) for e in events}
    assert ("attempt_lost", job["id"]) in kinds and ("node_lost", None) in kinds


def test_a_node_that_joins_later_is_seen_and_placed_on(
    client: TestClient, cluster: RayCluster
) -> None:
    before = {n["name"] for n in client.get("/api/v1/nodes").json()}
    cluster.add_worker()
    late = "late"  # its `argosy.io/node` label
    deadline = time.monotonic() + 60
    while late not in {n["name"] for n in client.get("/api/v1/nodes").json()}:
        assert time.monotonic() < deadline, "the joined node never appeared"
        time.sleep(0.25)
    nodes = client.get("/api/v1/nodes").json()
    joined = next(n for n in nodes if n["name"] == late)
    assert joined["up"] and joined["devices"] == 2 and joined["name"] not in before
    for name in before:  # the job must land on the new node
        client.post(f"/api/v1/nodes/{name}/cordon")
    job = client.post("/api/v1/jobs", json=job_body("late", nproc_per_node=2)).json()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=90)
    assert done["state"] == "succeeded", done
    assert done["placement"]["nodes"] == {joined["name"]: 2}
    events = client.get("/api/v1/events", params={"limit": 500}).json()["items"]
    assert any(e["kind"] == "node_joined" and late in e["message"] for e in events)


def test_a_gang_that_loses_a_node_restarts_whole_from_its_newest_commit(
    client: TestClient, cluster: RayCluster, home: Path
) -> None:
    """Kill-a-raylet end to end: a 2-node torch gang loses the node that joined later
    after a commit; the raylet of the node lost earlier comes back (same label); the whole
    gang starts again on both nodes and every rank resumes from a committed step."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
    # 30 steps of 0.2 s: the kill comes right after the step-6 commit, so the gang cannot
    # end before it, and the restarted gang trains the rest (60 steps only made that longer)
    tiny = ["--steps", "30", "--ckpt-every", "2", "--dim", "16", "--layers", "1"]
    tiny += ["--heads", "1", "--batch", "2", "--block", "8", "--step-sleep", "0.2"]
    for name in ("head", "worker"):  # the test before cordoned them
        client.post(f"/api/v1/nodes/{name}/uncordon")
    body = job_body("gang-loss", nproc_per_node=2, nnodes=2, args=tiny, script=str(example))
    job = client.post("/api/v1/jobs", json=body | {"max_restarts": 2}).json()
    running = wait_for(client, job["id"], {"running"}, timeout_s=60)
    assert sorted(running["placement"]["nodes"]) == ["head", "late"]
    from argosy.checkpoint.disk import committed_steps

    store = home / "runs" / job["id"] / "checkpoints"
    deadline = time.monotonic() + 90
    while not (store.exists() and committed_steps(store) and committed_steps(store)[-1] >= 6):
        assert time.monotonic() < deadline, "no commit before the kill"
        time.sleep(0.1)
    cluster.kill_late()
    committed_at_kill = committed_steps(store)[-1]
    cluster.restart_worker()
    done = wait_for(client, job["id"], TERMINAL, timeout_s=120)
    assert done["state"] == "succeeded" and done["attempts"] == 2, done
    assert sorted(done["placement"]["nodes"]) == ["head", "worker"]
    assert [row["node_rank"] for row in done["summary"]["nodes"]] == [0, 1]
    run = home / "runs" / job["id"]
    resumed = []
    for log in run.glob("**/logs/attempt0/rank*.log"):
        text = log.read_text()
        resumed += [int(x.split()[0]) for x in text.split("resumed from step ")[1:]]
    assert len(resumed) == 4 and len(set(resumed)) == 1, resumed  # every rank, one step
    assert resumed[0] >= committed_at_kill - 2  # a commit in flight may land after the kill
    events = client.get("/api/v1/events", params={"limit": 500}).json()["items"]
    lost = [e for e in events if e["kind"] == "attempt_lost" and e["job_id"] == job["id"]]
    why = lost[0]["message"] if lost else ""
    assert any(word in why for word in ("whole gang", "dead", "died")), lost
