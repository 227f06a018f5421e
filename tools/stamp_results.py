"""Stamp results JSON files that predate commit stamping (run on a developer machine, once).

Every results file written by ``benchmarks/_common.write_json`` records the commit it was
measured on (``commit``, ``dirty``).  Files written before that get, here, the commit that
last changed the file in git (``git log -1 --format=%H -- file``), marked as inferred::

    "commit": "<sha>", "commit_inferred": true,
    "commit_note": "stamped afterwards: the commit that stored this JSON; measured on the
                    code of that commit or its parent"

Files that already carry a ``commit`` are left alone (so running this again changes
nothing).  Prints what it did.

    python tools/stamp_results.py [benchmarks/results/*.json]
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTE = (
    "stamped afterwards: the commit that stored this JSON; measured on the code of that "
    "commit or its parent"
)


def last_commit(path: str) -> str | None:
    out = subprocess.run(
        ["git", "-C", REPO, "log", "-1", "--format=%H", "--", os.path.relpath(path, REPO)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return out or None


def stamp(path: str) -> str:
    with open(path) as f:
        doc = json.load(f)
    if doc.get("commit"):
        return "already stamped"
    sha = last_commit(path)
    if sha is None:
        return "not in git: left alone"
    # keep the key order readable: commit fields after config/machine
    new = {}
    for k, v in doc.items():
        new[k] = v
        if k == "machine":
            new.update(commit=sha, commit_inferred=True, commit_note=NOTE)
    if "commit" not in new:
        new.update(commit=sha, commit_inferred=True, commit_note=NOTE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(new, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return f"stamped {sha[:10]} (inferred)"


def main(argv: list[str] | None = None) -> int:
    paths = (argv if argv is not None else sys.argv[1:]) or sorted(
        glob.glob(os.path.join(REPO, "benchmarks", "results", "*.json"))
    )
    for p in paths:
        print(f"{os.path.relpath(p, REPO)}: {stamp(p)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
