"""The FastAPI application: store, executor, control loop and routes, built once.

    app = create_app(ServerConfig(home=Path("/tmp/argosy")))
    uvicorn.run(app, host="127.0.0.1", port=8275)

The lifespan opens the store (running migrations), writes the admin token, reconciles
the jobs left running by a previous server, and starts the control loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from argosy.core.errors import ArgosyError
from argosy.executors import Executor, executors
from argosy.executors.isolation import JobIdentity
from argosy.server.access_log import AccessLog
from argosy.server.api import router
from argosy.server.auth import Tokens, ensure_admin_token
from argosy.server.config import ServerConfig
from argosy.server.console import UPLOAD_CAPS, mount_console
from argosy.server.control import Control
from argosy.server.energy_api import router as energy_router
from argosy.server.field_errors import field_errors
from argosy.server.guards import install_guards
from argosy.server.node_api import router as node_router
from argosy.server.rate_limits import RateLimits
from argosy.server.service_api import router as service_router
from argosy.server.sessions import Sessions
from argosy.server.state_dir import (
    check_job_user,
    job_identity,
    job_users,
    secure_files,
    secure_home,
)
from argosy.server.store import Store
from argosy.server.token_api import router as token_router


def make_executor(config: ServerConfig, identity: JobIdentity | None = None) -> Executor:
    """The configured executor (an unknown name lists the known ones)."""
    cls = executors.get(config.executor)
    if config.executor == "ray":
        from argosy.executors.ray import RayOptions
        from argosy.executors.ray_address import check_reachable

        address = check_reachable(config.ray_address, head_uids=tuple(config.ray_head_uids))
        return cls(
            RayOptions(
                address=address,
                suspect_s=config.ray_suspect_s,
                identity=identity,
                job_users=job_users(config),
                env_allow=tuple(config.job_env_allow),
                limits=config.job_limits,
            )
        )
    from argosy.executors.local import LocalOptions

    options = LocalOptions(
        slots=config.local_slots,
        warm=config.warm_launcher,
        node_devices=config.local_node_devices,
        identity=identity,
        env_allow=tuple(config.job_env_allow),
        limits=config.job_limits,
    )
    return cls(options)


def _start(config: ServerConfig, executor: Executor | None) -> tuple[Store, Control]:
    """The store and the control loop, the admin token written and the jobs a previous
    server left recovered."""
    identity = job_identity(config)
    settled = secure_home(config, identity)  # run dirs where job users reach them
    store = _open_store(config.database_url)
    try:
        ensure_admin_token(store, config.home)
        secure_files(config)
        ctl = Control(settled, store, executor or make_executor(settled, identity))
        check_job_user(settled, identity if executor is None else None)
        ctl.recover()
    except BaseException:
        store.close()
        raise
    return store, ctl


def _open_store(url: str) -> Store:
    """The store at `url`; `ArgosyError` in one line for a URL that cannot be opened (an
    unknown dialect, a driver not installed, a database that does not answer)."""
    try:
        return Store(url)
    except ArgosyError:
        raise
    except Exception as err:  # sqlalchemy's errors, a missing driver's ImportError
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ArgosyError(f"cannot open the store (--db / db_url): {reason}") from err


def create_app(config: ServerConfig, executor: Executor | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            store, ctl = _start(config, executor)
        except Exception as err:
            app.state.startup_error = err  # `argosy server` says it in one line
            raise
        app.state.control = ctl
        app.state.tokens = Tokens(store)
        app.state.sessions = Sessions(store, app.state.tokens, config.session_ttl_s)
        app.state.limits = RateLimits(config.token_writes_per_s, config.token_write_burst)
        from argosy.server.metrics import make_registry

        app.state.registry = make_registry(ctl)  # the first scrape pays no import
        task = asyncio.create_task(ctl.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            ctl.services.close()
            close = getattr(ctl.executor, "close", None)  # optional: the local executor's
            if close is not None:
                close()
            store.close()

    app = FastAPI(
        title="argosy",
        summary="Control plane: queues, jobs, services, nodes, events.",
        version="1",
        lifespan=lifespan,
    )
    app.include_router(router)
    app.include_router(service_router)
    app.include_router(node_router)
    app.include_router(token_router)
    app.include_router(energy_router)
    mount_console(app)  # the web console at / (pages, forms, /static)
    install_guards(app, config, UPLOAD_CAPS)  # headers, same-origin, body caps, 422s
    app.add_middleware(
        AccessLog,
        home=config.home,
        max_bytes=config.access_log_max_bytes,
        backups=config.access_log_backups,
    )
    app.add_api_route("/metrics", _metrics, methods=["GET"], include_in_schema=False)

    @app.exception_handler(ArgosyError)
    async def _user_error(_request: Request, err: ArgosyError) -> JSONResponse:
        return JSONResponse({"detail": field_errors(err)}, status_code=422)

    return app


async def _metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from argosy.server.api import principal
    from argosy.server.metrics import make_registry

    await principal(request, request.headers.get("authorization"))
    state = request.app.state
    if not hasattr(state, "registry"):
        state.registry = make_registry(state.control)
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
