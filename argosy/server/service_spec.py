"""The service spec: what a service YAML (and the body of `POST /api/v1/services`) holds.

A service is an inference endpoint: `replicas` processes of `argosy serve`, one device
each, placed by the scheduler like jobs and restarted when they exit. Imports only
pydantic and the core, so the CLI validates a file before anything goes over the wire:

    doc = load_yaml(Path("svc.yaml"))
    kind = document_kind(doc)            # "service" (a `kind: service` or a `model` key)
    spec = validate(ServiceSpec, doc)    # ConfigError: svc.yaml:3 field 'replicas': ...
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from argosy.core.documents import Document
from argosy.core.errors import ConfigError
from argosy.server.spec import NAME_PATTERN

SPECULATIVE_PATTERN = r"^[a-z0-9_-]{1,32}$"


class ServiceSpec(BaseModel):
    """An inference service: `replicas` copies of `argosy serve --model M`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["service"] = "service"
    """Marks the file as a service for `argosy submit` (optional)."""
    name: str = Field(pattern=NAME_PATTERN)
    """Service name (letters, digits, `.`, `_`, `-`); need not be unique."""
    queue: str = Field(default="default", min_length=1, max_length=100)
    """Leaf queue whose quota the replicas use."""
    model: str = Field(default="smollm2-135m", min_length=1, max_length=4096)
    """Model served (`argosy serve --model`): a catalog name or a checkpoint directory."""
    engine: str = Field(default="transformers", min_length=1, max_length=64)
    """Serving engine (`argosy serve --engine`)."""
    speculative: str = Field(default="auto", pattern=SPECULATIVE_PATTERN)
    """Speculative decoding (`argosy serve --speculative`): off, ngram or auto."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads per replica (`argosy serve --threads`); 0: the engine's default."""
    replicas: int = Field(default=1, ge=1, le=256)
    """Replicas, one device each; the scheduler places each on its own."""
    chips: list[str] = Field(default_factory=list, max_length=32)
    """Chip types the replicas accept (catalog names); empty: any chip the cluster has."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of replica 0 (replica i listens on port + i); 0: a free port per replica."""
    max_restarts: int = Field(default=10, ge=0, le=10_000)
    """Restarts of one replica after it exits or fails its health probes, before the
    service is failed."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Priority of the service's workload in its queue."""


def document_kind(doc: Document) -> str:
    """ "service" or "job": a `kind` key says which; otherwise a `model` key without a
    `script` marks a service."""
    data = doc.data
    if not isinstance(data, dict):
        raise ConfigError("a job or service file is a mapping of keys to values", source=doc.source)
    kind = data.get("kind")
    if kind is None:
        return "service" if "model" in data and "script" not in data else "job"
    if kind not in ("job", "service"):
        raise ConfigError(
            f"unknown kind '{kind}'; known: job, service",
            source=doc.source,
            line=doc.line_of(("kind",)),
            field="kind",
        )
    return str(kind)
