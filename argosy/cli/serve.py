"""`argosy serve`: an OpenAI-compatible inference server over one engine.

argosy serve                                              # smollm2-135m on 127.0.0.1:8000
argosy serve --model smollm2-135m --port 8001 --speculative ngram
curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
  -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}'

The engine runs in a worker process (`argosy.serving.worker`): the HTTP process never
imports torch, and `POST /admin/sleep` (enabled by `--admin-token` or
`$ARGOSY_ADMIN_TOKEN`) can stop the worker to give back nearly all memory. With
`--zygote SOCKET` (a running `argosy zygote`) the worker is forked from the node zygote, so
waking from that level takes about a second instead of a fresh torch import.
`--served-model-name` is the name clients send as `model` (default: `--model`).
`--set KEY=VALUE` (repeatable) sets any other `EngineConfig` field, e.g.
`--set prefix_cache_tokens=0` (no prefix cache) or `--set prefill_chunk_tokens=256`.
`--device` and `--dtype` choose where the weights, KV cache and drafts live (auto: the first
GPU in bfloat16 when there is one, else the CPU in float32).
`--memory-fraction F` gives the service F x its device's memory: the share is claimed in
the node's device ledger first (refused, exit 2, when the device's sum would pass 1.0),
the engine sizes its KV cache from it, and the claim is released when the server stops.
FastAPI and uvicorn are imported only when the server starts.

The port is held from the first moment: `serve` binds and listens on it before the model
loads (a port another process holds fails at once, exit 2, naming the port), and answers
every request with 503 `{"status": "loading"}` until the model is loaded; `/live` is 200
only from then on. Started by `argosy server`, the replica reads its proof key from
`$ARGOSY_REPLICA_PROOF_KEY` (removed from the environment its worker inherits) and proves
on `/live?nonce=N` that it is the replica the control plane started
(`argosy.serving.admin.replica_proof`).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from argosy.core.errors import ArgosyError
from argosy.serving.placement import parse_device, parse_dtype

if TYPE_CHECKING:
    from argosy.serving.budget import DeviceLedger
    from argosy.serving.config import EngineConfig


def _fraction(value: float | None) -> float | None:
    """`--memory-fraction` in (0, 1], else a usage error (exit 2) naming the option."""
    if value is not None and not 0 < value <= 1:
        raise typer.BadParameter(f"must be in (0, 1], not {value:g}")
    return value


def _placed(parse: Callable[[str], str]) -> Callable[[str], str]:
    """A `--device`/`--dtype` callback: the canonical form, else a usage error (exit 2)."""

    def check(value: str) -> str:
        try:
            return parse(value)
        except ArgosyError as err:
            raise typer.BadParameter(str(err)) from None

    return check


def serve(
    model: str = typer.Option("smollm2-135m", "--model", help="Catalog name or checkpoint dir."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port."),
    engine: str = typer.Option("transformers", "--engine", help="Serving engine."),
    speculative: str = typer.Option(
        "auto",
        "--speculative",
        help="off, auto (adaptive), ngram (prompt-lookup), self[:K] (early-exit) or draft:PATH.",
    ),
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads; 0: default."),
    admin_token: str = typer.Option(
        "", "--admin-token", envvar="ARGOSY_ADMIN_TOKEN", help="Enables /admin/sleep, /wake."
    ),
    zygote: str = typer.Option(
        "", "--zygote", envvar="ARGOSY_ZYGOTE_SOCKET", help="Fork the worker from this zygote."
    ),
    memory_fraction: float | None = typer.Option(
        None,
        "--memory-fraction",
        callback=_fraction,
        help="Share of the device's memory (0 < F <= 1); others may share the device.",
    ),
    device: str = typer.Option(
        "auto",
        "--device",
        callback=_placed(parse_device),
        help="auto, cpu, cuda or cuda:N (auto: the GPU when there is one).",
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        callback=_placed(parse_dtype),
        help="auto, bfloat16, float16 or float32 (auto: bf16 on GPU, fp32 CPU).",
    ),
    max_batch_size: int = typer.Option(
        32, "--max-batch-size", min=1, max=256, help="Most requests decoded together."
    ),
    served_model_name: str = typer.Option(
        "", "--served-model-name", help="The model's name in the API (default: --model)."
    ),
    api_key_file: Path | None = typer.Option(  # noqa: B008 (typer's idiom)
        None,
        "--api-key-file",
        help="Require this key (first line) as 'Authorization: Bearer' on /v1/*; "
        "or set ARGOSY_SERVE_API_KEY. Never on the command line: every user sees it.",
    ),
    settings: list[str] = typer.Option(  # noqa: B008 (typer's idiom)
        [], "--set", help="Another engine setting, KEY=VALUE (repeatable): prefix_cache_tokens=0."
    ),
) -> None:
    """Serve a model: /v1/models, /v1/completions, /v1/chat/completions, /metrics."""
    from argosy.serving import ENGINES, EngineConfig, placement
    from argosy.serving.speculative import check_spec

    ENGINES.canonical(engine)  # unknown names exit 2 listing the known ones
    check_spec(speculative)  # and a draft:PATH without a checkpoint, before any load
    if memory_fraction is not None:  # the ledger and the engine agree on the device
        device = placement.resolve_device(device, placement.visible_cuda_count())
    try:
        import uvicorn  # noqa: F401

        from argosy.serving.api import build_app  # noqa: F401
    except ImportError as err:
        raise ArgosyError(f"argosy serve needs the 'server' and 'serve' extras: {err}") from err
    config = _engine_config(
        EngineConfig,
        {
            "model": model,
            "engine": engine,
            "speculative": speculative,
            "num_threads": threads,
            "memory_fraction": memory_fraction,
            "device": device,
            "dtype": dtype,
            "max_batch_size": max_batch_size,
        },
        settings,
    )
    from argosy.serving.admin import PROOF_KEY_ENV
    from argosy.serving.api_key import read_key

    api_key = read_key(api_key_file, dict(os.environ))
    proof_key = os.environ.pop(PROOF_KEY_ENV, "").strip().encode() or None  # not the worker's
    ledger, claim = _claim(memory_fraction, device, f"{model} on port {port}")
    try:
        name = served_model_name.strip() or model
        _run(config, host, port, admin_token, zygote, name, api_key, proof_key)
    finally:
        if ledger is not None:
            ledger.release(claim)


def _engine_config(
    model: type[EngineConfig], fields: dict[str, object], settings: list[str]
) -> EngineConfig:
    """The flags' fields plus `--set KEY=VALUE` ones; a malformed or invalid one exits 2."""
    from pydantic import ValidationError

    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in model.model_fields:
            known = ", ".join(sorted(model.model_fields))
            raise typer.BadParameter(f"--set takes KEY=VALUE with KEY one of {known}: {item!r}")
        if key.strip() in fields:  # e.g. memory_fraction: its flag also claims the ledger
            raise typer.BadParameter(f"--set {key.strip()}: use its own flag")
        fields[key.strip()] = value.strip()
    try:
        return model(**fields)  # type: ignore[arg-type]  # pydantic validates the strings
    except ValidationError as err:
        raise typer.BadParameter(f"--set: {err}") from None


def _claim(fraction: float | None, device: str, name: str) -> tuple[DeviceLedger | None, str]:
    """Place the share in the node's ledger of the engine's device (`cpu`, or the physical
    GPU behind `cuda:N`); a `ShareError` (exit 2) names the device's current sum."""
    if fraction is None:
        return None, ""
    from argosy.serving.budget import DeviceLedger
    from argosy.serving.placement import device_key

    ledger = DeviceLedger(device_key(device))
    return ledger, ledger.claim(fraction, name)


def _run(
    config: EngineConfig,
    host: str,
    port: int,
    admin_token: str,
    zygote: str,
    name: str,
    api_key: str | None = None,
    proof_key: bytes | None = None,
) -> None:
    """Hold the port, load the engine in its worker (503 meanwhile), and serve until
    SIGTERM/SIGINT."""
    import uvicorn

    from argosy.core import bounded_http
    from argosy.serving.api import build_app
    from argosy.serving.worker import WorkerEngine

    instance = WorkerEngine(config, zygote_socket=Path(zygote).expanduser() if zygote else None)
    sock = _listen(host, port)  # before the model loads: no other process can take the port
    port = sock.getsockname()[1]
    app = build_app(
        instance,
        served_name=name,
        admin_token=admin_token or None,
        api_key=api_key,
        proof_key=proof_key,
        address=f"{host}:{port}",
    )
    gate = _Loading(app)
    server = uvicorn.Server(
        uvicorn.Config(gate, lifespan="off", log_level="warning", **bounded_http.uvicorn_options())
    )
    what = (
        f"{config.model} ({config.engine}, speculative {config.speculative}, "
        f"device {config.device}, dtype {config.dtype})"
    )
    typer.echo(f"loading {what}; port {port} held, answering 503 until loaded", err=True)
    failed: list[BaseException] = []

    def load() -> None:
        try:
            instance.load()
        except BaseException as err:  # the main thread raises it once the server stops
            failed.append(err)
            server.should_exit = True
            return
        gate.loaded = True
        typer.echo(f"argosy serve on http://{host}:{port}/v1 (model {name})", err=True)

    threading.Thread(target=load, name="argosy-serve-load", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        instance.close()  # after a load in progress (it holds the engine's state lock)
    if failed:
        raise _load_failure(config, failed[0])


def _load_failure(config: EngineConfig, err: BaseException) -> BaseException:
    """What a failed load raises: one `error:` line and exit 2 (the model, device or
    engine given cannot be served), or the interrupt itself."""
    if not isinstance(err, Exception):
        return err  # KeyboardInterrupt, SystemExit: as they are
    if isinstance(err, ImportError):
        return ArgosyError(f"engine '{config.engine}' needs the 'serve' extra: {err}")
    if isinstance(err, ArgosyError):
        return err
    reason = " ".join(str(err).split())  # one line, whatever the library wrote
    reason = reason.removeprefix("PlacementError: ").removeprefix("ConfigError: ")
    return ArgosyError(f"cannot serve {config.model}: {reason or type(err).__name__}")


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` and listening. A port another process holds is an
    `ArgosyError` (exit 2) naming it. No `SO_REUSEPORT`: the port has one owner."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        why = err.strerror or str(err)
        if err.errno == errno.EADDRINUSE:
            message = f"port {port} on {host} is already in use ({why}): another process holds it"
            raise ArgosyError(f"{message}; nothing was loaded") from err
        raise ArgosyError(f"cannot listen on port {port} on {host}: {why}") from err
    return sock


class _Loading:
    """The ASGI app of `argosy serve`: until `loaded`, every HTTP request is answered 503
    `{"status": "loading"}` with `Retry-After` (a probe never takes a loading replica as
    live); then `app` answers."""

    BODY = b'{"status":"loading"}'

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loaded = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.loaded or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"retry-after", b"5"),
            (b"content-length", str(len(self.BODY)).encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": self.BODY})


def train_draft(
    model: str = typer.Option("smollm2-135m", "--model", help="Catalog name or checkpoint dir."),
    out: str = typer.Option("", "--out", help="Output dir; default: <model cache>-draft."),
    layers: int = typer.Option(2, "--layers", min=1, help="Decoder layers in the draft."),
    prompts: int = typer.Option(64, "--prompts", min=2, help="Generated training prompts."),
    tokens: int = typer.Option(48, "--tokens", min=1, help="Target tokens per prompt."),
    minutes: float = typer.Option(3.0, "--minutes", min=0.05, help="Training time budget."),
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads; 0: default."),
) -> None:
    """Train a draft model from the served model's own outputs (for --speculative draft:PATH)."""
    from pathlib import Path

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from argosy.cli.common import err_console
    from argosy.serving import models

    models.resolve_name_only(model)
    import torch

    from argosy.serving.draft_training import train_draft as run

    if threads:
        torch.set_num_threads(threads)
    target = models.resolve(model, None)
    where = Path(out) if out else target.with_name(f"{target.name}-draft")
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console) as progress:
        tasks: dict[str, int] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                label = "generating from the target" if phase == "generate" else "training (s)"
                tasks[phase] = progress.add_task(label, total=total)
            progress.update(tasks[phase], completed=done, total=total)

        try:
            result = run(target, where, layers, prompts, tokens, minutes * 60, report)
        except ValueError as err:
            raise ArgosyError(str(err)) from err
    typer.echo(
        f"draft: {where}\n{result.layers} layers, {result.steps} steps on {result.sequences} "
        f"sequences in {result.seconds:.0f} s; held-out agreement with the target "
        f"{result.heldout_agreement:.1%} (loss {result.final_loss:.3f})\n"
        f"serve with: argosy serve --model {model} --speculative draft:{where}"
    )
