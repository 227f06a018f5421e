"""``benchmarks/cache_read.py``'s terminal table and plot."""

from __future__ import annotations

import numpy as np

from benchmarks._cache_read_data import MB


def print_table(results: dict, summary: dict) -> None:
    head = (
        f"{'codec':<8} {'file MB':>8} {'uproot':>9} {'uproot':>9} {'cache':>9} {'cache':>9}"
        f" {'warm/':>7} {'cold/':>7} {'store':>7} {'first-run':>10}"
    )
    sub = (
        f"{'':<8} {'':>8} {'warm':>9} {'cold':>9} {'warm':>9} {'cold':>9}"
        f" {'uproot':>7} {'uproot':>7} {'MB/s':>7} {'overhead':>10}"
    )
    print(head)
    print(sub)
    print(f"{'':<8} {'':>8} {'(MB/s)':>9} {'(MB/s)':>9} {'(MB/s)':>9} {'(MB/s)':>9}")
    for codec, r in results.items():
        cold = lambda v: f"{v:9.0f}" if v is not None else f"{'n/a':>9}"  # noqa: E731
        ratio = lambda v: f"{v:6.0f}x" if v is not None else f"{'n/a':>7}"  # noqa: E731
        print(
            f"{codec:<8} {r['file_bytes'] / MB:8.1f} {r['uproot_warm_MBps']:9.1f}"
            f" {cold(r['uproot_cold_MBps'])} {r['cache_warm_MBps']:9.0f}"
            f" {cold(r['cache_cold_MBps'])} {ratio(r['ratio_warm'])}"
            f" {ratio(r['ratio_cold'])} {r['store_MBps']:7.0f} {100 * r['write_overhead']:9.1f}%"
        )
    print()
    for line in summary["lines"]:
        print(line)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    codecs = list(results)
    x = np.arange(len(codecs))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = [
        ("uproot (warm file)", "uproot_warm_MBps"),
        ("uproot (cold file)", "uproot_cold_MBps"),
        ("ColumnCache warm", "cache_warm_MBps"),
        ("ColumnCache cold", "cache_cold_MBps"),
    ]
    width = 0.2
    for i, (label, field) in enumerate(series):
        values = [results[c][field] or 0 for c in codecs]
        ax1.bar(x + (i - 1.5) * width, values, width, label=label)
    ax1.set_yscale("log")
    top = max(results[c][f] or 0 for c in codecs for _, f in series)
    ax1.set_ylim(top=top * 8)  # room for the legend
    ax1.set_xticks(x, codecs)
    ax1.set_ylabel("decompressed MB/s (single thread)")
    ax1.set_title("Reading NanoAOD-like columns")
    ax1.legend(fontsize=8, loc="upper center", ncol=2)
    ax1.grid(axis="y", which="both", alpha=0.3)
    overhead = np.array([100 * results[c]["write_overhead"] for c in codecs])
    spread = np.array(
        [
            [
                overhead[i] - 100 * min(results[c]["write_overhead_all"]),
                100 * max(results[c]["write_overhead_all"]) - overhead[i],
            ]
            for i, c in enumerate(codecs)
        ]
    ).T
    ax2.bar(x, overhead, 0.5, color="tab:purple", yerr=spread, capsize=4)
    ax2.axhline(10, color="k", linestyle="--", linewidth=1, label="10 % target")
    ax2.set_xticks(x, codecs)
    ax2.set_ylabel("% of the uproot read time (median, min-max)")
    ax2.set_title("First run: cost of storing into the cache")
    ax2.legend(fontsize=8)
    ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
