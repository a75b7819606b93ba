"""Where argosy's state lives by default (the server's home; the CLI reads the admin
token there): `$ARGOSY_HOME`, else `/var/lib/argosy` for root (a daemon's state, outside
root's own 0700 home so that job users can reach their run directories), else
`~/.argosy`."""

from __future__ import annotations

import os
from pathlib import Path

ROOT_HOME = Path("/var/lib/argosy")


def default_home() -> Path:
    if os.environ.get("ARGOSY_HOME"):
        return Path(os.environ["ARGOSY_HOME"]).expanduser()
    if os.geteuid() == 0:
        return ROOT_HOME
    return Path.home() / ".argosy"
