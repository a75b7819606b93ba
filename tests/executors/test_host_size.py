"""The machine's size the jobs' limits are cut from is the least of the hardware's and of
every cgroup above the server (a container's memory, a unit's CPU quota)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from argosy.executors.limits import GIB, HostSize

HOST = HostSize(memory_bytes=256 * GIB, cpus=64.0, tasks=1 << 20)


def _group(root: Path, name: str, files: dict[str, str]) -> Path:
    group = root / name
    group.mkdir(parents=True)
    for file, text in files.items():
        (group / file).write_text(text + "\n")
    return group


def test_a_container_and_a_unit_above_the_server_cut_the_size(tmp_path: Path) -> None:
    container = _group(tmp_path, "docker", {"memory.max": str(32 * GIB), "cpu.max": "max 100000"})
    unit = _group(
        tmp_path, "docker/argosy.service", {"cpu.max": "800000 100000", "pids.max": "9000"}
    )
    got = HOST.within([unit, container])
    assert got == HostSize(memory_bytes=32 * GIB, cpus=8.0, tasks=9000)


def test_no_limits_leave_the_hardware(tmp_path: Path) -> None:
    free = _group(
        tmp_path, "free", {"memory.max": "max", "cpu.max": "max 100000", "pids.max": "max"}
    )
    assert HOST.within([free, tmp_path / "missing"]) == HOST


@given(
    st.lists(
        st.tuples(st.integers(1, 1 << 40), st.integers(1_000, 10_000_000), st.integers(1, 1 << 22)),
        max_size=4,
    )
)
def test_the_size_is_the_least_of_all(limits: list[tuple[int, int, int]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        groups = [
            _group(
                Path(root),
                f"g{i}",
                {"memory.max": str(m), "cpu.max": f"{q} 100000", "pids.max": str(t)},
            )
            for i, (m, q, t) in enumerate(limits)
        ]
        got = HOST.within(groups)
    assert got.memory_bytes == min([HOST.memory_bytes, *(m for m, _, _ in limits)])
    assert got.cpus == min([HOST.cpus, *(q / 100_000 for _, q, _ in limits)])
    assert got.tasks == min([HOST.tasks, *(t for _, _, t in limits)])
