"""`argosy sim` as a user runs it: real processes, real files, no torch on the path."""

import json
import subprocess
import sys

import pytest

ARGOSY = [sys.executable, "-m", "argosy"]


def argosy(*args, cwd=None):
    return subprocess.run([*ARGOSY, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_sim_does_not_import_torch_ray_or_fastapi(tmp_path):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from argosy.cli.app import app\n"
        "r = CliRunner().invoke(app, ['sim', 'generate', '--cluster', 'h100:64', '--days', "
        "'0.2', '--out', sys.argv[1]])\n"
        "assert r.exit_code == 0, r.output\n"
        "import argosy.sim.engine, argosy.sim.runner, argosy.sim.plot\n"
        "print(sorted(m for m in ('torch', 'ray', 'fastapi') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_generate_then_compare_writes_json_and_a_png(tmp_path):
    gen = argosy("sim", "generate", "--cluster", "h100:256", "--days", "1", "--out", str(tmp_path))
    assert gen.returncode == 0, gen.stderr
    assert "offered load" in gen.stdout
    run = argosy("sim", "run", "--cluster", "h100:256", "--queues", str(tmp_path / "queues.yaml"),
                 "--trace", str(tmp_path / "trace.jsonl"), "--compare", "--json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    runs = json.loads(run.stdout)["runs"]
    assert [r["policy"] for r in runs] == ["fifo", "quota", "argosy"]
    for r in runs:
        for key in ("allocation_rate", "useful_rate", "effective_training_time",
                    "slo_attainment", "jct_s", "queue_s", "preemptions", "five_factor",
                    "sim_wall_s"):  # fmt: skip
            assert key in r
    png = tmp_path / "sim_compare.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "slurm"], "unknown policy 'slurm'"),
        (["--cluster", "h100:0"], "at least 1 device"),
        (["--trace", "missing.jsonl"], "cannot read trace"),
    ],
    ids=["unknown-policy", "bad-cluster", "missing-trace"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "q.yaml").write_text("queues:\n  - name: eval\n    quota: {h100: {nominal: 8}}\n")
    (tmp_path / "t.jsonl").write_text("")
    base = {"--cluster": "h100:8", "--queues": "q.yaml", "--trace": "t.jsonl", "--policy": "quota"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for kv in base.items() for x in kv]
    out = argosy("sim", "run", *flat, "--json", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_malformed_trace_line_names_file_line_and_field(tmp_path):
    (tmp_path / "q.yaml").write_text("queues:\n  - name: eval\n")
    good = {"id": "a", "submit_s": 0, "kind": "eval", "queue": "eval", "chips": ["h100"],
            "devices": 1, "work_device_s": 10}  # fmt: skip
    bad = {**good, "id": "b", "devices": "many"}
    (tmp_path / "t.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    common = ["sim", "run", "--cluster", "h100:8", "--queues", "q.yaml", "--trace", "t.jsonl",
              "--json"]  # fmt: skip
    stop = argosy(*common, cwd=tmp_path)
    assert stop.returncode == 2 and "t.jsonl:2 field 'devices'" in stop.stderr
    skip = argosy(*common, "--on-error", "skip", cwd=tmp_path)
    assert skip.returncode == 0, skip.stderr
    assert "t.jsonl:2" in skip.stderr and json.loads(skip.stdout)["skipped_trace_lines"] == 1


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"garbage\n", "t.jsonl:1: not JSON"),
        (b'{"id": "a"}\n\x00\xff\xfe binary\n', "t.jsonl:1"),
        (b"\xd7\x9b\x00\x01\xff\n", "t.jsonl:1: not UTF-8 text"),
        (b"[1, 2]\n", "t.jsonl:1: a trace line is one JSON object, not list"),
    ],
    ids=["text", "binary-after-a-line", "binary", "json-array"],
)
def test_garbage_trace_names_the_file_and_line_and_exits_2(tmp_path, content, needle):
    (tmp_path / "q.yaml").write_text("queues:\n  - name: eval\n")
    (tmp_path / "t.jsonl").write_bytes(content)
    out = argosy("sim", "run", "--cluster", "h100:8", "--queues", "q.yaml", "--trace", "t.jsonl",
                 "--json", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_plans_flag_is_checked_and_reaches_the_report(tmp_path):
    (tmp_path / "q.yaml").write_text("queues:\n  - name: eval\n")
    rec = {"id": "a", "submit_s": 0, "kind": "eval", "queue": "eval", "chips": ["h100"],
           "devices": 8, "work_device_s": 8000}  # fmt: skip
    (tmp_path / "t.jsonl").write_text(json.dumps(rec) + "\n")
    common = ["sim", "run", "--cluster", "h100:16", "--queues", "q.yaml", "--trace", "t.jsonl",
              "--json"]  # fmt: skip
    bad = argosy(*common, "--plans", "best", cwd=tmp_path)
    assert bad.returncode == 2 and "planner or stock" in bad.stderr
    for plans in ("planner", "stock"):
        out = argosy(*common, "--plans", plans, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["plans"] == plans
        assert "planner cost model" in report["five_factor"]["single_chip_efficiency"]["how"]


def test_why_prints_the_idle_split_and_the_reservations(tmp_path):
    gen = argosy("sim", "generate", "--cluster", "h100:128", "--days", "0.5", "--load", "1.5",
                 "--out", str(tmp_path))  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    run = argosy("sim", "run", "--cluster", "h100:128", "--queues", str(tmp_path / "queues.yaml"),
                 "--trace", str(tmp_path / "trace.jsonl"), "--why")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "where the device-time went" in run.stdout and "blocked_whole" in run.stdout
    assert "reservations, backfill, resizes" in run.stdout
    assert "workloads reserved / started" in run.stdout and "estimate error" in run.stdout
