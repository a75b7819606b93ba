"""Tables of benchmarks/serving.py's batch curves, and the bridge to the vLLM-CPU peer.

`print_curves` prints one table per suite from the runs `serving.batch_curves` collects
({suite: {(batch size, method): [run, ...]}}, each run with tokens, seconds, decode tokens
and seconds, outputs, drafted, accepted, repeat, and for argosy methods its decode passes
and the tokens fed to its batched passes); ratios are per repeat, then median (min-max).
`vllm_curves` runs `benchmarks/serving_vllm.py` in `.venv-vllm` and returns its JSON (its
"rows": suite, batch_size, method plain|ngram, tok_s, ratio); `reprint_curves` prints a saved run.
"""

from __future__ import annotations

import json
import statistics

CURVE_METHODS = ("off", "auto", "ngram", "hf-plain", "hf-prompt-lookup")
VLLM_PYTHON = ".venv-vllm/bin/python"
VLLM_SCRIPT = "benchmarks/serving_vllm.py"


def print_curves(runs: dict, sizes: list[int], max_tokens: int, vllm: dict | None) -> None:
    """One table per suite: median tok/s per method, median ratios per repeat."""
    for suite, table in runs.items():
        print(f"\n{suite}: aggregate tok/s, {max_tokens} tokens max, greedy, B concurrent requests")
        head = ["batch", "off", "auto", "ngram", "HF plain", "HF lookup (B=1)", "auto x off",
                "ngram x off", "auto x best of off/ngram", "auto x off (CPU)",
                "ngram x off (CPU)", "auto x best of off/ngram (CPU)", "HF plain x off",
                "HF lookup x HF plain", "auto x off (decode)", "ngram x off (decode)",
                "decode passes off/ngram/auto", "tokens fed per batched pass off/ngram/auto",
                "auto accepted/drafted", "auto same as off"]  # fmt: skip
        if vllm is not None:
            head += ["vLLM plain", "vLLM ngram", "vLLM ngram x plain"]
        print("| " + " | ".join(head) + " |")
        print("|---" * len(head) + "|")
        for size in sizes:
            print("| " + " | ".join(_curve_row(table, size, suite, vllm)) + " |")


def _curve_row(table: dict, size: int, suite: str, vllm: dict | None) -> list[str]:
    def rate(method: str) -> str:
        got = table.get((size, method))
        return f"{statistics.median(r['tokens'] / r['seconds'] for r in got):.1f}" if got else "-"

    auto = table.get((size, "auto"), [])
    drafted = sum(r["drafted"] for r in auto)
    accepted = sum(r["accepted"] for r in auto)
    cells = [str(size), *(rate(m) for m in CURVE_METHODS)]
    cells += [_ratio(table, size, m, "off") for m in ("auto", "ngram")]
    cells.append(_ratio(table, size, "auto", ("off", "ngram")))
    cells += [_ratio(table, size, m, "off", cpu=True) for m in ("auto", "ngram")]
    cells.append(_ratio(table, size, "auto", ("off", "ngram"), cpu=True))
    cells.append(_ratio(table, size, "hf-plain", "off"))
    cells.append(_ratio(table, size, "hf-prompt-lookup", "hf-plain"))
    cells += [_ratio(table, size, m, "off", decode=True) for m in ("auto", "ngram")]
    cells += _passes(table, size)
    cells.append(f"{accepted}/{drafted}")
    cells.append(_same(table, size, "auto", "off"))
    if vllm is not None:
        cells += _vllm_cells(vllm, suite, size)
    return cells


def _ratio(
    table: dict,
    size: int,
    method: str,
    base: str | tuple[str, ...],
    decode: bool = False,
    cpu: bool = False,
) -> str:
    """Median (min-max) over repeats of (method tok/s / base tok/s in the same repeat); a
    tuple of bases: the fastest of them in that repeat; `decode`: tokens after the first
    over the time after the last request's first token; `cpu`: tokens per CPU second of
    the benchmark process (what other processes on a shared machine take is not in it)."""

    def rate(run: dict) -> float:
        if decode:
            return run["decode_tokens"] / run["decode_seconds"]
        if cpu:
            return run["tokens"] / run["cpu_seconds"]
        return run["tokens"] / run["seconds"]

    bases = (base,) if isinstance(base, str) else base
    by_rep: dict[int, list[float]] = {}
    for name in bases:
        for run in table.get((size, name), []):
            by_rep.setdefault(run["repeat"], []).append(rate(run))
    ratios = [
        rate(r) / max(by_rep[r["repeat"]])
        for r in table.get((size, method), [])
        if len(by_rep.get(r["repeat"], [])) == len(bases)
    ]
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _passes(table: dict, size: int) -> list[str]:
    """Median decode passes per run (batched and alone), and median tokens fed per batched
    pass (rows x (1 + draft width)), of the argosy methods: the side of a run that machine
    noise barely moves (only through when requests join the batch)."""
    passes, fed = [], []
    for method in ("off", "ngram", "auto"):
        runs = [r for r in table.get((size, method), []) if r.get("passes")]
        passes.append(f"{statistics.median(r['passes'] for r in runs):.0f}" if runs else "-")
        per = [r["fed"] / r["batched_passes"] for r in runs if r.get("batched_passes")]
        fed.append(f"{statistics.median(per):.1f}" if per else "-")
    return ["/".join(passes), "/".join(fed)]


def _same(table: dict, size: int, method: str, base: str) -> str:
    """Requests whose tokens equal the base method's in the same repeat."""
    base_out = {r["repeat"]: r["outputs"] for r in table.get((size, base), [])}
    same = total = 0
    for run in table.get((size, method), []):
        want = base_out.get(run["repeat"])
        if want is None:
            continue
        total += len(want)
        same += sum(a == b for a, b in zip(run["outputs"], want, strict=True))
    return f"{same}/{total}" if total else "-"


def vllm_curves(sizes: list[int], repeats: int, max_tokens: int, suites: list[str]) -> dict | None:
    """vLLM-CPU plain and n-gram on the same prompts, through its own venv (None if absent)."""
    import os
    import subprocess
    import tempfile

    if not (os.path.exists(VLLM_PYTHON) and os.path.exists(VLLM_SCRIPT)):
        print(f"\nvLLM-CPU: not run ({VLLM_PYTHON} or {VLLM_SCRIPT} missing)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "vllm.json")
        cmd = [VLLM_PYTHON, VLLM_SCRIPT, "--batch-sizes", ",".join(map(str, sizes)),
               "--repeats", str(repeats), "--max-tokens", str(max_tokens),
               "--suites", ",".join(suites), "--json", out]  # fmt: skip
        print("\nvLLM-CPU: " + " ".join(cmd), flush=True)
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0 or not os.path.exists(out):
            print(f"vLLM-CPU: failed (exit {done.returncode})")
            return None
        with open(out) as file:
            return json.load(file)


def reprint_curves(path: str, vllm_json: str | None, max_tokens: int) -> None:
    """Print the tables of a saved `--batch-sizes ... --json` run (optionally with vLLM)."""
    saved = read_json(path)
    runs = {
        suite: {(int(key.split(":")[0]), key.split(":")[1]): v for key, v in table.items()}
        for suite, table in saved["argosy"].items()
    }
    vllm = read_json(vllm_json) if vllm_json else saved.get("vllm")
    sizes = sorted({size for table in runs.values() for size, _ in table})
    print_curves(runs, sizes, saved.get("max_tokens", max_tokens), vllm)


def read_json(path: str) -> dict:
    with open(path) as file:
        return json.load(file)


def _vllm_cells(vllm: dict, suite: str, size: int) -> list[str]:
    """(plain tok/s, ngram tok/s, median ngram/plain ratio per repeat) from serving_vllm.py's
    JSON "rows" for one suite and size."""
    rows = {(r["suite"], r["batch_size"], r["method"]): r for r in vllm.get("rows", [])}
    plain, ngram = rows.get((suite, size, "plain")), rows.get((suite, size, "ngram"))
    if plain is None or ngram is None:
        return ["-", "-", "-"]
    return [f"{plain['tok_s']:.1f}", f"{ngram['tok_s']:.1f}", f"{ngram['ratio']:.2f}"]
