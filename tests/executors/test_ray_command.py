"""The launch each node rank of a Ray attempt runs: one rank per device its node got,
with one rank numbering when nodes got different counts (the world is the job's)."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.executors.base import LaunchRequest
from argosy.executors.ray import node_command


def _request(counts: list[int], nproc: int = 1) -> LaunchRequest:
    nodes = {f"n{i}": c for i, c in enumerate(counts)}
    return LaunchRequest("j", 1, "train.py", (), nproc, Path("/runs/j"), nodes, "cpu")


def _option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


@given(st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_every_node_rank_runs_its_devices_and_the_ranks_add_up(counts):
    request = _request(counts)
    world = 0
    for rank in range(len(counts)):
        command = node_command(request, len(counts), rank, "10.0.0.1", 29500, Path("/r"))
        assert int(_option(command, "--nproc-per-node")) == counts[rank]
        world += counts[rank]
        sizes = _option(command, "--node-sizes")
        if len(counts) > 1 and len(set(counts)) > 1:
            assert sizes == ",".join(map(str, counts))
        else:
            assert sizes is None
        assert (_option(command, "--nnodes") is None) == (len(counts) == 1)
    assert world == sum(counts)


@pytest.mark.parametrize(("nnodes", "nproc", "counts"), [(2, 1, [2]), (3, 2, [4, 2])])
def test_a_packed_gang_keeps_the_job_s_world_size(nnodes, nproc, counts):
    """nnodes x nproc_per_node ranks, on as few nodes as the scheduler packed them onto."""
    request = _request(counts, nproc)
    ranks = range(len(counts))
    commands = [node_command(request, len(counts), r, "a", 1, Path("/r")) for r in ranks]
    assert sum(int(_option(c, "--nproc-per-node")) for c in commands) == nnodes * nproc
