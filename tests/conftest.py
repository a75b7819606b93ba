"""Root of the test tree: its presence puts `tests/` on the import path (pytest's prepend
mode), so every test folder can import the shared helpers, e.g. `from cli_helpers import argosy`."""
