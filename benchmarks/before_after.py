"""The headline before and after a change: is the behaviour unchanged, within noise?

Runs ``benchmarks/consecutive_runs.py`` of two commits with the same arguments, each from
its own git worktree (``git worktree add``, removed at the end), alternating
(before, after, before, after, ...) so that a change in the machine's load hits both
alike; both read the same generated files (one ``--data`` folder, written by the
"after" commit's generator in the first round). Each round is one ``--repeats 1``
invocation per commit on fresh clusters and caches; the figures compared are medians over the rounds, and after / before ratios per
round.

    python benchmarks/before_after.py --before 9a8a287 [--after HEAD] [--rounds 3] \\
        [-- <consecutive_runs.py arguments>]

Default arguments of consecutive_runs.py: a reduced headline (40,000 events in 4 files,
4 workers, 2 runs, the realistic analysis, modes ``direct`` and ``cacheaffinity``, no
floors). Both commits run with this repository's virtual environment (the packages
are the same; the code under test is each commit's). Writes
benchmarks/results/before_after.json and .png. Needs what consecutive_runs.py needs
(root for its XRootD origin's traffic shaping, or ``--storage local``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import not_measured, parser, pyplot, read_results, save_png, spread, write_json  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ARGS = [
    "--events", "40000", "--files", "4", "--chunksize", "10000", "--workers", "4", "--runs", "2",
    "--analysis", "realistic", "--scenarios", "stable", "--modes", "direct", "cacheaffinity",
    "--no-floors",
]  # fmt: skip
#: (label, mode, figure) compared; figures of consecutive_runs.json's headline
FIGURES = (
    ("cacheaffinity run 1 s", "cacheaffinity", "run1_wall_s"),
    ("cacheaffinity run 2 s", "cacheaffinity", "run2_wall_s"),
    ("cacheaffinity run 2 hit rate", "cacheaffinity", "run2_hit_rate"),
    ("direct run 2 s", "direct", "run2_wall_s"),
)
RATIO = "direct run 2 / cacheaffinity run 2"


def resolve(rev: str) -> str:
    return subprocess.check_output(["git", "-C", REPO, "rev-parse", rev], text=True).strip()


def run_once(tree: str, args: list[str], out: str, name: str, env_extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, **(env_extra or {})}
    script = os.path.join(tree, "benchmarks", "consecutive_runs.py")
    with open(script) as f:
        if '"--processes"' in f.read() and "--processes" not in args:
            args = [*args, "--processes", "same"]  # what a commit without the option does
    cmd = [sys.executable, script, *args,
           "--repeats", "1", "--name", name, "--out", out]  # fmt: skip
    tic = time.perf_counter()
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    with open(os.path.join(out, f"{name}.json")) as f:
        doc = json.load(f)
    doc["_elapsed_s"] = time.perf_counter() - tic
    return doc


def figures(doc: dict) -> dict[str, float | None]:
    h = doc["results"]["headline"]
    out = {label: (h["modes"].get(mode) or {}).get(key, {}).get("median") for label, mode, key in FIGURES}
    out[RATIO] = (h["ratios"].get(RATIO) or {}).get("median")
    out["identical results"] = bool(doc["results"].get("identical_results"))
    out["result digest"] = doc["results"].get("result_digest")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="commit before the change")
    p.add_argument("--after", default="HEAD", help="commit after the change (default HEAD)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (each commit once per round)")
    p.add_argument("--name", default="before_after", help="results file name without .json")
    p.add_argument("--after-env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="environment of the after side only (e.g. a Dask config variable)")
    a = p.parse_args(argv)
    args = extra or DEFAULT_ARGS
    bad = [kv for kv in a.after_env if "=" not in kv or kv.startswith("=")]
    if bad:
        p.error(f"--after-env takes KEY=VALUE pairs, got {' '.join(bad)} "
                "(e.g. --after-env DASK_CACHEAFFINITY__WORKER__ADMISSION=fifo)")  # fmt: skip
    after_env = dict(kv.split("=", 1) for kv in a.after_env)
    commits = {"before": resolve(a.before), "after": resolve(a.after)}
    work = tempfile.mkdtemp(prefix="cacheaffinity-before-after-")
    os.chmod(work, 0o755)  # the XRootD origin's user reads the dataset under it
    trees = {}
    rounds: list[dict] = []
    try:
        for side, sha in commits.items():
            trees[side] = os.path.join(work, side)
            subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-f", trees[side], sha],
                           check=True, capture_output=True)  # fmt: skip
        if "--data" not in args:  # (not recorded: a folder of this machine)
            run_args = [*args, "--data", os.path.join(work, "data")]
        else:
            run_args = args
        for i in range(a.rounds):
            # "after" first: it generates the dataset both then read (from one --data folder)
            order = ("after", "before") if i % 2 == 0 else ("before", "after")
            got = {}
            for side in order:
                doc = run_once(trees[side], run_args, os.path.join(work, "out"), f"{side}-{i}",
                               after_env if side == "after" else None)
                got[side] = {**figures(doc), "elapsed_s": doc["_elapsed_s"]}
                print(f"round {i + 1} {side}: {got[side]}", flush=True)
            rounds.append(got)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree], capture_output=True)
        subprocess.run(["git", "-C", REPO, "worktree", "prune"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    labels = [f[0] for f in FIGURES] + [RATIO]
    summary = {}
    for label in labels:
        b = [r["before"][label] for r in rounds]
        af = [r["after"][label] for r in rounds]
        ratios = [x / y for x, y in zip(af, b) if x is not None and y]
        summary[label] = {"before": spread(b), "after": spread(af), "after / before": spread(ratios)}
    identical = all(r[s]["identical results"] for r in rounds for s in r)
    results = {"rounds": rounds, "summary": summary, "identical_results": identical}
    config = {"before": commits["before"], "after": commits["after"], "rounds": a.rounds,
              "consecutive_runs_args": args, "after_env": after_env}  # fmt: skip
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, f"{a.name}.json"), config, results)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for k, label in enumerate(labels):
        vals = summary[label]["after / before"]["values"]
        ax.plot([k] * len(vals), vals, "o", alpha=0.6)
        if vals:
            ax.plot([k - 0.2, k + 0.2], [summary[label]["after / before"]["median"]] * 2, "k-")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(labels)), [lab.replace(" / ", "\n/ ") for lab in labels], fontsize=7)
    ax.set_ylabel("after / before (per round)")
    ax.set_title(f"{commits['before'][:7]} -> {commits['after'][:7]}, {a.rounds} rounds", fontsize=9)
    fig.tight_layout()
    save_png(fig, os.path.join(a.out, f"{a.name}.png"))
    for label in labels:
        s = summary[label]
        print(f"{label}: before {s['before']['median']}, after {s['after']['median']}, "
              f"after/before {s['after / before']['median']} [{s['after / before']['min']}, "
              f"{s['after / before']['max']}]")  # fmt: skip
    print("identical results:", identical)
    return 0


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def render(results: str, name: str = "before_after") -> str:
    """docs/benchmarks.md's table of ``before_after.json`` (tools/render_readme.py)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("before_after.py", name)
    c, r = doc["config"], doc["results"]
    env = " ".join(f"{k}={v}" for k, v in (c.get("after_env") or {}).items())
    lines = [
        f"`{c['before'][:7]}` (before) against `{c['after'][:7]}` (after"
        + (f", with `{env}`" if env else "") + f"), {c['rounds']} alternating "
        f"rounds, stamped `{doc.get('commit', '?')[:7]}`; "
        f"`python benchmarks/before_after.py --before {c['before'][:7]} --after {c['after'][:7]} "
        f"--rounds {c['rounds']}" + (f" --name {name}" if name != "before_after" else "")
        + (f" --after-env {env}" if env else "")
        + f" -- {' '.join(c['consecutive_runs_args'])}`.",
        "",
        "| figure | before | after | after / before, per round |",
        "| --- | --- | --- | --- |",
    ]
    for label, s in r["summary"].items():
        q = s["after / before"]
        lines.append(f"| {label} | {_f(s['before']['median'])} | {_f(s['after']['median'])} "
                     f"| {_f(q['median'])} [{_f(q['min'])}, {_f(q['max'])}] |")  # fmt: skip
    digests = {r_[side].get("result digest") for r_ in r["rounds"] for side in r_}
    lines += [
        "",
        "Medians over the rounds; [min, max] of the per-round ratios. Results identical within "
        f"every invocation: {'yes' if r['identical_results'] else 'NO'}; the same results digest "
        f"before and after: {'yes' if len(digests) == 1 else 'NO'}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
