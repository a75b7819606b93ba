"""What submit refuses is exactly what could never start, over generated clusters.

`Scheduling.check` answers at submit; the scheduler places on the idle cluster. The
property: a job `check` accepts starts at the first cycle of an idle cluster (so nothing
stored is later failed as "rejected"), and a job it refuses has no place by the
capacity's own `fits`, with every node free: for an exact gang `nnodes` nodes of
`nproc_per_node` devices in one node group, for a packed job its devices in one group
of nodes of at least `nproc_per_node` devices (never more nodes than it asked for).
"""

from __future__ import annotations

from hypothesis import given, note, settings
from hypothesis import strategies as st

from argosy.core.clock import FakeClock
from argosy.executors.base import NodeInfo
from argosy.scheduler.config import SchedulerConfig
from argosy.server.scheduling import Scheduling
from argosy.server.spec import JobSpec

CHIPS = ["cpu", "h100-sxm"]


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeInfo]:
    shapes = draw(
        st.lists(st.tuples(st.sampled_from(CHIPS), st.sampled_from([1, 2, 4, 8])), min_size=1)
    )
    return [NodeInfo(f"n{i}", chip, devices) for i, (chip, devices) in enumerate(shapes[:8])]


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    exact = draw(st.booleans())
    body: dict = {
        "name": "j",
        "script": "/bin/true",
        "nnodes": draw(st.integers(1, 5)),
        "nproc_per_node": draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
        "chips": draw(st.lists(st.sampled_from(CHIPS), max_size=2, unique=True)),
        "exact_nodes": exact,
    }
    if not exact and draw(st.booleans()):
        low = draw(st.integers(1, body["nnodes"]))
        high = body["nnodes"] + draw(st.integers(0, 3))
        body["elastic"] = {"min_nnodes": low, "max_nnodes": high}
    return JobSpec.model_validate(body)


def _has_place(scheduling: Scheduling, spec: JobSpec) -> bool:
    """Whether it fits some node group of an accepted chip, all free: an exact gang as
    `nnodes` nodes of `nproc_per_node` devices, a packed job's devices anywhere in a
    group of nodes of at least `nproc_per_node` devices (so on at most `nnodes`)."""
    w = scheduling._workload("probe", spec, 0.0)
    return any(
        group.chip.id in w.chips
        and group.devices_per_node >= spec.nproc_per_node
        and scheduling.sched.cap.fits(g, w.min_devices, w.per_node)
        for g, group in enumerate(scheduling.cluster.groups)
    )


@settings(max_examples=300, deadline=None)
@given(nodes=clusters(), spec=specs())
def test_submit_refuses_exactly_what_could_never_start(
    nodes: list[NodeInfo], spec: JobSpec
) -> None:
    scheduling = Scheduling(nodes, None, "argosy", SchedulerConfig(), FakeClock())
    field, why = scheduling.check(spec)
    note(f"{nodes} {spec.model_dump(exclude_defaults=True)} -> {field!r} {why!r}")
    if why:
        assert field in {"nnodes", "elastic.min_nnodes", "chips"}, (field, why)
        assert not _has_place(scheduling, spec), why
        return
    assert field == "" and scheduling.submit("j", spec, 0.0) == ""
    started = [d.workload.id for d in scheduling.cycle() if d.action == "start"]
    assert started == ["j"], "accepted at submit yet not started on an idle cluster"
    placed = scheduling.placement("j").nodes
    assert sum(placed.values()) == spec.device_range[0] or spec.elastic is not None
    if spec.exact_nodes:
        assert len(placed) == spec.nnodes and set(placed.values()) == {spec.nproc_per_node}
    else:  # packed onto as few nodes as hold it: all on one node, or whole nodes but one
        sizes = {n.name: n.devices for n in nodes}
        assert len({sizes[name] for name in placed}) == 1  # one node group
        assert all(sizes[name] >= spec.nproc_per_node for name in placed), placed
        per = spec.nproc_per_node  # an elastic job takes whole multiples of it a node
        unit = {x: sizes[x] - sizes[x] % per if spec.elastic else sizes[x] for x in placed}
        assert len(placed) == 1 or sum(placed[x] < unit[x] for x in placed) <= 1, placed


def test_a_gang_never_spans_two_node_sizes() -> None:
    """Three 1-device nodes, but two of size 1 and one of size 8: a 3 x 1 exact gang has
    no place (the case the old count of nodes let through) and the refusal names the
    nodes it could have had; packed, it goes onto the big node, as does a packed 2 x 4;
    a gang of nodes of 4 fits the big node, packed or exact."""
    nodes = [NodeInfo("head", "cpu", 1), NodeInfo("w1", "cpu", 1), NodeInfo("big", "cpu", 8)]
    scheduling = Scheduling(nodes, None, "argosy", SchedulerConfig(), FakeClock())
    gang = JobSpec.model_validate(
        {"name": "g", "script": "/bin/true", "nnodes": 3, "nproc_per_node": 1, "exact_nodes": True}
    )
    field, why = scheduling.check(gang)
    assert field == "nnodes" and "at most 2 such node(s)" in why, why
    assert "the cpu nodes of 1 device(s) (head, w1)" in why, why
    fours = gang.model_copy(update={"nnodes": 1, "nproc_per_node": 4})
    assert (
        scheduling.check(fours)
        == scheduling.check(fours.model_copy(update={"exact_nodes": False}))
        == ("", "")
    )
    packed_3x1 = gang.model_copy(update={"exact_nodes": False})
    packed_2x4 = packed_3x1.model_copy(update={"nnodes": 2, "nproc_per_node": 4})
    for job_id, spec, want in [("p31", packed_3x1, 3), ("p24", packed_2x4, 8)]:
        assert scheduling.check(spec) == ("", "")
        assert scheduling.submit(job_id, spec, 0.0) == ""
        assert [d.workload.id for d in scheduling.cycle() if d.action == "start"] == [job_id]
        assert scheduling.placement(job_id).nodes == {"big": want}
        scheduling.finished(job_id)
    nine = packed_3x1.model_copy(update={"nnodes": 3, "nproc_per_node": 3})
    field, why = scheduling.check(nine)
    assert field == "nnodes" and "needs 9 devices on at most 3 node(s)" in why, why
    assert "the most such a group holds is 8 device(s): the cpu nodes of 8" in why, why
    nine_on_one = packed_3x1.model_copy(update={"nnodes": 1, "nproc_per_node": 9})
    assert scheduling.check(nine_on_one)[0] == "nnodes"  # never two nodes for a 1-node job
