"""Helpers for runtime tests: run `argosy launch` as a real process, read what it wrote."""

from __future__ import annotations

from cli_helpers import EXAMPLE, REPO, argosy, losses, summary

__all__ = ["EXAMPLE", "REPO", "argosy", "losses", "summary"]
