"""The Ray executor over a fake Ray (fake_ray.py), node by node: stable node names (a node
that dies and rejoins under a new Ray id is the same node), Ray's own GPU resources and
the catalog, and what a node's runner is told to run a job as its queue's user."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from fake_ray import CPU, GCS_ADDRESS, FakeRay, fake_executor, names, request, settle
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.executors.ray import RayExecutor, attempt_tag, catalog_chip
from argosy.executors.ray_nodes import ChipOffer, node_names


@pytest.mark.parametrize("authenticated", [True, False])
@pytest.mark.parametrize("users", ["argosy-job", None])
def test_jobs_as_other_users_need_a_cluster_that_asks_for_ray_s_token(
    monkeypatch: pytest.MonkeyPatch, authenticated: bool, users: str | None
) -> None:
    """Per-queue users on a cluster that lets any client in would be for show (a job
    submits work to Ray, which runs it as Ray's user): such a server does not start.
    The node's runner gets the server's settings, the job's queue and run directory, and
    the job user's ids as this machine has them."""
    from argosy.core.errors import ArgosyError
    from argosy.executors import ray as ray_executor
    from argosy.executors.isolation import JobIdentity, JobUser, JobUsers

    asked = []
    monkeypatch.setattr(ray_executor, "asks_for_token", lambda a: asked.append(a) or authenticated)
    fake = FakeRay()
    fake.add_node("head", CPU)
    settings = JobUsers(run_as="argosy-job")
    known = {"team-a": JobUser("argosy-job-team-a", 23456, 23457)}  # this machine's user
    identity = JobIdentity(users, True, known if users else {})
    options = {"identity": identity, "job_users": settings, "env_allow": ("X_*",)}
    if users is not None and not authenticated:
        with pytest.raises(ArgosyError, match="RAY_AUTH_MODE=token"):
            fake_executor(fake, **options)
        assert asked == [GCS_ADDRESS]  # the cluster the client is connected to is asked
        return
    executor = fake_executor(fake, **options)
    executor.start(dataclasses.replace(request("fake-u", {"head": 1}), queue="team-a"))
    settle(fake, executor)
    runner = fake.runner(attempt_tag("fake-u", 1) + "-0")
    assert runner is not None and runner.job is not None
    assert (runner.job.queue, runner.job.users, runner.job.allow) == ("team-a", settings, ("X_*",))
    assert runner.job.run_dir == str(Path("/nonexistent") / "fake-u")
    assert runner.job.ids == ((23456, 23457) if users else None)  # every node: these ids


def test_a_node_that_rejoins_under_a_new_ray_id_is_the_same_node() -> None:
    fake = FakeRay()
    fake.add_node("head", CPU)
    fake.add_node("worker", CPU)
    executor = fake_executor(fake)
    executor.start(request("fake-r", {"worker": 1}))
    settle(fake, executor)
    fake.kill_node("worker")
    exits = settle(fake, executor)
    assert [(e.job_id, e.lost) for e in exits] == [("fake-r", True)]
    assert names(executor) == ["head"]
    new_id = fake.rejoin("worker")
    settle(fake, executor)
    assert names(executor) == ["head", "worker"]  # once, under its label
    executor.start(request("fake-r", {"worker": 1}, attempt=2))
    settle(fake, executor)
    assert fake.actor_node(attempt_tag("fake-r", 2) + "-0") == new_id  # the new raylet
    assert fake.exit_rank(attempt_tag("fake-r", 2), 0, 0)
    assert [(e.attempt, e.exit_code) for e in settle(fake, executor)] == [(2, 0)]


def test_unlabelled_nodes_are_named_by_their_ip_unless_they_share_it() -> None:
    fake = FakeRay()
    fake.add_node("a", CPU, address="10.1.0.1", labelled=False)
    b1 = fake.add_node("b1", CPU, address="10.1.0.2", labelled=False)
    b2 = fake.add_node("b2", CPU, address="10.1.0.2", labelled=False)
    fake.add_node("c", CPU, address="10.1.0.2")  # labelled: its name is its own
    executor = fake_executor(fake)
    assert names(executor) == sorted(["10.1.0.1", f"10.1.0.2-{b1[:8]}", f"10.1.0.2-{b2[:8]}", "c"])
    fake.kill_node("a")
    fake.rejoin("a")
    settle(fake, executor)
    assert "10.1.0.1" in names(executor)  # one raylet on its host: the IP is stable


def test_a_second_unlabelled_raylet_on_a_busy_node_s_ip_does_not_rename_it() -> None:
    """The server books devices by node name: renaming a busy node when a second raylet
    joins on its IP would free its devices on paper (the newcomer taking the old name,
    the busy node a new one). The busy node keeps its name; the newcomer takes the long one."""
    fake = FakeRay()
    fake.add_node("a", CPU, address="10.1.0.1", labelled=False)
    executor = fake_executor(fake)
    executor.start(request("fake-b", {"10.1.0.1": 1}))
    settle(fake, executor)
    newcomer = fake.add_node("a2", CPU, address="10.1.0.1", labelled=False)
    settle(fake, executor)
    assert names(executor) == ["10.1.0.1", f"10.1.0.1-{newcomer[:8]}"]
    assert fake.exit_rank(attempt_tag("fake-b", 1), 0, 0)  # the job ran on, where it was
    assert [(e.job_id, e.exit_code) for e in settle(fake, executor)] == [("fake-b", 0)]


@st.composite
def joins_and_leaves(draw: st.DrawFn) -> list[tuple[str, str, str, bool]]:
    """Steps of a Ray cluster: ("join", id, ip, labelled) or ("leave", id, "", False)."""
    steps, alive = [], []
    for k in range(draw(st.integers(1, 14))):
        if alive and draw(st.booleans()):
            steps.append(("leave", alive.pop(draw(st.integers(0, len(alive) - 1))), "", False))
        else:
            node_id = f"{k:08x}" + "e" * 8
            ip = draw(st.sampled_from(["10.0.0.1", "10.0.0.2"]))
            steps.append(("join", node_id, ip, draw(st.booleans())))
            alive.append(node_id)
    return steps


@settings(max_examples=200, deadline=None)
@given(joins_and_leaves())
def test_names_are_unique_and_a_live_node_s_name_never_changes(steps) -> None:
    offers: dict[str, ChipOffer] = {}
    given_names: dict[str, str] = {}
    for what, node_id, ip, labelled in steps:
        if what == "leave":
            del offers[node_id]
        else:
            label = f"n-{node_id[:8]}" if labelled else ""
            offers[node_id] = ChipOffer(node_id, ip, label, "cpu", 1, "CPU")
        named = node_names(list(offers.values()), given_names)
        assert len(set(named)) == len(named), named  # no device booked under two nodes
        now = {o.node_id: n for o, n in zip(offers.values(), named, strict=True)}
        for node, name in now.items():
            assert given_names.get(node, name) == name, (node, given_names[node], name)
            assert name == offers[node].label or not offers[node].label  # a label is its name
        given_names = now


def test_gpu_nodes_are_matched_to_the_catalog_and_ask_ray_for_gpus(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeRay()
    fake.add_node("h", {"GPU": 8.0, "accelerator_type:H100": 1.0, "CPU": 64.0})
    fake.add_node("a", {"GPU": 4.0, "accelerator_type:A100-80G": 1.0})
    fake.add_node("both", {"GPU": 8.0, "accelerator_type:H100": 1.0, "chip:h100pcie": 8.0})
    fake.add_node("odd", {"GPU": 2.0, "accelerator_type:GeForce-RTX-5090": 1.0})
    fake.add_node("odd2", {"GPU": 2.0, "accelerator_type:GeForce-RTX-5090": 1.0})
    fake.add_node("cpu-only", {"CPU": 16.0})
    with caplog.at_level(logging.WARNING, logger="argosy.executors.ray"):
        executor = fake_executor(fake)
        settle(fake, executor)
    inventory = {n.name: (n.chip, n.devices) for n in executor.inventory()}
    assert inventory == {"h": ("h100-sxm", 8), "a": ("a100-80g", 4), "both": ("h100pcie", 8)}
    assert sum("GeForce-RTX-5090" in r.message for r in caplog.records) == 1  # logged once
    executor.start(request("fake-g", {"h": 4}, chip="h100-sxm"))
    executor.step()
    assert fake.group_bundles(attempt_tag("fake-g", 1)) == [{"GPU": 4.0}]
    assert fake.actor_gpus(attempt_tag("fake-g", 1) + "-0") == 4  # its own 4 GPUs
    executor.start(request("fake-p", {"both": 2}, chip="h100pcie"))
    executor.step()
    assert fake.group_bundles(attempt_tag("fake-p", 1)) == [{"chip:h100pcie": 2.0}]  # chip:


@pytest.mark.parametrize(
    ("reported", "chip"),
    [("H100", "h100-sxm"), ("A100", "a100-80g"), ("A100-40G", "a100-40g"), ("H200", "h200")],
)
def test_ray_accelerator_types_map_to_catalog_ids(reported: str, chip: str) -> None:
    assert catalog_chip(reported) == chip
    assert catalog_chip("TPU-V4") is None


def _gang_on_head_and_w1(job: str, spare: str = "") -> tuple[FakeRay, RayExecutor]:
    """A fake cluster (head, w1 and maybe a spare node) running `job` as a gang of two
    node ranks: 0 on head, 1 on w1."""
    fake = FakeRay()
    for name in ("head", "w1", *([spare] if spare else [])):
        fake.add_node(name, CPU)
    executor = fake_executor(fake)
    executor.start(request(job, {"head": 1, "w1": 1}))
    settle(fake, executor)
    return fake, executor


HOW_SAID = {
    "hangs": "did not answer within 2 s",
    "dies unseen": "died",
    "dies unreachable": "is unreachable (Ray: actor unavailable)",
}


@pytest.mark.parametrize("adopted", [False, True])
@pytest.mark.parametrize("how", list(HOW_SAID))
@pytest.mark.parametrize("lost_rank", [0, 1])
def test_a_gang_that_fails_on_a_lost_peer_blames_that_peer_s_node(
    how: str, lost_rank: int, adopted: bool
) -> None:
    """A node rank's host hangs (or its raylet dies before Ray's health check sees it:
    its actor's calls fail as unavailable, as real Ray's do in those seconds): the
    survivor's launcher fails on the lost peer first. The attempt ends lost, naming the
    lost node rank and its node, which leaves the inventory: the next attempt goes to a
    free node, not back onto it (one restart per lost node, not two). The same for a
    gang a restarted server adopted (its nodes read from Ray's placement group)."""
    fake, executor = _gang_on_head_and_w1("fake-g", spare="w2")
    if adopted:
        executor.close()
        executor = fake_executor(fake)
        assert executor.adopt("fake-g", 1, Path("/nonexistent")) is None
        executor.reap()
        settle(fake, executor)
    lost, survivor = ("w1", "head") if lost_rank == 1 else ("head", "w1")
    assert fake.actor_node(f"{attempt_tag('fake-g', 1)}-{lost_rank}") == fake.node(lost).node_id
    if how == "hangs":
        fake.freeze_node(lost)
    else:
        fake.kill_node(lost, declare=False, unreachable=how == "dies unreachable")
    survivor_rank = 1 - lost_rank  # gloo: connection reset by peer
    assert fake.exit_rank(attempt_tag("fake-g", 1), survivor_rank, 1)
    (ended,) = settle(fake, executor, rounds=1)
    assert ended.lost and ended.exit_code is None
    said = f"node rank {lost_rank}'s Ray node ({lost}) {HOW_SAID[how]}; the whole gang restarts"
    assert ended.reason == said, ended.reason
    assert ended.lost_node_ranks == (lost_rank,)  # the survivor's crash is not its node's
    assert names(executor) == sorted({"head", "w1", "w2"} - {lost})
    assert survivor in names(executor)
    kills = {name for name, method in fake.calls if method == "kill_job"}
    tag = attempt_tag("fake-g", 1)  # the survivor's processes are killed; the lost node's
    assert kills == {f"{tag}-{survivor_rank}"}, kills  # actor is not asked (Ray's wait)


def test_a_gang_that_fails_on_its_own_blames_the_rank_that_failed() -> None:
    """Every peer answers: the failed rank's own exit is the reason, and no node leaves."""
    fake, executor = _gang_on_head_and_w1("fake-o")
    assert fake.exit_rank(attempt_tag("fake-o", 1), 1, 1)
    (ended,) = settle(fake, executor, rounds=1)
    assert ended.exit_code == 1 and ended.reason.startswith("node rank 1: the launcher exited 1")
    assert ended.lost_node_ranks == ()  # no node was lost: every rank's evidence counts
    assert names(executor) == ["head", "w1"]


@pytest.mark.parametrize("declare", [True, False])
def test_a_node_lost_after_its_rank_finished_costs_the_gang_nothing(declare: bool) -> None:
    """Node rank 0's launcher exits 0, then its node dies (declared dead by Ray now, or
    only unreachable): the other rank keeps running, and its exit 0 ends the attempt as
    a success, with no restart and no node blamed."""
    fake, executor = _gang_on_head_and_w1("fake-f")
    assert fake.exit_rank(attempt_tag("fake-f", 1), 0, 0)
    assert settle(fake, executor) == []
    fake.kill_node("head", declare=declare, unreachable=not declare)
    assert settle(fake, executor) == []  # rank 1 still trains
    assert fake.exit_rank(attempt_tag("fake-f", 1), 1, 0)
    (ended,) = settle(fake, executor)
    assert ended.exit_code == 0 and not ended.lost and ended.lost_node_ranks == ()
