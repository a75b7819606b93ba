"""Generic named registries for pluggable parts (accelerator backends, executors, policies)."""

from argosy.plugins.registry import Registry

__all__ = ["Registry"]
