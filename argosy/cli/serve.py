"""`argosy serve`: an OpenAI-compatible inference server over one engine.

argosy serve                                              # smollm2-135m on 127.0.0.1:8000
argosy serve --model smollm2-135m --port 8001 --speculative ngram
curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
  -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}'

torch, transformers, FastAPI and uvicorn are imported only when the server starts.
"""

from __future__ import annotations

import typer

from argosy.core.errors import ArgosyError


def serve(
    model: str = typer.Option("smollm2-135m", "--model", help="Catalog name or checkpoint dir."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port."),
    engine: str = typer.Option("transformers", "--engine", help="Serving engine."),
    speculative: str = typer.Option("auto", "--speculative", help="off, ngram or auto."),
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads; 0: default."),
) -> None:
    """Serve a model: /v1/models, /v1/completions, /v1/chat/completions, /metrics."""
    from argosy.serving import ENGINES, PROPOSERS, EngineConfig

    ENGINES.canonical(engine)  # unknown names exit 2 listing the known ones
    if speculative != "off":
        PROPOSERS.canonical(speculative)
    try:
        import uvicorn

        from argosy.serving.api import build_app
    except ImportError as err:
        raise ArgosyError(f"argosy serve needs the 'server' and 'serve' extras: {err}") from err
    config = EngineConfig(model=model, engine=engine, speculative=speculative, num_threads=threads)
    try:
        instance = ENGINES.get(engine)(config)
    except ImportError as err:
        raise ArgosyError(f"engine '{engine}' needs the 'serve' extra: {err}") from err
    typer.echo(f"loading {model} ({engine}, speculative {speculative})", err=True)
    instance.load()
    typer.echo(f"argosy serve on http://{host}:{port}/v1 (model {model})", err=True)
    uvicorn.run(build_app(instance, served_name=model), host=host, port=port, log_level="warning")
