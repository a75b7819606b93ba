"""The `argosy` command line: thin commands that parse, call a layer, and print.

Nothing here imports torch, ray or fastapi at module level; commands that need them
import inside the command body.
"""
