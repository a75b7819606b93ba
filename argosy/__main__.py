"""`python -m argosy` is the `argosy` command."""

from argosy.cli.app import main

if __name__ == "__main__":
    main()
