"""`argosy zygote`: the node's zygote, which forks serving workers with torch already imported.

argosy zygote          # on $ARGOSY_ZYGOTE_SOCKET, else ~/.cache/argosy/zygote/zygote.sock
argosy zygote --warm-model smollm2-135m   # also load that model's tokenizer once
argosy serve --zygote ~/.cache/argosy/zygote/zygote.sock --admin-token T

One zygote per node serves every `argosy serve` there: a service forks its worker from it
(well under a second instead of a fresh Python's torch import), so sleep level 2 can end the
worker and still wake fast. The zygote runs in the foreground until SIGTERM or Ctrl-C;
workers it forked keep serving their services after it stops. It lowers its own rlimits to
a job's (`argosy.executors.limits.job_rlimits`: processes, open files, file size) before
it preloads, so every worker it forks starts under them, as a server-started attempt does.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import typer


def zygote(
    socket_path: str = typer.Option(
        "", "--socket", envvar="ARGOSY_ZYGOTE_SOCKET", help="Unix socket path to listen on."
    ),
    warm_model: list[str] = typer.Option(
        [], "--warm-model", help="Load this model's tokenizer for the workers (repeatable)."
    ),
) -> None:
    """Run the node zygote: preload torch and transformers, fork workers for argosy serve."""
    import logging

    from argosy.executors.limits import JobLimitsConfig, job_rlimits, lower_own_rlimits
    from argosy.serving.worker import worker_main
    from argosy.serving.zygote import ZygoteServer, default_socket_path

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lower_own_rlimits(job_rlimits(JobLimitsConfig()))  # the workers' limits, inherited
    path = Path(socket_path).expanduser() if socket_path else default_socket_path()
    if warm_model:
        from argosy.serving.models import resolve_name_only

        for name in warm_model:
            resolve_name_only(name)  # unknown names fail here, listing the known ones
    server = ZygoteServer(path, target=worker_main, warm_models=warm_model)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    typer.echo(f"argosy zygote: preloading, then listening on {path}", err=True)
    try:
        server.start()
        typer.echo(f"argosy zygote ready on {path}", err=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
