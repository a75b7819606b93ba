"""Argosy's emitted configs against the real frameworks' own parsers and validation.

    python benchmarks/emit_check.py --install      # frameworks into the cache (once)
    python benchmarks/emit_check.py                # the matrix; table; JSON in the cache
    python benchmarks/emit_check.py --golden       # also rewrite tests/planner/golden/emitted
    python benchmarks/emit_check.py --before REF   # the same plans through REF's emitters
                                                   # (its whole package: emit_check_before.py)

The frameworks live in a cache outside the repository (default
~/.cache/argosy/emit_check): torchtitan 0.3.0 and DeepSpeed 0.19.8 from PyPI with
--no-deps (their pins fight the installed torch; the few imports they need go beside
them), Megatron-LM core_v0.16.1, 0.17.1, 0.18.2 and 0.19.0 and Megatron-DeepSpeed exported with
`git archive` from local clones (--megatron-git, --mds-git; e.g. fetched mirrors).

Matrix: the issue's six model x cluster cases x the three emitters x the planner's top
plans under that emitter's framework profile, and the best plan with every ZeRO stage x
recompute mode (the options a user switches; priced or not, they must emit or be refused). For each
plan argosy either emits a config or refuses with the reason; each emitted config goes to
the framework's parser in benchmarks/emit_check_workers.py, and what the framework
understood (its parsed objects) is compared with the plan: every degree, micro-batch,
global batch, recompute, sharding, precision, and the model shape. Mixed-chip plans go to
argosy's own runner parser (`argosy launch --plan`: parse_plan + assign_ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emit_check_before import emit_at  # noqa: E402

from argosy.hardware.loader import load_cluster  # noqa: E402
from argosy.planner.api import plan as run_plan  # noqa: E402
from argosy.planner.emit import bundle, emitters, framework_of, readers  # noqa: E402
from argosy.planner.models import load_model  # noqa: E402
from argosy.planner.parallel import Parallel  # noqa: E402
from argosy.planner.readback import EmitRefusedError, expected, mismatches  # noqa: E402

CACHE = Path.home() / ".cache" / "argosy" / "emit_check"
GOLDEN = ROOT / "tests" / "planner" / "golden" / "emitted"
CASES = [
    ("llama3-8b", "h100:64"),
    ("llama3-70b", "h100:512"),
    ("llama3-405b", "h100:16384"),
    ("mixtral-8x7b", "h100:128"),
    ("deepseek-v3-like", "h100:1024"),
    ("gpt-oss-120b", "h100:64"),
    ("llama3-70b", "a100-80g:256+h100:256"),
]
SEQ_LEN, GLOBAL_BATCH, TOP = 8192, 1024, 3
PIP = {
    "tt030": ["torchtitan==0.3.0"],
    "ds": ["deepspeed==0.19.8"],
    "extra": ["triton", "einops"],
    "extra2": [
        "tyro",
        "torchdata",
        "torch_checkpointing",
        "spmd_types==0.2.3",
        "safetensors",
        "tokenizers",
        "datasets<4.8.0",
        "tensorboard",
        "docstring-parser",
        "typeguard",
        "shtab",
        "absl-py",
        "wandb",
        "grpcio",
        "protobuf",
        "markdown",
        "werkzeug",
        "tensorboard-data-server",
        "multiprocess",
        "dill",
        "xxhash",
        "pyarrow",
        "torchao",
    ],
    "extra3": ["hjson", "ninja", "py-cpuinfo", "msgpack", "nvidia-ml-py"],
}
MEGATRON_TAGS = ("core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0")
# (worker, label, python path entries under the cache)
RUNS = [
    *(("megatron", f"Megatron-LM {tag}", [f"mlm_{tag}", "extra"]) for tag in MEGATRON_TAGS),
    ("torchtitan", "torchtitan 0.3.0", ["tt030", "extra", "extra2"]),
    ("deepspeed", "DeepSpeed 0.19.8 + Megatron-DeepSpeed", ["mds", "ds", "extra", "extra3"]),
]


def install(cache: Path, megatron_git: str | None, mds_git: str | None) -> None:
    """pip --no-deps --target for the PyPI parts; git archive for the repositories."""
    cache.mkdir(parents=True, exist_ok=True)
    for target, packages in PIP.items():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade"]
        subprocess.run([*cmd, "--target", str(cache / target), *packages], check=True)
    for tag in MEGATRON_TAGS:
        _archive(megatron_git, tag, ["megatron"], cache / f"mlm_{tag}")
    _archive(mds_git, "HEAD", ["megatron", "tools/__init__.py", "tools/retro"], cache / "mds")


def _archive(git_dir: str | None, ref: str, paths: list[str], dest: Path) -> None:
    if git_dir is None:
        raise SystemExit(f"give the git directory to export {dest.name} from (--megatron-git)")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", ref, *paths], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def build_matrix(before: str | None = None) -> tuple[list[dict], list[dict]]:
    """(rows for every plan: emitted or refused; worker items per emitter); `before`
    names an earlier revision whose emitters take the same plans instead."""
    rows: list[dict] = []
    for model_name, cluster_name in CASES:
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        for emitter in ("megatron", "torchtitan", "deepspeed"):
            fw = framework_of(emitter)
            result = run_plan(model, cluster, SEQ_LEN, GLOBAL_BATCH, TOP, framework=fw)
            for rank, entry in enumerate(_options(result["plans"])):
                base = {"case": f"{model_name}/{cluster_name}", "emitter": emitter, "rank": rank}
                row = _emit_row(emitter, result, entry, model, cluster)
                rows.append({**base, **row, "model": model_name})
            if not result["plans"]:
                rows.append(
                    {
                        "case": f"{model_name}/{cluster_name}",
                        "emitter": emitter,
                        "rank": 0,
                        "status": "refused",
                        "reason": result.get("fix", ""),
                    }
                )
    if before is not None:
        rows = _through(before, rows)
    return rows, [r for r in rows if r.get("status") == "emitted"]


def _options(plans: list[dict]) -> list[dict]:
    """The top plans, then the best one with every other ZeRO stage x recompute (the
    options a user switches), each once."""
    out, seen = list(plans), {json.dumps(p["parallel"], sort_keys=True) for p in plans}
    if not plans or plans[0].get("groups"):
        return out
    for zero in range(4):
        for recompute in ("none", "selective", "full"):
            parallel = {**plans[0]["parallel"], "zero": zero, "recompute": recompute}
            if parallel["dp"] * parallel["cp"] == 1 and zero:
                continue
            key = json.dumps(parallel, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append({"parallel": parallel})
    return out


def _through(ref: str, rows: list[dict]) -> list[dict]:
    """The rows' plans (each one this revision emitted or refused) as `ref`'s emitters
    take them: its text or refusal instead, this revision's expectations kept; a TOML
    file goes to torchtitan as `--job.config_file`, as that revision was launched."""
    todo = [r for r in rows if r["status"] in ("emitted", "refused") and "parallel" in r]
    asks = [{"model": r["model"], "emitter": r["emitter"], "parallel": r["parallel"]} for r in todo]
    for row, answer in zip(todo, emit_at(ref, asks, SEQ_LEN, GLOBAL_BATCH), strict=True):
        row.update(answer, own_mismatches=[])
        if answer["status"] == "refused":
            continue
        plan, model = Parallel(**row["parallel"]), load_model(row["model"])
        want = expected(plan, GLOBAL_BATCH, framework_of(row["emitter"]), model.is_moe)
        row["want"], row["shape"] = want.as_dict(), _shape(model)
        if row["emitter"] == "torchtitan" and not row["text"].lstrip().startswith("--"):
            path = Path(tempfile.mkdtemp()) / "job.toml"
            path.write_text(row["text"])
            row["text"] = f"--job.config_file {path}"
    return rows


def _emit_row(emitter: str, result: dict, entry: dict, model, cluster) -> dict:
    row = {"parallel": entry["parallel"], "devices": cluster.num_devices}
    if entry.get("groups"):
        return {**row, "status": "bundle", "text": bundle({**result, "plans": [entry]})}
    plan = Parallel(**entry["parallel"])
    try:
        text = emitters.get(emitter)(plan, model, seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH)
    except EmitRefusedError as err:
        return {**row, "status": "refused", "reason": str(err)}
    want = expected(plan, GLOBAL_BATCH, framework_of(emitter), model.is_moe)
    own = mismatches(want, readers[emitter](text, cluster.num_devices))
    return {
        **row,
        "status": "emitted",
        "text": text,
        "want": want.as_dict(),
        "shape": _shape(model),
        "own_mismatches": own,
    }


def _shape(model) -> dict[str, int]:
    """The model shape each framework's parsed arguments must match."""
    shape = {"layers": model.layers, "hidden": model.hidden, "heads": model.heads}
    shape |= {"experts": model.experts, "kv_lora_rank": model.kv_lora_rank}
    if model.is_mla:  # Megatron's qk_head_dim is the non-rotary part, as argosy's head_dim
        shape |= {"qk_head_dim": model.head_dim, "qk_pos_emb_head_dim": model.qk_rope_dim}
        return shape | {"v_head_dim": model.v_dim}
    return shape | {"head_dim": model.head_dim}


def run_workers(cache: Path, items: list[dict]) -> dict[str, dict]:
    """{run label: {item id: verdict}} from each framework's worker process."""
    out: dict[str, dict] = {}
    worker_py = Path(__file__).with_name("emit_check_workers.py")
    for kind, label, paths in RUNS:
        batch = [
            {"id": i, "text": r["text"], "devices": r["devices"], "shape": r["shape"]}
            for i, r in enumerate(items)
            if r["emitter"] == kind
        ]
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
            src.write_text(json.dumps(batch))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(cache / p) for p in paths)}
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, str(worker_py), kind, str(src), str(dst)],
                env=env,
                capture_output=True,
                text=True,
                cwd=tmp,
                timeout=1800,
            )
            if proc.returncode:
                raise SystemExit(f"{label} worker failed:\n{proc.stderr[-3000:]}")
            verdicts = {int(k): v for k, v in json.loads(dst.read_text()).items()}
        out[label] = {"kind": kind, "seconds": time.perf_counter() - started, **verdicts}
    return out


def score(rows: list[dict], items: list[dict], verdicts: dict[str, dict]) -> list[dict]:
    """One line per (framework run, case): accepted / refused / rejected, mismatches."""
    lines = []
    for label, results in verdicts.items():
        kind = results["kind"]
        for case in dict.fromkeys(r["case"] for r in rows):
            mine = [r for r in rows if r["case"] == case and r["emitter"] == kind]
            line = {
                "run": label,
                "case": case,
                "plans": len(mine),
                "accepted": 0,
                "refused": 0,
                "rejected": 0,
                "bundle": 0,
                "mismatches": 0,
                "errors": [],
            }
            for r in mine:
                if r["status"] in ("refused", "bundle"):
                    line[r["status"]] += 1
                    if r["status"] == "refused":
                        line["errors"].append(f"refused: {r['reason']}")
                    continue
                verdict = results[items.index(r)]
                if not verdict["accepted"]:
                    line["rejected"] += 1
                    line["errors"].append(verdict["error"])
                    continue
                line["accepted"] += 1
                bad = mismatches_of(r, verdict)
                line["mismatches"] += len(bad)
                line["errors"] += bad
            lines.append(line)
    return lines


def mismatches_of(row: dict, verdict: dict) -> list[str]:
    """Plan vs what the framework parsed, and the model shape vs the parsed shape."""
    bad = [
        f"{k}: planned {v}, parsed {verdict['parsed'].get(k)}"
        for k, v in row["want"].items()
        if verdict["parsed"].get(k) != v
    ]
    for key, want in row["shape"].items():
        got = verdict["shape"].get(key)
        if got is not None and got != want and not (key == "experts" and want == 1 and got == 1):
            bad.append(f"shape {key}: model {want}, parsed {got}")
    return bad


def check_bundles(rows: list[dict]) -> list[str]:
    """Mixed-chip bundles through `argosy launch --plan`'s own parser."""
    from argosy.runtime.mixed.plan import assign_ranks, parse_plan

    problems = []
    for r in rows:
        if r["status"] == "bundle":
            layout = parse_plan(json.loads(r["text"]))
            ranks = assign_ranks(layout)
            if len(ranks) != r["devices"] or sum(a.samples for a in ranks) <= 0:
                problems.append(f"{r['case']}: {len(ranks)} ranks for {r['devices']} devices")
    return problems


def write_golden(rows: list[dict], items: list[dict], verdicts: dict[str, dict]) -> int:
    """One file per accepted config: the text and what every parser run understood. The
    folder is rewritten whole: a plan no longer emitted leaves no stale file behind."""
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for old in GOLDEN.glob("*.json"):
        old.unlink()
    written = 0
    for r in items:
        if r["rank"] >= TOP:  # the planner's own top plans; the variants stay in the run
            continue
        parsed = {
            label: res[items.index(r)]["parsed"]
            for label, res in verdicts.items()
            if res["kind"] == r["emitter"] and res[items.index(r)]["accepted"]
        }
        runs = [label for label, res in verdicts.items() if res["kind"] == r["emitter"]]
        if len(parsed) != len(runs):
            continue
        name = f"{r['emitter']}-{r['case'].replace('/', '-').replace(':', '').replace('+', '-')}"
        doc = {
            "case": r["case"],
            "emitter": r["emitter"],
            "seq_len": SEQ_LEN,
            "global_batch": GLOBAL_BATCH,
            "devices": r["devices"],
            "parallel": r["parallel"],
            "text": r["text"],
            "parsed": parsed,
        }
        (GOLDEN / f"{name}-{r['rank']}.json").write_text(json.dumps(doc, indent=1) + "\n")
        written += 1
    return written


def versions(cache: Path) -> dict[str, str]:
    found = {}
    for dist in sorted(cache.glob("*/*.dist-info")):
        name, _, version = dist.name.removesuffix(".dist-info").rpartition("-")
        if name in ("torchtitan", "deepspeed", "triton", "tyro", "torchdata", "torchao"):
            found[name] = version
    import torch

    found["torch"] = torch.__version__
    return found


def report(lines: list[dict], bundles: list[str], vers: dict, seconds: float) -> str:
    out = [f"versions: {', '.join(f'{k} {v}' for k, v in vers.items())}"]
    out.append(
        "| framework run | case | plans | accepted | refused (reason) | rejected "
        "| mixed bundle | semantic mismatches |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    for x in lines:
        out.append(
            f"| {x['run']} | {x['case']} | {x['plans']} | {x['accepted']} | "
            f"{x['refused']} | {x['rejected']} | {x['bundle']} | {x['mismatches']} |"
        )
    total = {
        k: sum(x[k] for x in lines)
        for k in ("plans", "accepted", "refused", "rejected", "bundle", "mismatches")
    }
    out.append(f"totals: {total}; runner bundle problems: {len(bundles)}; {seconds:.0f} s")
    for x in lines:
        for err in dict.fromkeys(x["errors"]):
            out.append(f"  {x['run']} {x['case']}: {err}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--install", action="store_true", help="install the frameworks and exit")
    ap.add_argument("--megatron-git", help="git directory of NVIDIA/Megatron-LM")
    ap.add_argument("--mds-git", help="git directory of deepspeedai/Megatron-DeepSpeed")
    ap.add_argument("--golden", action="store_true", help="rewrite the golden files")
    ap.add_argument("--before", metavar="REF", help="feed the plans through REF's emitters")
    args = ap.parse_args()
    if args.install:
        install(args.cache, args.megatron_git, args.mds_git)
        return
    started = time.perf_counter()
    rows, items = build_matrix(args.before)
    verdicts = run_workers(args.cache, items)
    lines = score(rows, items, verdicts)
    bundles = [] if args.before else check_bundles(rows)
    own = sum(len(r["own_mismatches"]) for r in items)
    text = report(lines, bundles, versions(args.cache), time.perf_counter() - started)
    print(text + f"\nargosy read-back mismatches: {own}")
    (args.cache / "results.json").write_text(json.dumps({"lines": lines, "rows": rows}))
    if args.golden and not args.before:
        print(f"golden files written: {write_golden(rows, items, verdicts)}")


if __name__ == "__main__":
    main()
