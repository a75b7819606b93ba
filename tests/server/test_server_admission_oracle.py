"""Submit is no file-existence oracle: a path the job's user cannot look up gets one
answer, whatever lies there.

The server may run as root; had admission told "does not exist", "not a regular file" and
"not readable" apart for any path, tenant A could map what exists in tenant B's run
directory by submitting jobs. The job's user is played by `as_job_user`, a `readable`
that answers like `Control.readable` does for a job user that owns nothing here (mode
bits for others, the path resolved first), so these run as any user, root included."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from argosy.executors.isolation import JobIdentity
from argosy.server.admission import job_errors, job_user_name, reachable
from argosy.server.spec import JobSpec


class JobUserView:
    """`readable` as a job user that owns nothing under `root` and is in none of its
    groups; directories above `root` (pytest's, 0700) count as passable. Records what it
    is asked."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.asked: list[str] = []

    def __call__(self, path: str) -> bool:
        self.asked.append(path)
        real = Path(os.path.realpath(path))  # as `JobUser.may_read` resolves (as root)
        chain = [
            p for p in [*reversed(real.parents), real] if p == self.root or self.root in p.parents
        ]
        try:
            for i, p in enumerate(chain):
                last = i == len(chain) - 1
                want = (
                    (stat.S_IXOTH if os.path.isdir(p) else stat.S_IROTH) if last else stat.S_IXOTH
                )
                if not os.stat(p).st_mode & want:
                    return False
        except OSError:
            return False
        return True


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """`a/`: tenant A's workdir (open); `b/`: tenant B's run directory (0700, B's)."""
    a, b = tmp_path / "a", tmp_path / "b"
    tmp_path.chmod(0o755)
    for d in (a, a / "dir", b, b / "sub"):
        d.mkdir()
        d.chmod(0o755)
    for f, mode in [
        (a / "ok.py", 0o644),
        (a / "notes.py", 0o600),
        (b / "present.py", 0o644),
        (b / "secret.py", 0o600),
        (b / "sub" / "deep.py", 0o644),
    ]:
        f.write_text("print('x')\n")
        f.chmod(mode)
    (tmp_path / "closed").mkdir(mode=0o700)
    (a / "to_present.py").symlink_to(b / "present.py")
    (a / "to_missing.py").symlink_to(b / "nope.py")
    (a / "to_sub").symlink_to("../b/sub")
    b.chmod(0o700)  # closed to the job's user
    return tmp_path


def spec(workdir: Path | str, script: Path | str = "ok.py", queue: str = "default") -> JobSpec:
    return JobSpec(name="t", script=str(script), workdir=str(workdir), queue=queue)


def only(errors: list[dict], field: str) -> dict:
    assert [e["loc"] for e in errors] == [["body", field]], errors
    return errors[0]


def test_a_script_the_job_user_cannot_reach_gets_one_answer(tree: Path) -> None:
    a, b = tree / "a", tree / "b"
    view = JobUserView(tree)
    hidden = [
        b / "present.py",  # exists, readable by all: only b's mode hides it
        b / "secret.py",
        b / "nope.py",  # missing
        b / "sub",  # a directory
        b / "sub" / "deep.py",
        b / "sub" / "nope" / "x.py",
        b / "present.py" / "x.py",  # under a file
        a / "to_present.py",  # A's own links into B
        a / "to_missing.py",
        a / "to_sub" / "deep.py",
    ]
    answers = set()
    for path in hidden:
        error = only(job_errors(spec(a, path), view, "argosy-job-a"), "script")
        answers.add((error["msg"].replace(str(path), "<path>"), error["type"]))
    msg = "script '<path>' is not found or not readable by the job's user 'argosy-job-a'"
    assert answers == {(msg, "script_unreachable")}
    through_links = [p for p in view.asked if os.path.realpath(p) != p]
    assert not through_links  # `readable` never resolves a link (as root) for the user
    assert all(os.path.isdir(p) for p in view.asked)  # only ever: may it search here?
    # where the job's user can look, the reasons stay (it could find them out itself)
    reasons = {
        "nope.py": ("does not exist", "script_missing"),
        "dir": ("is not a regular file", "script_not_file"),
        "notes.py": ("is not readable by the user jobs run as", "script_unreadable"),
        "ok.py/x.py": ("cannot be read", "script_missing"),
    }
    for script, (words, kind) in reasons.items():
        error = only(job_errors(spec(a, script), view, "argosy-job-a"), "script")
        assert words in error["msg"] and error["type"] == kind, error
    assert job_errors(spec(a, "ok.py"), view) == []


def test_a_workdir_the_job_user_cannot_reach_gets_one_answer(tree: Path) -> None:
    a, b = tree / "a", tree / "b"
    view = JobUserView(tree)
    hidden = [b / "sub", b / "nope", b / "present.py", a / "to_sub", a / "to_missing.py"]
    answers = set()
    for workdir in hidden:
        errors = job_errors(spec(workdir), view, "argosy-job-a")
        error = only(errors, "workdir")
        answers.add((error["msg"].replace(str(workdir), "<path>"), error["type"]))
    msg = "workdir '<path>' is not found or not readable by the job's user 'argosy-job-a'"
    assert answers == {(msg, "workdir_unreachable")}
    reasons = {  # reachable: the reasons stay
        a / "nope": ("is not a directory", "workdir_missing"),
        a / "ok.py": ("is not a directory", "workdir_missing"),
        tree / "closed": ("cannot be entered by the user jobs run as", "workdir_unreadable"),
        b: ("cannot be entered by the user jobs run as", "workdir_unreadable"),  # seen from /
    }
    for workdir, (words, kind) in reasons.items():
        error = only(job_errors(spec(workdir), view), "workdir")
        assert words in error["msg"] and error["type"] == kind, error


def test_links_are_followed_only_where_the_job_user_may_search(tree: Path) -> None:
    """A link in a directory the user may search leads on; one the user could not read
    (inside B) stops the lookup, wherever it points."""
    a, b = tree / "a", tree / "b"
    view = JobUserView(tree)
    (b / "back").symlink_to(a / "ok.py")  # inside B, pointing at a reachable file
    assert not reachable(str(b / "back"), view)
    (a / "loop").symlink_to("loop")
    assert reachable(str(a / "loop"), view)  # the user meets ELOOP itself
    assert reachable(str(a / "to_sub" / ".." / "a" / "ok.py"), view) is False  # via b
    assert reachable(str(a / "dir" / ".." / "ok.py"), view)


@pytest.mark.parametrize(
    ("per_queue", "name"), [(True, "argosy-job-team-a"), (False, "argosy-job")]
)
def test_the_answer_names_the_job_s_user(tree: Path, per_queue: bool, name: str) -> None:
    """The control plane names the user a job of the queue runs as (`Control.job_user`,
    from its executor's identity: `job_user_name`), and the message says it."""
    view = JobUserView(tree)
    job = spec(tree / "a", tree / "b" / "x.py", queue="team-a")
    user = job_user_name(JobIdentity("argosy-job", per_queue), job.queue)  # none is created
    assert user == name
    error = only(job_errors(job, view, user), "script")
    assert error["msg"].endswith(f"not readable by the job's user '{name}'"), error
    error = only(job_errors(job, view), "script")  # a `readable` that says no more
    assert error["msg"].endswith("not found or not readable by the user jobs run as"), error
