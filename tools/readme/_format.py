"""Helpers of the README renderers (tools/render_readme.py): a results file's commit and
date, numbers, percentages and median [min, max] spreads as the tables print them, the
modes' labels, a row of the "measured" table."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks._common import not_measured  # (stdlib only)
from benchmarks._common import read_results as _load  # (stdlib only)

__all__ = ["MODE_LABELS", "_load", "commit_label", "not_measured"]


def commit_label(doc: dict) -> str:
    """Short hash of the commit a results file was measured on, marked when inferred or
    when the tree had local changes."""
    sha = doc.get("commit")
    if isinstance(sha, dict):  # stealing_slow_node.py's own stamp: {"sha": ..., "dirty": ...}
        sha = sha.get("sha")
    if not sha:
        return "unknown commit"
    label = f"`{sha[:7]}`"
    if doc.get("commit_inferred"):
        label += " (inferred)"
    if doc.get("dirty"):
        label += " (+ local changes)"
    return label


def _date(doc: dict) -> str:
    t = (doc.get("machine") or {}).get("time") or doc.get("created") or ""
    return t[:10]


def _f(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _spread(s: dict | None, fmt: Callable[[float], str] = _f) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{fmt(s['median'])} [{fmt(s['min'])}, {fmt(s['max'])}]"
    return fmt(s["median"])


def _spread_of(values: list) -> dict:
    vals = sorted(float(v) for v in values if v is not None)
    if not vals:
        return {"median": None}
    n = len(vals)
    med = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
    return {"median": med, "min": vals[0], "max": vals[-1], "n": n}


MODE_LABELS = {
    "direct": "`direct` (coffea DaskExecutor)",
    "dask-default+cache": "`dask-default+cache` (Dask placement + our column cache)",
    "coffea-affinity+cache": "`coffea-affinity+cache` (`worker_affinity=True` + our cache)",
    "coffea-native": "`coffea-native` (`worker_affinity=True` + coffea's `BufferCache` on `zict.File`)",
    "xcache": "`xcache` (XRootD XCache proxy in front of the origin)",
    "cacheaffinity": "**`cacheaffinity`**",
}


def _row(what: str, result: str, command: str, doc: dict) -> str:
    return f"| {what} | {result} | `{command}` | {commit_label(doc)}, {_date(doc)} |"
