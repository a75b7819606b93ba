"""`--tee` and the console lines: pure parts, checked over arbitrary writes and events."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from argosy.runtime.notices import notice
from argosy.runtime.tee import RankTee

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"), max_size=40)


@given(chunks=st.lists(st.tuples(st.sampled_from([0, 1]), text), max_size=12))
def test_every_line_comes_out_once_whole_and_prefixed_whatever_the_chunking(
    chunks: list[tuple[int, str]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logs = {rank: Path(tmp) / f"rank{rank}.log" for rank in (0, 1)}
        got: list[str] = []
        tee = RankTee(logs, got.append)
        for rank, chunk in chunks:  # a rank writes any piece, the agent polls in between
            with logs[rank].open("ab") as f:
                f.write(chunk.encode())
            tee.pump()
        tee.flush()
        for rank in (0, 1):
            written = "".join(c for r, c in chunks if r == rank)
            want = [f"[rank{rank}]: {line.rstrip()}" for line in written.split("\n")]
            if written.endswith("\n") or not written:
                want = want[:-1]  # nothing after the last newline
            assert [line for line in got if line.startswith(f"[rank{rank}]: ")] == want


def test_console_lines_name_the_fault_the_restart_and_the_give_up() -> None:
    fault = {"event": "fault", "kind": "exit", "attempt": 0, "detail": "rank 1 exited with code 3"}
    fault |= {"action": "restart", "detected_at_s": 4.2, "injected_at_s": 4.0}
    assert notice(fault, 3) == (
        "[argosy] fault: rank 1 exited with code 3 (attempt 0); detected at 4.20 s, "
        "0.20 s after it struck; the group stops and restarts"
    )
    restart = {"event": "restart", "attempt": 1, "reason": "exit"}
    assert notice(restart, 3) == "[argosy] restart 1 of 3 (exit fault): starting attempt 1"
    assert notice({"event": "give_up", "restarts": 3}, 3) == "[argosy] giving up after 3 restart(s)"
    assert notice({"event": "step", "step": 3}, 3) is None  # steps stay in the log
