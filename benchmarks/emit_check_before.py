"""The same plans through an earlier revision's emitters, for a before/after emit check.

`emit_at(ref, requests)` exports `ref`'s whole `argosy` package (`git archive`) into a
temporary folder and, in a subprocess whose import path starts there, feeds each request
({"model", "emitter", "parallel"}) through that revision's `argosy.planner.emit.emitters`:
the model by name from that revision's presets, the plan as that revision's `Parallel`.
Each answer is {"status": "emitted", "text"} or {"status": "refused", "reason"}: the
revision refused the plan, does not know the model, or cannot express the plan (a field
it lacks set to other than its default, e.g. `etp` before expert tensor parallelism).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_WORKER = r"""
import dataclasses, json, sys
from argosy.planner.emit import emitters
from argosy.planner.models import load_model
from argosy.planner.parallel import Parallel

seq_len, global_batch, src, dst = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
known = {f.name for f in dataclasses.fields(Parallel)}
out = []
for req in json.load(open(src)):
    try:
        model = load_model(req["model"])
        extra = {k: v for k, v in req["parallel"].items() if k not in known}
        if any(v not in (0, None, False) for v in extra.values()):
            raise ValueError(f"this revision's plans have no field {sorted(extra)}")
        plan = Parallel(**{k: v for k, v in req["parallel"].items() if k in known})
        text = emitters.get(req["emitter"])(plan, model, seq_len=seq_len, global_batch=global_batch)
        out.append({"status": "emitted", "text": text})
    except Exception as err:  # the revision's refusal, or what it cannot take
        out.append({"status": "refused", "reason": f"{type(err).__name__}: {err}"})
json.dump(out, open(dst, "w"))
"""


def emit_at(ref: str, requests: list[dict], seq_len: int, global_batch: int) -> list[dict]:
    """One answer per request, from `ref`'s emitters (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="argosy-emit-before-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "argosy"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(requests))
        cmd = [sys.executable, "-c", _WORKER, str(seq_len), str(global_batch), str(src), str(dst)]
        proc = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode:
            raise SystemExit(f"{ref}'s emitters failed to run:\n{proc.stderr[-3000:]}")
        return json.loads(dst.read_text())
