"""The persister's environment: the trainer's, plus glibc's non-temporal copy threshold."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint.launch import NON_TEMPORAL_BYTES, persister_env

TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
_names = st.sampled_from(["glibc.malloc.arena_max", "glibc.cpu.hwcaps", TUNABLE])
_tunables = st.lists(st.tuples(_names, st.integers(1, 1 << 30)), max_size=4)


def _pairs(value: str) -> list[tuple[str, str]]:
    return [tuple(t.split("=", 1)) for t in value.split(":") if t]  # type: ignore[misc]


@given(_tunables, st.booleans())
def test_the_threshold_is_added_and_nothing_the_caller_set_is_lost(tunables, other_var):
    base = {"GLIBC_TUNABLES": ":".join(f"{n}={v}" for n, v in tunables)} if tunables else {}
    if other_var:
        base["SOME_VAR"] = "kept"
    env = persister_env(base)
    got = _pairs(env["GLIBC_TUNABLES"])
    given_pairs = [(n, str(v)) for n, v in tunables]
    assert got[: len(given_pairs)] == given_pairs  # every tunable the caller set, in order
    if any(n == TUNABLE for n, _ in tunables):
        assert got == given_pairs  # the caller's threshold wins
    else:
        assert got[len(given_pairs) :] == [(TUNABLE, hex(NON_TEMPORAL_BYTES))]
    assert {k: v for k, v in env.items() if k != "GLIBC_TUNABLES"} == {
        k: v for k, v in base.items() if k != "GLIBC_TUNABLES"
    }
    assert base.get("GLIBC_TUNABLES", "") == ":".join(f"{n}={v}" for n, v in tunables)


def test_a_running_persister_has_the_threshold(tmp_path, job, ck):
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        ckpt.save(1, ck.small_state())
        ckpt.wait()
        raw = Path(f"/proc/{ckpt._proc.pid}/environ").read_bytes().split(b"\0")
        env = dict(v.decode().split("=", 1) for v in raw if b"=" in v)
    assert (TUNABLE, hex(NON_TEMPORAL_BYTES)) in _pairs(env["GLIBC_TUNABLES"])
