"""`argosy server`: the control plane (REST API, store, scheduler loop, executor).

argosy server                                  # 127.0.0.1:8275, SQLite in ~/.argosy
argosy server --executor ray --ray-address 127.0.0.1:6379 --queues queues.yaml
argosy server --config server.yaml             # any ServerConfig field (flags win)

FastAPI and uvicorn are imported only when the server starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import typer

from argosy.cli.paths import writable_dir
from argosy.core.errors import ArgosyError
from argosy.core.net import DEFAULT_PORT


def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535, help="TCP port."),
    db: str | None = typer.Option(None, "--db", help="SQLAlchemy URL; default SQLite in home."),
    executor: str = typer.Option("local", "--executor", help="local or ray."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster address."),
    queues: Path | None = typer.Option(None, "--queues", help="Queue tree YAML."),
    home: Path | None = typer.Option(
        None, "--home", help="Default: $ARGOSY_HOME, /var/lib/argosy for root, ~/.argosy."
    ),
    slots: int = typer.Option(0, "--slots", min=0, help="CPU slots (local, no accelerator)."),
    policy: str = typer.Option("argosy", "--policy", help="Scheduling policy."),
    config_file: Path | None = typer.Option(
        None, "--config", help="YAML of ServerConfig fields (e.g. scheduler knobs)."
    ),
    run_as: str | None = typer.Option(
        None, "--run-as", help="Root server: the user jobs run as (default argosy-job[-queue])."
    ),
    allow_root_jobs: bool = typer.Option(
        False, "--allow-root-jobs", help="Root server: run jobs as root (no isolation)."
    ),
) -> None:
    """Run the control plane: REST API under /api/v1, OpenAPI at /docs."""
    try:
        import uvicorn  # noqa: F401 (the 'server' extra's, checked here for its message)

        from argosy.core import bounded_http
        from argosy.server.app import create_app
        from argosy.server.config import ServerConfig
    except ImportError as err:
        raise ArgosyError(f"argosy server needs the 'server' extra: {err}") from err
    from argosy.executors import executors
    from argosy.scheduler.policies import policies

    executors.canonical(executor)  # unknown names list the known ones
    policies.canonical(policy)
    if queues is not None and not queues.exists():
        raise ArgosyError(f"queues file '{queues}' not found")
    values = {
        "host": host,
        "port": port,
        "db_url": db,
        "executor": executors.canonical(executor),
        "ray_address": ray_address,
        "queues_file": queues,
        "local_slots": slots,
        "policy": policies.canonical(policy),
        "run_as": run_as,
        "allow_root_jobs": allow_root_jobs,
    }
    if home is not None:
        values["home"] = home
    config = _with_file(ServerConfig, config_file, values)
    writable_dir(config.home, "--home" if home is not None else "home ($ARGOSY_HOME or ~/.argosy)")
    os.umask(0o077)  # what the server writes is its own (docs/server.md, Isolation)
    from argosy.server.state_dir import check_job_user, job_identity, secure_home

    identity = job_identity(config)
    check_job_user(secure_home(config, identity), identity)  # a setup jobs can't run in fails
    if config.executor == "ray":  # ray.init would wait minutes on an address nobody answers
        from argosy.executors.ray_address import (
            asks_for_token,
            check_own_token,
            check_reachable,
            refuse_open_cluster,
        )

        head_uids = tuple(config.ray_head_uids)
        address = check_reachable(config.ray_address, head_uids=head_uids)
        config = config.model_copy(update={"ray_address": address})
        asks = asks_for_token(config.ray_address)  # before Ray's client connects there
        if identity is not None and identity.active:
            refuse_open_cluster(config.ray_address, probe=lambda _: asks)
        if asks:
            check_own_token(config.ray_address)
            warn_takeable_head(config.ray_address)
    sockets = listen(host, port)
    app = create_app(config)
    bound = sockets[0].getsockname()[1]
    where = f"[{host.strip('[]')}]" if ":" in host else host

    def announce() -> None:
        typer.echo(f"argosy server on http://{where}:{bound} (home {config.home})", err=True)

    with _quiet_startup_failure(app):
        started = bounded_http.serve(
            app, sockets, config.http.bounds(), announce, log_level="warning"
        )
    if not started:
        raise startup_failure(app)


def listen(host: str, port: int) -> list:
    """The server's listening sockets (`host:port`, and the other loopback family's
    address at the same port, so that no job can take it beside the server);
    `ArgosyError` naming the owner when the port is held."""
    from argosy.core.listeners import PortHeldError, bind_listening

    try:
        return bind_listening(host, port)
    except PortHeldError as err:
        raise ArgosyError(
            f"{err}: another process (perhaps an earlier server, or a job that took the"
            " port while the server was down) listens there; stop it, or pick --port"
        ) from err
    except OSError as err:
        raise ArgosyError(f"cannot listen at {host}:{port}: {err.strerror or err}") from err


@contextlib.contextmanager
def _quiet_startup_failure(app) -> Iterator[None]:  # noqa: ANN001
    """uvicorn logs a failed application startup with its traceback; while the failure
    is one `startup_failure` says in a line, those records are dropped."""

    def keep(_record: logging.LogRecord) -> bool:
        return startup_failure(app, or_none=True) is None

    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn")]
    for logger in loggers:
        logger.addFilter(keep)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(keep)


def startup_failure(app, *, or_none: bool = False) -> Exception | None:  # noqa: ANN001
    """The startup error of `app` as one line (`ArgosyError`): a bad queues file, store
    URL or setup; None with `or_none` for no such error (otherwise a plain one)."""
    err = getattr(app.state, "startup_error", None)
    if isinstance(err, ArgosyError):
        return err
    if or_none:
        return None
    return ArgosyError(
        f"argosy server did not start: {err!r}" if err else "argosy server did not start"
    )


def warn_takeable_head(address: str) -> None:
    """A warning when the Ray head is on this host at a port any user may bind: checked
    at start (`refuse_foreign_listener`), but Ray's client reconnects by itself if the
    head goes down later, and would send the token to a job that took the port."""
    from argosy.core.listeners import anyone_may_bind

    host, _, port = address.rpartition(":")
    if anyone_may_bind(host, int(port)):
        typer.echo(
            f"warning: the Ray head {address} is on this host at a port any user may bind;"
            " should the head go down while the server runs, Ray's client reconnects by"
            " itself and would send its token to a job that took the port: start the head"
            " on a port below 1024 (ray start --head --port 637, as root or with"
            " CAP_NET_BIND_SERVICE), or run no jobs on the head's host",
            err=True,
        )


def _with_file(model, path: Path | None, flags: dict):  # noqa: ANN001, ANN202
    """The config from `path` (validated with its line numbers), then the flags that
    differ from their defaults."""
    if path is None:
        return model.model_validate(flags)
    from argosy.core.documents import load_yaml, validate

    if not path.exists():
        raise ArgosyError(f"config file '{path}' not found")
    from_file = validate(model, load_yaml(path)).model_dump(exclude_unset=True)
    defaults = model.model_validate({}).model_dump()
    given = {k: v for k, v in flags.items() if k not in defaults or v != defaults[k]}
    return model.model_validate(from_file | given)
