"""`python -m argosy` is the `argosy` command."""

from argosy.cli.app import main

main()
