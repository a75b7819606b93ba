"""The checkpoint benchmark's report: each peer's line as it ends, the tables, the
ratios against the targets and the JSON (`--json`), from the figures the workers measured.

    print(summary(8, "argosy", result))      # one line, the moment a peer ends
    write_json(path, results, floors, meta)  # after every peer
    text = report(results, loop)             # rich tables, and the same as Markdown
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

FLOORS = "floors"
"""The pseudo-peer of a lean run: the floors alone, measured once per size."""


def fmt(x: Any) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


COLUMNS = {
    "stall/save s": "stall_s",
    "stall overlapped s": "stall_overlap_s",
    "durable s": "durable_s",
    "persist s": "persist_s",
    "restore mem s": "memory_restore_s",
    "restore disk s": "disk_restore_s",
    "memcpy floor s": "floor_s",
    "disk floor s": "disk_floor_s",
    "durable / disk floor": "durable_over_floor",
}
"""Table columns: "persist" is argosy's time from the snapshot in memory to durable."""


SUMMARY = {  # label: key, for the line printed as each peer ends
    "stall": "stall_s",
    "stall overlapped": "stall_overlap_s",
    "durable": "durable_s",
    "durable, file fsynced": "synced_s",
    "restore from memory": "memory_restore_s",
    "restore from disk": "disk_restore_s",
}


def _num(x: Any) -> float | None:
    """`x` where it is a measured figure (a number, not NaN), else None."""
    return float(x) if isinstance(x, int | float) and x == x else None


def _over(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return a / b if a is not None and b else None


def merged(r: dict, floors: dict) -> dict:
    """A peer's figures with its size's floors (a lean run's, measured once) beside them,
    where it measured none of its own."""
    return r if "missing" in r else {k: v for k, v in floors.items() if k != "wall_s"} | r


def peer_ratios(r: dict) -> dict[str, float | None]:
    """A peer's figures over the floors: stall over the copy floor (device-to-pinned-host
    for device state), time to durable over the disk floor."""
    return {
        "stall_over_copy_floor": _over(r.get("stall_s"), r.get("floor_s")),
        "stall_overlap_over_copy_floor": _over(r.get("stall_overlap_s"), r.get("floor_s")),
        "durable_over_disk_floor": _over(r.get("durable_s"), r.get("disk_floor_s")),
        "synced_over_disk_floor": _over(r.get("synced_s"), r.get("disk_floor_s")),
    }


def cross_ratios(peers: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """argosy's figures over DLRover's and over DCP async_save's (None where missing)."""
    a, d, c = (peers.get(p, {}) for p in ("argosy", "dlrover", "dcp_async"))
    return {
        "argosy_vs_dlrover": {
            "stall": _over(a.get("stall_s"), d.get("stall_s")),
            "stall_overlapped": _over(a.get("stall_overlap_s"), d.get("stall_s")),
            "durable": _over(a.get("durable_s"), d.get("durable_s")),
            "durable_vs_file_fsynced": _over(a.get("durable_s"), d.get("synced_s")),
            "memory_restore": _over(a.get("memory_restore_s"), d.get("memory_restore_s")),
        },
        "argosy_vs_dcp_async": {
            "stall": _over(a.get("stall_s"), c.get("stall_s")),
            "stall_overlapped": _over(a.get("stall_overlap_s"), c.get("stall_s")),
            "durable": _over(a.get("durable_s"), c.get("durable_s")),
        },
    }


def summary(gb: float, peer: str, r: dict) -> str:
    """One line, printed the moment a peer ends: its medians, and over the floors."""
    head = f"[{gb:g} GB] {peer} ({r.get('wall_s', 0):.0f} s)"
    if "missing" in r:
        return f"{head}: {r['missing']}"
    copy = f"{r.get('copy_floor', 'copy')} floor {fmt(r.get('floor_s'))} s"
    disk = f"disk floor {fmt(r.get('disk_floor_s'))} s"
    if peer == FLOORS:
        how = f"{r.get('disk_floor_writers')} writer(s), direct {r.get('disk_floor_direct')}"
        return f"{head}: {copy}, {disk} ({how})"
    figures = [f"{label} {fmt(r[key])} s" for label, key in SUMMARY.items() if key in r]
    ratios = peer_ratios(r)
    over = [
        f"stall / {r.get('copy_floor', 'copy')} floor {fmt(ratios['stall_over_copy_floor'])}",
        f"durable / disk floor {fmt(ratios['durable_over_disk_floor'])}",
    ]
    return f"{head}: {', '.join(figures)}; {', '.join(over)} ({copy}, {disk})"


def _clean(x: Any) -> Any:
    """JSON-safe: NaN (a figure not measured) as null, tuples as lists."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


FLOOR_KEYS = ("floor_s", "copy_floor", "disk_floor_s", "disk_floor_writers",
              "disk_floor_direct", "disk_floor_by_writers")  # fmt: skip


def json_report(
    results: dict[float, dict[str, dict]], floors: dict[float, dict], meta: dict
) -> dict:
    """Everything measured, per size: the floors, per peer its medians (`stall_s`,
    `durable_s`, restores, ...), its ratios over the floors and its raw figures, and
    argosy's figures over its peers'."""
    sizes = {}
    for gb, peers in results.items():
        size_floors = floors.get(gb) or next((r for r in peers.values() if "floor_s" in r), {})
        sizes[f"{gb:g}"] = {
            "floors": {k: size_floors.get(k) for k in FLOOR_KEYS},
            "floors_wall_s": size_floors.get("wall_s"),
            "peers": {
                peer: {k: r.get(k) for k in ("missing", "wall_s", *SUMMARY.values()) if k in r}
                | {"ratios": peer_ratios(r), "raw": r}
                for peer, r in peers.items()
            },
            "ratios": cross_ratios(peers),
        }
    return _clean({"meta": meta, "sizes": sizes})


def write_json(path: Path, results: dict, floors: dict, meta: dict) -> None:
    """Written after every peer, so a run cut short leaves what it measured."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(json_report(results, floors, meta), indent=1) + "\n")
    tmp.replace(path)


def _row(r: dict) -> list[str]:
    if r.get("durable_s") and r.get("disk_floor_s"):
        r = r | {"durable_over_floor": r["durable_s"] / r["disk_floor_s"]}
    return [fmt(r.get(key)) for key in COLUMNS.values()]


def _note(r: dict) -> str:
    notes = [f"slots={r['slots']}"] if "slots" in r else []
    if "disk_floor_by_writers" in r:
        by = ", ".join(f"{w}: {t:.2f} s" for w, t in r["disk_floor_by_writers"].items())
        notes.append(f"start-up floor by writers {by}")
    if "writers" in r:
        notes.append(f"bracket floors: {r['writers']} writer(s), as argosy's")
    return ", ".join(notes)


def report(results: dict[float, dict[str, dict]], loop: dict | None) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=180)
    md = ["| state | peer | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for gb, peers in results.items():
        table = Table(title=f"{gb:g} GB state (medians)")
        for col in ("peer", *COLUMNS, "note"):
            table.add_column(col, justify="left" if col in ("peer", "note") else "right")
        for peer, r in peers.items():
            if "missing" in r:
                table.add_row(peer, *["-"] * len(COLUMNS), r["missing"][:60])
                md.append(f"| {gb:g} GB | {peer} | n/a: {r['missing'][:60]} |")
                continue
            cells = _row(r)
            table.add_row(peer, *cells, _note(r))
            md.append(f"| {gb:g} GB | {peer} | " + " | ".join(cells) + " |")
        console.print(table)
        for line in ratios(peers):
            console.print("  " + line)
            md.append(f"\n{gb:g} GB: {line}")
        md.append("")
    for lp in (loop or {}).get("loops", []):
        overhead = lp["step_save_s"] / lp["step_s"] - 1
        disk = f"disk every {lp['interval_s']:g} s" if lp["interval_s"] else "disk continuously"
        line = (
            f"loop ({disk}): {lp['state_mb']:.0f} MB state, step {lp['step_s'] * 1e3:.1f} ms"
            f" without saving, {lp['step_save_s'] * 1e3:.1f} ms with a save every step"
            f" (overhead {overhead * 100:+.1f}%, target <= 5%; copy/step"
            f" {(lp['copy_s'] or float('nan')) / lp['step_s']:.2f})"
        )
        console.print(line)
        md.append(line)
    return "\n".join(md)


RATIOS = [  # (what, argosy's figure, peer, the peer's figure)
    ("argosy overlapped stall / DLRover stall (target <= 0.5)",
     "stall_overlap_s", "dlrover", "stall_s"),
    ("argosy stall, nothing to overlap / memcpy floor (target <= 1.2)",
     "stall_s", "argosy", "floor_s"),
    ("argosy restore from memory / DLRover (target <= 1.2)",
     "memory_restore_s", "dlrover", "memory_restore_s"),
    ("argosy restore from disk / DCP load (target <= 1.2)",
     "disk_restore_s", "dcp_save", "disk_restore_s"),
    ("argosy time to durable / DCP save (target <= 1.3)", "durable_s", "dcp_save", "durable_s"),
    ("argosy time to durable / disk floor (target <= 1.1)",
     "durable_s", "argosy", "disk_floor_s"),
    ("argosy persist (snapshot in memory to durable) / disk floor",
     "persist_s", "argosy", "disk_floor_s"),
    ("argosy time to durable / DLRover's (target <= 1.0)", "durable_s", "dlrover", "durable_s"),
    ("argosy time to durable / DLRover's with its file fsynced",
     "durable_s", "dlrover", "synced_s"),
]  # fmt: skip


PAIRED = [  # (what, peer, its pairs): per-pair ratios, each figure over the floor just before it
    ("argosy stall, nothing to overlap / memcpy floor, per pair (target <= 1.0)",
     "argosy", "stall_pairs"),
    ("argosy stall, nothing to overlap / memmove floor (its copy alone, in-process), per pair",
     "argosy", "memmove_stall_pairs"),
    ("argosy time to durable / disk floor, per pair (target <= 1.1)", "argosy", "durable_pairs"),
    ("argosy persist (snapshot in memory to durable) / disk floor, per pair",
     "argosy", "persist_pairs"),
    ("DLRover stall (memory save) / memcpy floor, per pair", "dlrover", "stall_pairs"),
    ("DLRover time to durable / disk floor, per pair", "dlrover", "durable_pairs"),
    ("DLRover with its file fsynced / disk floor, per pair", "dlrover", "synced_pairs"),
]  # fmt: skip


def ratios(peers: dict[str, dict]) -> list[str]:
    a, out = peers.get("argosy", {}), []
    for label, key, peer, peer_key in RATIOS:
        mine, theirs = a.get(key), peers.get(peer, {}).get(peer_key)
        if isinstance(mine, float) and isinstance(theirs, float) and theirs > 0:
            out.append(f"{label}: {mine / theirs:.2f}")
        else:
            out.append(f"{label}: n/a ({peer} missing)")
    for label, peer, key in PAIRED:
        p = peers.get(peer, {}).get(key)
        if p:
            out.append(f"{label}: {_pairs(p)}")
    out += _timeline(a)
    return out + _dlrover_synced(a, peers.get("dlrover", {})) + _duel(peers.get("duel", {}))


def _timeline(a: dict) -> list[str]:
    """When argosy's durable saves' phases happened (medians, seconds from `save`): a write
    that follows the copy starts before the copy ends."""
    keys = ("copy_end_s", "write_start_s", "write_end_s", "commit_s")
    if not all(isinstance(a.get(k), float) for k in keys):
        return []
    copy_end, start, end, commit = (a[k] for k in keys)
    follows = "follows the copy" if start < copy_end else "waits for the copy"
    return [
        f"argosy durable save, s from save (medians): copy ends {copy_end:.3f}, write"
        f" {start:.3f}-{end:.3f} ({follows}), commit {commit:.3f}"
    ]


def _pairs(p: dict) -> str:
    """Per-pair ratios: median over n (lowest, highest); for a bracket (floor, save, floor),
    over the two floors' mean, then over the faster floor, and the floors' drift."""
    line = f"median {p['median']:.2f} over {p['pairs']} pairs ({p['low']:.2f}-{p['high']:.2f})"
    if "over_faster" in p:
        f, d = p["over_faster"], p["drift"]
        line = (
            f"{line} over the mean of the floors before and after; over the faster of the two"
            f" {f['median']:.2f} ({f['low']:.2f}-{f['high']:.2f}), over the one before"
            f" {p['over_before']['median']:.2f}, after {p['over_after']['median']:.2f};"
            f" floor after / before {d['median']:.2f} ({d['low']:.2f}-{d['high']:.2f})"
        )
    return line


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})"


def _duel(d: dict) -> list[str]:
    """The duel's lines: both over their floors, and head to head, round by round."""
    if "head_to_head" not in d:
        return []
    return [
        f"duel, argosy time to durable / disk floor: {_pairs(d['durable_pairs'])}",
        f"duel, DLRover with its file fsynced / disk floor: {_pairs(d['synced_pairs'])}",
        "duel, argosy time to durable / DLRover's with its file fsynced, same round"
        f" (target <= 1.0): {_spread(d['head_to_head'])}",
        "duel, the same, each over the mean of its two floors:"
        f" {_spread(d['head_to_head_over_floors'])}",
    ]


def _dlrover_synced(a: dict, d: dict) -> list[str]:
    """argosy's durable against DLRover's with its file fsynced, each over the floor of its
    own pairs (the two run in different processes, minutes apart: their floors differ)."""
    if "synced_pairs" not in d:
        return []
    out = [
        f"DLRover wrote {d['file_bytes']:,} bytes per step (the state: {a.get('bytes', 0):,});"
        f" its fsync alone took {d['synced_fsync_s']:.3f} s (median)"
    ]
    if a.get("durable_pairs") and d["synced_pairs"]:
        ratio = a["durable_pairs"]["median"] / d["synced_pairs"]["median"]
        out.append(
            "argosy time to durable / DLRover's with its file fsynced, each over its own"
            f" pairs' floors (target <= 1.0): {ratio:.2f}"
        )
    return out
