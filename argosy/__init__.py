"""argosy: get the most useful work out of accelerator clusters.

The package root imports nothing heavy: `import argosy` must stay cheap so that
`argosy --help`, `argosy plan` and `argosy sim` never load torch, ray or fastapi.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
