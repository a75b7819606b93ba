"""`argosy chips` at 80 columns (a pipe, CI) shows every column and every chip's values
whole: no cut chip ids, no empty GiB or dom cells."""

from __future__ import annotations

from cli_helpers import argosy

from argosy.hardware.catalog import default_catalog


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def test_every_value_shows_at_80_columns() -> None:
    done = argosy("chips", columns=80, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    header = next(line for line in lines if line.startswith("chip"))
    for name in ("GiB", "TB/s", "dom", "W"):
        assert name in header
    for chip in default_catalog().chips():
        row = next((line for line in lines if line.split()[:1] == [chip.id]), None)
        assert row is not None, f"{chip.id} is cut or missing"
        cells = row.split()
        want = [chip.vendor, _num(chip.bf16_tflops), _num(chip.memory_gib)]
        assert cells[1:3] + [cells[5]] == want, row
        assert str(chip.link.domain_size) in cells and _num(chip.tdp_w) == cells[-1], row
