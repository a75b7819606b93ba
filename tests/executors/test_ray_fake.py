"""The Ray executor over a fake Ray (fake_ray.py), one tick at a time: stable node names
(a node that dies and rejoins under a new Ray id is the same node, and work placed on it
goes to the new raylet), Ray's own GPU resources, and a state machine over starts, node
losses and rejoins, exits, stops and server restarts. A contract test runs one scenario
on the fake and on a real two-raylet Ray cluster (ray_helpers.py), so the fake keeps to
what Ray does.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
from fake_ray import CPU, FakeRay, fake_executor, names, request, settle
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from ray_helpers import RayCluster

from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo
from argosy.executors.ray import (
    NAMESPACE,
    NodeRunner,
    RayExecutor,
    RayOptions,
    attempt_tag,
)
from argosy.runtime.shared_store import ENV_GANG

# ---- the contract: one scenario on the fake and on real Ray ---------------------------

WAIT_FOR_FLAG = """\
import os, pathlib, sys, time
rank = os.readlink("/proc/self/fd/1").rsplit("node", 1)[1].split(".")[0]
flag = pathlib.Path(sys.argv[1]) / f"{os.environ[sys.argv[2]]}-{rank}"
(flag.parent / (flag.name + ".up")).touch()
while not flag.exists():
    time.sleep(0.05)
sys.exit(int(flag.read_text()))
"""
"""A node rank that says it is up, waits for its flag file, and exits the code in it (its
rank read off its log's name, its attempt off the gang id)."""


class Harness(Protocol):
    """A Ray cluster with nodes `head` and `worker` (two `chip:cpu` each)."""

    def executor(self) -> RayExecutor: ...
    def running(self, tag: str, rank: int) -> bool: ...
    def exit_rank(self, tag: str, rank: int, code: int) -> None: ...
    def pause(self) -> None: ...
    def leftovers(self, prefix: str) -> list[str]: ...
    def ghost(self) -> None: ...
    def kill_worker(self) -> None: ...
    def restart_worker(self) -> None: ...


class FakeHarness:
    def __init__(self, tmp: Path) -> None:
        self.ray = FakeRay()
        self.ray.add_node("head", CPU)
        self.ray.add_node("worker", CPU)

    def executor(self) -> RayExecutor:
        return fake_executor(self.ray)

    def running(self, tag: str, rank: int) -> bool:
        runner = self.ray.runner(f"{tag}-{rank}")
        return runner is not None and runner.running

    def exit_rank(self, tag: str, rank: int, code: int) -> None:
        assert self.ray.exit_rank(tag, rank, code)

    def pause(self) -> None:
        self.ray.now += 0.3

    def leftovers(self, prefix: str) -> list[str]:
        left = [*self.ray.live_groups(), *self.ray.live_actors()]
        return [x for x in left if x.startswith(prefix)]

    def ghost(self) -> None:
        make_ghost(self.ray)

    def kill_worker(self) -> None:
        self.ray.kill_node("worker")

    def restart_worker(self) -> None:
        self.ray.rejoin("worker")


class RealHarness:
    def __init__(self, cluster: RayCluster, flags: Path) -> None:
        self.cluster, self.flags = cluster, flags

    def executor(self) -> RayExecutor:
        return RayExecutor(
            RayOptions(address=self.cluster.address, stop_grace_s=5), background=False
        )

    def running(self, tag: str, rank: int) -> bool:
        return (self.flags / f"{tag}-{rank}.up").exists()

    def exit_rank(self, tag: str, rank: int, code: int) -> None:
        (self.flags / f"{tag}-{rank}").write_text(str(code))

    def pause(self) -> None:
        time.sleep(0.05)

    def leftovers(self, prefix: str) -> list[str]:
        import ray

        groups = [
            p["name"] for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"
        ]
        actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        return [x for x in [*groups, *actors] if x.startswith(prefix)]

    def ghost(self) -> None:
        import ray

        make_ghost(ray)

    def kill_worker(self) -> None:
        self.cluster.kill_worker()

    def restart_worker(self) -> None:
        self.cluster.restart_worker()


def make_ghost(ray: Any) -> None:
    """What an earlier server left: a group and an actor no attempt of this one owns."""
    ray.util.placement_group([{"chip:cpu": 1}], name="argosy-ghost-1", lifetime="detached")
    runner = ray.remote(num_cpus=0)(NodeRunner)
    runner.options(name="argosy-ghost-1-0", namespace=NAMESPACE, lifetime="detached").remote()


@pytest.fixture(scope="module")
def real_cluster(ray_cluster: RayCluster) -> RayCluster:
    """The cluster shared with test_ray_executor.py (conftest.py)."""
    return ray_cluster


@pytest.fixture(
    params=["fake", pytest.param("real", marks=[pytest.mark.slow, pytest.mark.integration])]
)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if request.param == "fake":
        return FakeHarness(tmp_path)
    return RealHarness(request.getfixturevalue("real_cluster"), tmp_path)


def until(harness: Harness, executor: RayExecutor, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    for _ in range(2000):
        executor.step()
        if done():
            return
        assert time.monotonic() < deadline, f"never: {what}"
        harness.pause()
    raise AssertionError(f"never: {what}")


def exits_of(harness: Harness, executor: RayExecutor, n: int = 1) -> list[AttemptExit]:
    got: list[AttemptExit] = []
    until(harness, executor, lambda: bool(got.extend(executor.poll())) or len(got) >= n, "exit")
    return got


def flagged(job_id: str, nodes: dict[str, int], flags: Path, attempt: int = 1) -> LaunchRequest:
    """A request whose every node rank waits for its flag file and exits its code."""
    base = request(job_id, nodes, attempt=attempt)
    command = (sys.executable, "-c", WAIT_FOR_FLAG, str(flags), ENV_GANG)
    return LaunchRequest(**{**base.__dict__, "command": command, "run_dir": flags / job_id})


def test_contract_gang_exit_stop_unplaced_stop_and_adoption(
    harness: Harness, tmp_path: Path
) -> None:
    ex = harness.executor()
    assert sorted((n.name, n.chip, n.devices) for n in ex.inventory()) == [
        ("head", "cpu", 2),
        ("worker", "cpu", 2),
    ]
    # a gang on both nodes: node rank 1 exits 3, the whole gang ends, nothing is left, and
    # the attempt is lost (the server restarts the whole gang); a usage error (2) is not
    for job, code, lost in (("c-gang", 3, True), ("c-usage", 2, False)):
        gang = attempt_tag(job, 1)
        ex.start(flagged(job, {"head": 1, "worker": 1}, tmp_path))
        up = lambda g=gang: harness.running(g, 0) and harness.running(g, 1)  # noqa: E731
        until(harness, ex, up, "gang up")
        harness.exit_rank(gang, 1, code)
        ended = exits_of(harness, ex)
        assert [(e.job_id, e.exit_code, e.lost) for e in ended] == [(job, code, lost)]
        assert ("whole gang restarts" in ended[0].reason) == lost
        assert harness.leftovers(gang) == []
    # a stop of a running attempt: its launcher gets SIGTERM (143), the attempt is lost
    one = attempt_tag("c-stop", 1)
    ex.start(flagged("c-stop", {"worker": 2}, tmp_path))
    until(harness, ex, lambda: harness.running(one, 0), "stop's attempt up")
    ex.stop("c-stop")
    assert [(e.exit_code, e.lost) for e in exits_of(harness, ex)] == [(143, True)]
    assert harness.leftovers(one) == []
    # more chips than the node has: Ray never places it, and a stop ends it at once
    ex.start(flagged("c-never", {"head": 3}, tmp_path))
    ex.step()
    ex.stop("c-never")
    ex.step()
    ended = ex.poll()
    assert [(e.job_id, e.exit_code, e.lost) for e in ended] == [("c-never", None, True)]
    assert "placed" in ended[0].reason
    assert harness.leftovers(attempt_tag("c-never", 1)) == []
    # a server restart: the running attempt is adopted, a ghost of an older server reaped
    kept = attempt_tag("c-kept", 1)
    ex.start(flagged("c-kept", {"head": 1}, tmp_path))
    until(harness, ex, lambda: harness.running(kept, 0), "kept up")
    harness.ghost()
    ex.close()
    ex = harness.executor()
    ex.adopt("c-kept", 1, tmp_path)
    ex.reap()
    until(harness, ex, lambda: harness.leftovers("argosy-ghost-") == [], "ghost reaped")
    assert ex.poll() == [] and harness.running(kept, 0)
    adopted = ex._attempts["c-kept"]  # its nodes, read off Ray's placement group table
    assert adopted.names == ["head"] and adopted.node_ids[0] in ex._alive, adopted
    harness.exit_rank(kept, 0, 0)
    assert [(e.job_id, e.exit_code, e.lost) for e in exits_of(harness, ex)] == [
        ("c-kept", 0, False)
    ]
    assert harness.leftovers(kept) == []
    ex.close()


def test_contract_a_node_that_rejoins_keeps_its_name_and_takes_work(
    harness: Harness, tmp_path: Path
) -> None:
    """Runs last on the real cluster: it kills the worker's raylet and starts a new one."""
    ex = harness.executor()
    harness.kill_worker()
    until(harness, ex, lambda: [n.name for n in ex.inventory()] == ["head"], "worker gone")
    harness.restart_worker()
    until(harness, ex, lambda: sorted(n.name for n in ex.inventory()) == ["head", "worker"], "back")
    tag = attempt_tag("c-back", 1)
    ex.start(flagged("c-back", {"worker": 2}, tmp_path))
    until(harness, ex, lambda: harness.running(tag, 0), "placed on the rejoined node")
    harness.exit_rank(tag, 0, 0)
    assert [(e.exit_code, e.lost) for e in exits_of(harness, ex)] == [(0, False)]
    ex.close()


# ---- a state machine: starts, node losses and rejoins, exits, stops, restarts -----------

JOBS = ("fake-a", "fake-b", "fake-c")
NODES = {
    "n1": {"chip:cpu": 4.0},
    "n2": {"chip:cpu": 4.0},
    "g1": {"GPU": 4.0, "accelerator_type:H100": 1.0},
}


class RayExecutorMachine(RuleBasedStateMachine):
    """The server's side: it starts jobs on the nodes the inventory lists, stops them,
    restarts (a new executor adopts what it believes runs, then reaps), and takes what
    `poll` reports. Ray's side: nodes die (Ray declares it now or later) and rejoin,
    launchers exit, Ray lags in placing. Time passes only in `tick` and `settle`."""

    @initialize(stop_code=st.sampled_from([143, 143, None]))
    def boot(self, stop_code: int | None) -> None:
        self.fake = FakeRay()
        self.fake.stop_code = stop_code  # None: launchers ignore SIGTERM
        for name, resources in NODES.items():
            self.fake.add_node(name, resources)
        self.executor = fake_executor(self.fake)
        self.running: dict[str, int] = {}  # what the server believes runs: job -> attempt
        self.sizes: dict[tuple[str, int], int] = {}
        self.attempts: Counter[str] = Counter()
        self.stopping: set[str] = set()
        self.reported: Counter[tuple[str, int]] = Counter()
        self.killed: set[str] = set()  # node ids whose raylet died

    def take(self, exits: list[AttemptExit]) -> None:
        for e in exits:
            key = (e.job_id, e.attempt)
            self.reported[key] += 1
            assert self.reported[key] == 1, f"{key} reported twice"
            assert self.running.get(e.job_id) == e.attempt, f"{key} reported but not running"
            assert set(e.lost_node_ranks) <= set(range(self.sizes[key])), e  # its own ranks
            assert e.lost or not e.lost_node_ranks, e  # a node lost: the attempt is lost
            del self.running[e.job_id]
            self.stopping.discard(e.job_id)

    def step(self) -> None:
        self.executor.step()
        self.take(self.executor.poll())

    # ---- the server ----------------------------------------------------------------------
    @precondition(lambda self: len(self.running) < len(JOBS) and self.executor.inventory())
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from([j for j in JOBS if j not in self.running]))
        inventory = self.executor.inventory()
        first = data.draw(st.sampled_from(inventory))
        peers = [n for n in inventory if n.chip == first.chip and n.name != first.name]
        chosen: list[NodeInfo] = [first]
        if peers and data.draw(st.booleans()):
            chosen.append(data.draw(st.sampled_from(peers)))
        devices = data.draw(st.integers(1, 2))
        self.attempts[job] += 1
        attempt = self.attempts[job]
        nodes = {n.name: devices for n in chosen}
        self.executor.start(request(job, nodes, chip=first.chip, attempt=attempt))
        self.running[job] = attempt
        self.sizes[(job, attempt)] = len(nodes)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.running)))
        self.executor.stop(job)
        self.stopping.add(job)
        tag = attempt_tag(job, self.running[job])
        unplaced = self.fake.live_groups().get(tag) == "PENDING" and not self.fake.placing
        self.step()
        if unplaced:
            assert job not in self.running, "a stop of an attempt Ray never placed ends it"

    @rule()
    def restart(self) -> None:
        self.executor.close()
        self.executor = fake_executor(self.fake)
        for job, attempt in self.running.items():
            assert self.executor.adopt(job, attempt, Path("/nonexistent")) is None
        self.executor.reap()
        for job in self.stopping & set(self.running):
            self.executor.stop(job)  # a cancel the server still wants done

    # ---- Ray -------------------------------------------------------------------------------
    def raylets(self, *, died: bool) -> list[str]:
        """Nodes whose newest raylet died (or runs)."""
        return [name for name in NODES if self.fake.node(name).died == died]

    @precondition(lambda self: self.raylets(died=False))
    @rule(data=st.data(), declare=st.booleans(), unreachable=st.booleans())
    def lose_node(self, data: st.DataObject, declare: bool, unreachable: bool) -> None:
        name = data.draw(st.sampled_from(self.raylets(died=False)))
        self.killed.add(self.fake.node(name).node_id)
        self.fake.kill_node(name, declare=declare, unreachable=unreachable)

    @precondition(lambda self: self.raylets(died=True))
    @rule(data=st.data())
    def ray_declares_dead(self, data: st.DataObject) -> None:
        self.fake.declare_dead(data.draw(st.sampled_from(self.raylets(died=True))))

    @precondition(lambda self: self.raylets(died=True))
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        self.fake.rejoin(data.draw(st.sampled_from(self.raylets(died=True))))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), rank=st.integers(0, 1), code=st.sampled_from([0, 0, 1]))
    def launcher_exits(self, data: st.DataObject, rank: int, code: int) -> None:
        job = data.draw(st.sampled_from(sorted(self.running)))
        self.fake.exit_rank(attempt_tag(job, self.running[job]), rank, code)

    @rule(placing=st.booleans())
    def ray_lags(self, placing: bool) -> None:
        self.fake.set_placing(placing)

    @rule(seconds=st.sampled_from([0.1, 0.6, 2.0, 16.0]))
    def tick(self, seconds: float) -> None:
        self.fake.now += seconds
        self.step()

    @rule()
    def settle(self) -> None:
        """Ray places again and time passes (past every grace): an attempt that ended is
        reported, one still reported running runs whole, the inventory is Ray's."""
        self.fake.set_placing(True)
        for _ in range(4):
            self.fake.now += 2.0
            self.step()
        for job, attempt in self.running.items():
            tag = attempt_tag(job, attempt)
            assert job not in self.stopping, f"{tag} was stopped but not reported"
            if self.fake.live_groups().get(tag) == "PENDING":
                continue  # Ray cannot place it (its node is full, or gone but not declared)
            ranks = [self.fake.last_actor(f"{tag}-{i}") for i in range(self.sizes[(job, attempt)])]
            assert all(r is not None for r in ranks), f"{tag} has a rank with no actor"
            if any(state == "UNREACHABLE" for state, _ in ranks):
                continue  # its node died, not yet declared: nobody can tell how it ended
            lost = [i for i, (state, r) in enumerate(ranks) if state == "DEAD" and r.code != 0]
            assert not lost, f"{tag} lost the actors of node ranks {lost}, unreported"
            codes = [r.code for _, r in ranks]  # a rank done (0) may have lost its node since
            assert None in codes and set(codes) <= {None, 0}, f"{tag} ended unreported: {codes}"
        listed = names(self.executor)
        alive = {n["Labels"]["argosy.io/node"] for n in self.fake.nodes() if n["Alive"]}
        assert set(listed) <= alive, f"a dead node is listed: {listed} {alive}"
        for name in NODES:
            newest = self.fake.node(name)
            if newest.alive and newest.node_id not in self.killed:
                assert name in listed, f"{name} is alive but not listed"

    # ---- always ------------------------------------------------------------------------------
    @invariant()
    def one_attempt_per_job_and_ended_ones_hold_nothing(self) -> None:
        if not hasattr(self, "fake"):
            return
        holders: dict[str, set[int]] = {}
        for name in [*self.fake.live_groups(), *self.fake.live_actors()]:
            prefix, letter, attempt = name.split("-")[1:4]  # argosy-fake-a-<n>[-<rank>]
            job = f"{prefix}-{letter}"
            holders.setdefault(job, set()).add(int(attempt))
            assert (job, int(attempt)) not in self.reported, f"{name} outlived its report"
        assert all(len(a) <= 1 for a in holders.values()), holders

    @invariant()
    def the_inventory_lists_no_dead_node_and_each_name_once(self) -> None:
        if not hasattr(self, "fake"):
            return
        listed = [n.name for n in self.executor.inventory()]
        assert len(listed) == len(set(listed)), listed
        assert set(listed) <= set(NODES), listed


RayExecutorMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_ray_executor_machine = RayExecutorMachine.TestCase


@pytest.mark.parametrize("suspect_s", [3.0, 8.0])
def test_a_node_whose_actor_died_is_out_for_the_configured_suspect_time(suspect_s) -> None:
    """Ray has not declared it dead (nor does it: the raylet comes back as it was): the node
    is left out of the inventory for `suspect_s`, then placeable again."""
    fake = FakeRay()
    fake.add_node("head", CPU)
    fake.add_node("worker", CPU)
    executor = fake_executor(fake, suspect_s=suspect_s)
    executor.start(request("fake-s", {"worker": 1}))
    settle(fake, executor)
    fake.kill_node("worker", declare=False)
    fake.node("worker").died = False  # a passing outage: the raylet answers again
    lost_at = fake.now
    assert [e.lost for e in settle(fake, executor, rounds=1)] == [True]
    back = None
    while back is None and fake.now - lost_at < 20:
        settle(fake, executor, rounds=1)
        if "worker" in names(executor):
            back = fake.now - lost_at
    assert back is not None and suspect_s <= back <= suspect_s + 2.0, back


def test_the_server_passes_its_suspect_time_on() -> None:
    from argosy.server.config import ServerConfig

    assert RayOptions().suspect_s == 15.0
    assert ServerConfig(ray_suspect_s=3).ray_suspect_s == 3.0
    with pytest.raises(ValueError):
        ServerConfig(ray_suspect_s=-1)


def test_an_attempt_ray_cannot_place_ends_lost_at_its_deadline() -> None:
    """The scheduler saw devices free that Ray does not (a sleeping replica's placement
    group holds them): the attempt ends as lost, saying why, instead of running unseen
    forever; one that Ray places before the deadline runs on."""
    fake = FakeRay()
    fake.add_node("head", CPU)  # two chip:cpu
    executor = fake_executor(fake, place_timeout_s=10)
    executor.start(request("holder", {"head": 2}))
    executor.start(request("starved", {"head": 1}))
    exits = settle(fake, executor, rounds=8)
    assert exits == []  # still within its deadline
    exits = settle(fake, executor, rounds=4)
    assert [(e.job_id, e.lost) for e in exits] == [("starved", True)]
    assert "did not place its placement group within 10 s" in exits[0].reason
    executor.start(request("late", {"head": 1}))
    settle(fake, executor, rounds=5)
    assert fake.exit_rank(attempt_tag("holder", 1), 0, 0)  # its devices free at 5 s
    exits = settle(fake, executor, rounds=12)  # past the late one's deadline
    assert [(e.job_id, e.exit_code) for e in exits] == [("holder", 0)]
    runner = fake.runner(f"{attempt_tag('late', 1)}-0")
    assert runner is not None and runner.running  # placed late, within its deadline: runs on
