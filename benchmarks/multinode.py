"""A node lost mid-run on a real multi-node Ray cluster: argosy's Ray executor beside Ray
Train's `TorchTrainer`, the same 2-node training, the same fault.

    nice -n 10 .venv/bin/python benchmarks/multinode.py --json multinode.json   # ~7 min
    .venv/bin/python benchmarks/multinode.py --peers argosy --steps 200 --keep

One private Ray cluster on this host (benchmarks/multinode_cluster.py), on its own ports
and temp dir: a head without chips and two raylets of `{"chip:cpu": 1}` labelled
`argosy.io/node=worker-<i>`. Each peer trains examples/train_gpt.py's tiny GPT
data-parallel on the two chip nodes (one rank each), checkpointing every `--ckpt-every`
steps into one store:

  argosy     `argosy server --executor ray`, a gang job (nnodes 2, nproc_per_node 1) of
             train_gpt.py itself (benchmarks/multinode_argosy.py).
  raytrain   TorchTrainer over train_gpt.py's model, loader and seeds, `ray.train.report`
             with a checkpoint every `--ckpt-every` steps, `FailureConfig(max_failures=3)`
             (benchmarks/multinode_raytrain.py).

At `--kill-step` (mid-interval between two checkpoints, the same for both) the node that
hosts rank 1 dies (SIGKILL to its raylet and everything under it); a replacement raylet
with the same resources and label (the host back) joins `--rejoin-after-s` later.
Measured (benchmarks/multinode_fault.py): the step at the kill, the newest checkpoint
then, the step the next attempt resumed from (steps lost, and the seconds trained since
that step was first reached), when Ray's node table showed the node dead, and the
seconds from the kill to the first step trained again. For argosy also:
`/api/v1/health` latency sampled every 100 ms through the run (target p99 < 200 ms),
and a second gang cancelled while it trains, timed until Ray's placement group table no
longer lists its group (target <= 10 s). The table ends with argosy / Ray Train
for steps lost and seconds to resume (target <= 1).

Everything started here is stopped on exit, on failure and on Ctrl-C; `--keep` leaves
the logs (Ray's, the server's, the runs) in the printed directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from multinode_argosy import run_argosy
from multinode_cluster import LocalCluster
from multinode_raytrain import run_raytrain
from rich.console import Console
from rich.table import Table

PEERS = ("argosy", "raytrain")
TARGET_P99_MS, TARGET_CANCEL_S, TARGET_RATIO = 200.0, 10.0, 1.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="training steps of each run")
    p.add_argument("--ckpt-every", type=int, default=5, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.1, help="seconds added to a step")
    p.add_argument("--kill-step", type=int, default=None, help="default: mid-interval at 40%%")
    p.add_argument("--rejoin-after-s", type=float, default=20.0, help="replacement node delay")
    p.add_argument("--peers", default=",".join(PEERS), help="comma list of argosy,raytrain")
    p.add_argument("--timeout-s", type=float, default=240.0, help="longest wait of one phase")
    p.add_argument(
        "--ray-health",
        choices=("fast", "default"),
        default="fast",
        help="fast: Ray declares a node dead after ~3 missed 1 s checks (as the tests do)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--keep", action="store_true", help="leave the logs and the Ray temp dir")
    args = p.parse_args(argv)
    unknown = set(args.peers.split(",")) - set(PEERS)
    if unknown:
        p.error(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
    return args


def kill_step(steps: int, every: int) -> int:
    """Mid-interval after 40% of the run: half an interval past a checkpoint."""
    return max(every, round(0.4 * steps / every) * every) + every // 2 + 1


def plan_of(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "steps": args.steps,
        "ckpt_every": args.ckpt_every,
        "step_sleep": args.step_sleep,
        "kill_step": args.kill_step or kill_step(args.steps, args.ckpt_every),
        "rejoin_after_s": args.rejoin_after_s,
        "timeout_s": args.timeout_s,
    }


def scrub_argosy() -> None:
    """Remove argosy's placement groups and actors a failed run left in the cluster, so
    the next peer finds every chip free."""
    import ray
    from ray.util import list_named_actors, placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    for entry in list_named_actors(all_namespaces=True):
        if entry["name"].startswith("argosy-"):
            ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]))
    for entry in placement_group_table().values():
        if entry["name"].startswith("argosy-") and entry["state"] != "REMOVED":
            group_id = ray.PlacementGroupID.from_hex(entry["placement_group_id"])
            remove_placement_group(PlacementGroup(group_id))


def run(args: argparse.Namespace, work: Path, console: Console) -> dict[str, Any]:
    plan = plan_of(args)
    report: dict[str, Any] = {"plan": plan, "peers": {}, "source": source_state()}

    def say(msg: str) -> None:
        console.print(f"[{time.strftime('%H:%M:%S')}] {msg}", highlight=False)

    t0 = time.time()
    with LocalCluster(work, workers=2, fast_health=args.ray_health == "fast") as cluster:
        try:
            cluster.connect()
            report["cluster"] = {"address": cluster.address, "start_s": time.time() - t0}
            say(f"cluster up at {cluster.address} in {time.time() - t0:.1f} s; plan {plan}")
            for peer in args.peers.split(","):
                say(f"{peer}: start")
                started = time.time()
                result = run_peer(peer, cluster, plan, work, say)
                result["wall_s"] = time.time() - started
                report["peers"][peer] = result
                say(f"{peer}: done in {result['wall_s']:.0f} s")
        finally:
            cluster.stop(keep=args.keep)
    report["runtime_s"] = time.time() - t0
    report["ratios"] = ratios(report["peers"])
    return report


def source_state() -> dict[str, Any]:
    """The commit measured, and the argosy files changed beside it (read-only git)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip()

    return {"head": git("rev-parse", "HEAD"), "dirty": git("status", "--short", "argosy")}


def run_peer(
    peer: str, cluster: LocalCluster, plan: dict[str, Any], work: Path, say: Any
) -> dict[str, Any]:
    """One peer's scenario; an error it raises is kept in its result."""
    try:
        if peer == "argosy":
            result = run_argosy(cluster, plan, work / "argosy", say)
            scrub_argosy()
            return result
        return run_raytrain(cluster, plan, work / "raytrain", say)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}


def ratios(peers: dict[str, Any]) -> dict[str, float | None]:
    a = peers.get("argosy", {}).get("fault", {})
    r = peers.get("raytrain", {}).get("fault", {})
    out = {}
    for key in ("steps_lost", "seconds_lost", "resume_s"):
        x, y = a.get(key), r.get(key)
        out[key] = x / y if x is not None and y else None
    return out


def table(report: dict[str, Any]) -> Table:
    """Side by side, with argosy / Ray Train and the issue's targets."""
    peers = report["peers"]
    t = Table(title=f"node loss on a 2-node gang (kill at step {report['plan']['kill_step']})")
    t.add_column("")
    for column in ("argosy", "Ray Train", "argosy / Ray Train", "target"):
        t.add_column(column, justify="right")
    a, r = peers.get("argosy", {}), peers.get("raytrain", {})
    fa, fr = a.get("fault", {}), r.get("fault", {})
    rows = [
        ("final state", _state(a), _state(r), "", "succeeded"),
        ("step at the kill", *_pair(fa, fr, "step_at_kill"), "", ""),
        ("newest checkpoint at the kill (*)", *_pair(fa, fr, "committed_at_kill"), "", ""),
        ("resumed from step", *_pair(fa, fr, "resumed_from"), "", ""),
        ("steps lost", *_pair(fa, fr, "steps_lost"), _ratio(report, "steps_lost"), "<= 1"),
        ("seconds lost (resumed step -> kill)", *_pair(fa, fr, "seconds_lost", 2), "", ""),
        ("seconds per step before the kill", *_pair(fa, fr, "step_s", 3), "", ""),
        ("Ray: node dead after, s", *_pair(fa, fr, "ray_detect_s", 1), "", ""),
        ("attempt ended after, s", _num(a.get("lost_s"), 1), "", "", ""),
        ("replacement joined after, s", *_joined(fa, fr), "", ""),
        (
            "kill -> training again, s",
            *_pair(fa, fr, "resume_s", 1),
            _ratio(report, "resume_s"),
            "<= 1",
        ),
        ("joined -> training again, s", *_pair(fa, fr, "after_rejoin_s", 1), "", ""),
    ]
    health = a.get("health", {})
    cancel = a.get("cancel", {})
    rows += [
        ("/health p50 / p99, ms", _health(health), "", "", f"p99 < {TARGET_P99_MS:.0f}"),
        ("cancel -> placement group gone, s", _num(cancel.get("pg_gone_s"), 2), "", "", "<= 10"),
        ("cancel -> job cancelled, s", _num(cancel.get("ended_s"), 2), "", "", ""),
    ]
    for row in rows:
        t.add_row(*[str(x) for x in row])
    return t


def _state(peer: dict[str, Any]) -> str:
    final = peer.get("final") or {}
    if "state" in final:
        return f"{final['state']} ({final.get('attempts')} attempts)"
    if "ok" in final:
        return "succeeded" if final["ok"] else "failed"
    return "-" if not peer else "error"


def _pair(a: dict, b: dict, key: str, digits: int = 0) -> tuple[str, str]:
    return _num(a.get(key), digits), _num(b.get(key), digits)


def _joined(a: dict, b: dict) -> tuple[str, str]:
    def one(f: dict) -> str:
        return _num(f["registered_t"] - f["kill_t"], 1) if f.get("registered_t") else "-"

    return one(a), one(b)


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(report: dict[str, Any], key: str) -> str:
    x = report["ratios"].get(key)
    return "-" if x is None else f"{x:.2f}"


def _health(h: dict[str, Any]) -> str:
    if not h.get("samples"):
        return "-"
    return f"{h['p50_ms']:.1f} / {h['p99_ms']:.1f} (n {h['samples']}, {h['errors']} errors)"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 120)
    signal.signal(signal.SIGTERM, _interrupt)  # a kill cleans up as Ctrl-C does
    work = Path(tempfile.mkdtemp(prefix="argosy-multinode-"))
    report: dict[str, Any] = {}
    try:
        report = run(args, work, console)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    console.print(table(report))
    console.print(
        "(*) argosy: newest step committed in the store (manifest on disk); Ray Train: "
        "newest step whose ray.train.report(checkpoint=...) had returned"
    )
    load = os.getloadavg()
    console.print(
        f"runtime {report['runtime_s']:.0f} s on {os.cpu_count()} cores, load {load[0]:.1f}"
    )
    for peer, result in report["peers"].items():
        for where in (result, result.get("fault", {})):
            if where.get("error"):
                console.print(f"{peer}: {where['error']}", highlight=False)
    if args.keep:
        console.print(f"logs kept in {work}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
