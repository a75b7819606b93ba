"""One-node, one-rank attempts: of a script written into the test's folder, or of a
command run as the attempt's launch."""

from __future__ import annotations

from pathlib import Path

from argosy.executors.base import LaunchRequest


def script_request(
    tmp_path: Path, job_id: str, text: str, args: tuple[str, ...], queue: str | None = None
) -> LaunchRequest:
    """Attempt 1 of `job_id` (of `queue`): `text` as its script, run with `args`, no
    restarts."""
    script = tmp_path / f"{job_id}-script.py"
    script.write_text(text)
    return LaunchRequest(
        job_id=job_id,
        attempt=1,
        script=str(script),
        args=args,
        nproc_per_node=1,
        run_dir=tmp_path / "runs" / job_id,
        nodes={"h": 1},
        chip="cpu",
        max_restarts=0,
        queue=queue,
    )


def command_request(
    base: Path, job_id: str, command: tuple[str, ...], queue: str | None = None
) -> LaunchRequest:
    """Attempt 1 of `job_id` (of `queue`): `command` itself run as its launch."""
    return LaunchRequest(
        job_id=job_id,
        attempt=1,
        script="",
        args=(),
        nproc_per_node=1,
        run_dir=base / "runs" / job_id,
        nodes={"h": 1},
        chip="cpu",
        command=command,
        queue=queue,
    )
