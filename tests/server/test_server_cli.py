"""The job CLI: malformed job files point at line and field, usage errors exit 2 with one
line, and every command works against a real `argosy server` process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from server_helpers import STEPS, TERMINAL, ServerProcess, running_server, wait_for

pytestmark = pytest.mark.integration


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def argosy_process(*args: str) -> subprocess.CompletedProcess:
    """The real console entry point in its own process."""
    return subprocess.run([sys.executable, "-m", "argosy", *args], capture_output=True, text=True)


@pytest.fixture
def argosy(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The console entry point in this process (a subprocess per call costs ~1 s of CPU)."""
    from argosy.cli.app import main

    def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> Result:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        if cwd is not None:
            monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["argosy", *args])
        code = 0
        try:
            main()
        except SystemExit as done:
            code = int(done.code or 0)
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


@pytest.mark.parametrize(
    ("text", "want_line", "want_field"),
    [
        ("name: a\nscript: s.py\nnproc_per_node: 0\n", 3, "nproc_per_node"),
        ("name: a\nscript: s.py\nargs: [1, 2]\ncolour: red\n", 4, "colour"),
        ("name: a\nscript: s.py\nargs: 5\n", 3, "args"),
        ("script: s.py\nqueue: default\n", 1, "name"),
        ("name: a\nscript: s.py\nchips: [h100\n", 4, None),
        ("name: a\nscript: s.py\nnproc_per_node: '2'\nnnode: 2\n", 4, "nnode"),
        (
            "name: a\nscript: s.py\nnproc_per_node: 2\ninject:\n  - kill:rank=2:step=3\n",
            4,
            "inject",
        ),
    ],
    ids=[
        "bad-value",
        "unknown-key",
        "wrong-type",
        "missing",
        "bad-yaml",
        "typo-first",
        "bad-inject",
    ],
)
def test_malformed_job_yaml_names_line_and_field(
    argosy, tmp_path: Path, text: str, want_line: int, want_field: str | None
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    r = argosy("submit", str(path), "--server", "http://127.0.0.1:1")
    assert r.returncode == 2
    assert f"job.yaml:{want_line}" in r.stderr
    if want_field:
        assert f"field '{want_field}" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "'script': 's.py'" not in r.stderr  # no echo of the whole job
    if want_field == "nnode":
        assert "did you mean 'nnodes'?" in r.stderr


def test_unreachable_server_is_one_line_exit_2(tmp_path: Path) -> None:
    r = argosy_process("jobs", "--server", "http://127.0.0.1:1", "--token", "x")
    assert r.returncode == 2 and "cannot reach the argosy server" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from running_server(tmp_path_factory.mktemp("cli") / "home")


@pytest.mark.slow
def test_cli_round_trip_against_a_real_server(
    argosy, server: ServerProcess, tmp_path: Path
) -> None:
    env = {"ARGOSY_HOME": str(server.home), "ARGOSY_SERVER": server.url}
    mode = (server.home / "admin.token").stat().st_mode & 0o777
    assert mode == 0o600
    (tmp_path / "s.py").write_text(Path(STEPS).read_text())
    (tmp_path / "job.yaml").write_text(
        "name: cli\nqueue: default\nscript: s.py\nargs: ['--steps', '3']\nnproc_per_node: 1\n"
    )
    r = argosy("submit", "job.yaml", "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert {"id", "name", "queue", "state", "attempts", "created_at"} <= set(job)
    assert job["spec"]["script"] == str(tmp_path / "s.py")  # resolved where submitted
    with server.client() as c:
        wait_for(c, job["id"], TERMINAL)
    shown = json.loads(argosy("job", job["id"], "--json", env=env).stdout)
    assert shown["id"] == job["id"] and shown["state"] == "succeeded"
    listed = json.loads(argosy("jobs", "--json", "--state", "succeeded", env=env).stdout)
    assert job["id"] in [j["id"] for j in listed]
    assert "step 3" in argosy("logs", job["id"], "-f", env=env).stdout
    assert "succeeded" in argosy("job", job["id"], env=env).stdout
    node = json.loads(argosy("nodes", "--json", env=env).stdout)[0]["name"]
    assert json.loads(argosy("cordon", node, "--json", env=env).stdout)["cordoned"] is True
    assert (
        json.loads(argosy("cordon", node, "--undo", "--json", env=env).stdout)["cordoned"] is False
    )
    with server.client() as c:  # the health record keeps it out: two failed checks
        for _ in range(2):
            c.post(f"/api/v1/nodes/{node}/health", json={"verdict": "failed", "detail": "ecc"})
    shown = argosy("nodes", env=env).stdout
    assert "health: quarantined" in shown or "health: cordoned" in shown, shown
    assert "schedulable" not in argosy("cordon", node, "--undo", env=env).stdout
    back = argosy("repair", node, "--detail", "reseated", env=env)
    assert back.returncode == 0 and f"{node}: schedulable" in back.stdout, back.stdout
    assert "default" in argosy("queues", env=env).stdout
    token = argosy("token", "create", "--queue", "default", env=env).stdout.strip()
    assert token.startswith("argosy_")
    r = argosy("cordon", node, "--token", token, env=env)
    assert r.returncode == 2 and "403" in r.stderr
    r = argosy("job", "jnothere", env=env)
    assert r.returncode == 2 and "404" in r.stderr


def test_token_create_list_revoke_and_expiry_against_a_real_server(
    argosy, server: ServerProcess
) -> None:
    env = {"ARGOSY_HOME": str(server.home), "ARGOSY_SERVER": server.url}
    r = argosy("token", "create", "--queue", "default", "--name", "ci", "--expires", "30d", env=env)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    token_id = token.split("_")[1]
    assert token.startswith(f"argosy_{token_id}_") and token_id in r.stderr
    assert argosy("jobs", "--token", token, env=env).returncode == 0
    listed = json.loads(argosy("token", "list", "--json", env=env).stdout)
    mine = next(t for t in listed if t["id"] == token_id)
    assert mine["state"] == "active" and mine["queue"] == "default" and mine["expires_at"]
    table = argosy("token", "list", env=env).stdout
    assert token_id in table and token.split("_", 2)[2] not in table
    r = argosy("token", "revoke", token_id, env=env)
    assert r.returncode == 0 and f"revoked {token_id}" in r.stdout
    r = argosy("jobs", "--token", token, env=env)
    assert r.returncode == 2 and "401" in r.stderr
    server_id = next(t["id"] for t in listed if t["created_by"] == "server")
    for args, want in [
        (("token", "revoke", "tnothere"), "404"),
        (("token", "revoke", server_id), "409"),
        (("token", "create", "--queue", "default", "--expires", "2x"), "--expires"),
        (("token", "create", "--queue", "nowhere"), "unknown leaf queue"),
    ]:
        r = argosy(*args, env=env)
        assert r.returncode == 2 and want in r.stderr, (args, r)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    short = argosy("token", "create", "--queue", "default", "--expires", "1s", env=env).stdout
    assert argosy("jobs", "--token", short.strip(), env=env).returncode == 0
    time.sleep(1.1)
    r = argosy("jobs", "--token", short.strip(), env=env)
    assert r.returncode == 2 and "401" in r.stderr


def test_the_cli_imports_no_server_dependency_until_a_server_command_runs() -> None:
    code = (
        "import sys\n"
        "import argosy.cli.app\n"
        "names = ('fastapi', 'uvicorn', 'sqlalchemy', 'alembic', 'httpx', 'prometheus_client',"
        " 'ray', 'schemathesis')\n"
        "print('HEAVY=' + ','.join(sorted(m for m in names if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY=\n" in out.stdout, out.stdout + out.stderr
