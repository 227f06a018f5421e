"""The "Cache Affinity" page of the Dask dashboard (runs in the scheduler).

``install``, called by the plugin's ``start``, serves ``/cacheaffinity`` and
``/individual-cache-affinity`` on a running scheduler's dashboard and lists them in
its "More..." menu and ``/individual-plots.json``. Each open page is refreshed every
``UPDATE_MS`` from ``CacheAffinityPlugin.snapshot()`` on the event loop; nothing
runs while no browser shows it. The distributed internals it needs are in
``_distributed``.
"""

from __future__ import annotations

import html
import logging
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from cacheaffinity.protocol import PLUGIN_NAME
from cacheaffinity.scheduler import _distributed

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = ["INDIVIDUAL_PAGE", "MAX_CHUNKS", "PAGE", "TorusView", "install"]

#: URL path of the page (under the dashboard's prefix).
PAGE = "/cacheaffinity"
MENU_NAME = "Cache Affinity"
#: The page without navigation, for JupyterLab's Dask panel.
INDIVIDUAL_PAGE = "/individual-cache-affinity"
INDIVIDUAL_NAME = "Individual Cache Affinity"
UPDATE_MS = 1000
#: Chunks drawn at most.
MAX_CHUNKS = 5000
GONE_COLOR = "#b0b0b0"

#: (field, title, kind) of the node table's columns.
TABLE_COLUMNS = (
    ("node", "node", "str"),
    ("cache", "cache", "str"),
    ("hosts", "hosts", "str"),
    ("directory", "directory", "str"),
    ("workers", "workers", "int"),
    ("weight", "weight", "num"),
    ("replicas", "replicas", "int"),
    ("recent", "drawn", "int"),
    ("placements", "placed", "int"),
    ("queued", "queued", "int"),
    ("cached", "cached", "str"),
    ("entries", "entries", "int"),
    ("capacity", "capacity", "str"),
    ("hits", "hits", "int"),
    ("misses", "misses", "int"),
    ("hit_rate", "hit rate", "pct"),
    ("evictions", "evictions", "int"),
    ("steals", "steals", "int"),
    ("on_target", "on node", "int"),
    ("off_target", "off node", "int"),
    ("failovers", "failovers", "int"),
)
TABLE_NOTE = (
    "cache: \"cached\", or \"UNCACHED\" with the reason (no worker of the node has a "
    "usable cache: it gets no placement while cached nodes exist); capacity: the one in "
    "force (at most what the disk held at start); "
    "replicas: the node's points on the torus; drawn: its chunks drawn on the torus; "
    "placed: chunk tasks placed on the node; queued: its chunk tasks not finished; "
    "directory: the node's cache directory (as its workers name it); "
    "cached/entries: its cache directory; hits/misses/evictions: its workers' "
    "column cache since they started; steals: chunk tasks its workers stole; "
    "on/off node: chunk tasks it finished that were / were not meant for it; "
    "failovers: tasks moved away after it left."
)


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) else 0.0


def node_colors(nodes: list[str]) -> dict[str, str]:
    """A colour per node, stable for a node set: distinct up to 256 nodes (the largest
    Bokeh palette); beyond, neighbours in name order still differ (the palette repeats
    with a stride), as a facility of 1000 nodes has."""
    from bokeh.palettes import Category10, Category20, turbo

    names = sorted(nodes)
    n = len(names)
    if n == 0:
        return {}
    if n <= 10:
        palette = Category10[10]
    elif n <= 20:
        palette = Category20[20]
    elif n <= 256:
        palette = turbo(n)
    else:
        palette = turbo(256)
        # a stride coprime with 256: consecutive nodes get far-apart colours
        return {name: palette[(i * 97) % 256] for i, name in enumerate(names)}
    return {name: palette[i] for i, name in enumerate(names)}


class TorusView:
    """The page's Bokeh models and the update that fills them from the plugin.

    Holds ``scheduler`` weakly and looks the plugin up at every update, so a
    re-registered plugin is shown and a removed one leaves a notice.
    """

    def __init__(self, scheduler: Scheduler):
        from bokeh.core.properties import field as bokeh_field
        from bokeh.layouts import column, row
        from bokeh.models import (
            ColumnDataSource,
            DataTable,
            Div,
            FactorRange,
            HoverTool,
            Legend,
            LegendItem,
            NumberFormatter,
            NumeralTickFormatter,
            Range1d,
            StringFormatter,
            TableColumn,
        )
        from bokeh.plotting import figure

        self._scheduler = weakref.ref(scheduler)
        self.header = Div(text="", name="cacheaffinity-header", sizing_mode="stretch_width")
        self.replicas = ColumnDataSource(
            {"x": [], "y": [], "node": [], "replica": [], "color": []},
            name="cacheaffinity-replica-points",
        )
        self.chunks = ColumnDataSource(
            {"x": [], "y": [], "chunk": [], "node": [], "color": []},
            name="cacheaffinity-chunk-points",
        )
        self.stats = ColumnDataSource(
            {
                **{field: [] for field, _, _ in TABLE_COLUMNS},
                "color": [],
                "cached_bytes": [],
                "label": [],
            },
            name="cacheaffinity-node-stats",
        )

        torus = figure(
            title="Torus (coordinates 1 and 2): cache-node replicas ● and chunks ○",
            name="cacheaffinity-torus",
            frame_width=500,
            frame_height=500,
            x_range=Range1d(0, 1, bounds=(0, 1)),
            y_range=Range1d(0, 1, bounds=(0, 1)),
            tools="pan,wheel_zoom,box_zoom,reset,save",
        )
        torus.xaxis.axis_label = "coordinate 1"
        torus.yaxis.axis_label = "coordinate 2"
        chunk_r = torus.scatter(
            "x", "y", source=self.chunks, marker="circle", size=6,
            fill_alpha=0.0, line_color="color", line_width=1.2, line_alpha=0.9,
            name="cacheaffinity-chunks",
        )
        replica_r = torus.scatter(
            "x", "y", source=self.replicas, marker="circle", size=11,
            fill_color="color", line_color="black", line_width=1,
            name="cacheaffinity-replicas",
        )
        torus.add_tools(
            HoverTool(renderers=[replica_r], tooltips=[("node", "@node"), ("replica", "@replica")]),
            HoverTool(renderers=[chunk_r], tooltips=[("chunk", "@chunk"), ("node", "@node")]),
        )
        # one entry per node, grouped in the browser by the replicas' "node" column
        self.legend = Legend(
            items=[LegendItem(label=bokeh_field("node"), renderers=[replica_r])],
            location="top_left", label_text_font_size="9pt", name="cacheaffinity-legend",
        )
        torus.add_layout(self.legend, "right")
        self.torus = torus

        self.node_range = FactorRange(factors=[])
        bars = {}
        for field, title, name in (
            ("cached_bytes", "Bytes cached per node", "cacheaffinity-bytes"),
            ("hit_rate", "Hit rate per node", "cacheaffinity-hit-rate"),
        ):
            fig = figure(
                title=title, name=name, y_range=self.node_range, x_range=Range1d(0, 1),
                width=420, height=270, tools="", toolbar_location=None,
            )
            fig.hbar(
                y="label", right=field, height=0.8, source=self.stats,
                fill_color="color", line_color="black",
            )
            fig.add_tools(HoverTool(tooltips=[("node", "@node"), (title, f"@{field}")]))
            fig.xaxis.formatter = NumeralTickFormatter(
                format="0.0b" if field == "cached_bytes" else "0%"
            )
            fig.xaxis.ticker.desired_num_ticks = 4
            bars[field] = fig
        self.bars = bars

        columns = []
        for field, title, kind in TABLE_COLUMNS:
            formatter = {
                "int": NumberFormatter(format="0,0"),
                "num": NumberFormatter(format="0.[00]"),
                "pct": NumberFormatter(format="0.0%"),
            }.get(kind, StringFormatter())
            columns.append(
                TableColumn(field=field, title=title, formatter=formatter,
                            width={"node": 220, "cache": 260, "hosts": 110}.get(field, 70))
            )
        self.table = DataTable(
            source=self.stats, columns=columns, index_position=None,
            name="cacheaffinity-table", width=1000, height=200, sizing_mode="stretch_width",
        )
        self.root = column(
            self.header,
            row(torus, column(bars["cached_bytes"], bars["hit_rate"])),
            self.table,
            Div(text=TABLE_NOTE, sizing_mode="stretch_width", styles={"font-size": "85%"}),
            sizing_mode="stretch_width",
        )

        self._state_seen: Any = None  # placement node set last drawn
        self._colors_seen: dict[str, str] | None = None
        self._recent_seen: list | None = None
        self._coords: dict[str, tuple[float, float]] = {}
        self._table_version = 0
        self.shown: Counter[str] = Counter()
        self.update()

    def update(self) -> None:
        """Refresh every source from the scheduler's plugin (event loop only)."""
        scheduler = self._scheduler()
        plugin = None if scheduler is None else scheduler.plugins.get(PLUGIN_NAME)
        if plugin is None or not hasattr(plugin, "snapshot"):
            self._clear(
                "<b>cacheaffinity</b>: the scheduler has no cacheaffinity plugin "
                "(start it with <code>--preload cacheaffinity</code> or "
                "<code>client.register_plugin(cacheaffinity.CacheAffinityPlugin())</code>)"
            )
            return
        info = plugin.snapshot()
        nodes: dict[str, dict] = info["nodes"]
        colors = node_colors(list(nodes))
        self._update_replicas(info["layout"], colors)
        self.legend.visible = len(colors) <= 20  # the table names every node
        recent = info["recent-placements"]
        self._update_chunks(plugin.placement, recent, colors)
        self._update_stats(info, colors, recent, info["recent-placements-size"])
        self._colors_seen = colors

    def _clear(self, message: str) -> None:
        self.header.text = message
        for source in (self.replicas, self.chunks, self.stats):
            if len(next(iter(source.data.values()), ())):
                source.data = {k: [] for k in source.data}
        self.node_range.factors = []
        self._state_seen = self._recent_seen = self._colors_seen = None
        self.shown = Counter()

    def _update_replicas(self, state, colors: dict[str, str]) -> None:
        # layout() is an immutable snapshot, swapped as a whole: identity suffices
        if state is self._state_seen and colors == self._colors_seen:
            return
        self._state_seen = state
        points, point_node, names = state.points, state.point_node, state.names
        keep = np.fromiter((n in colors for n in names), dtype=bool, count=len(names))
        mask = keep[point_node] if len(point_node) else np.zeros(0, dtype=bool)
        xs, ys = self._project(points[mask])
        node_of_point = [names[i] for i in point_node[mask].tolist()]
        replica = (np.arange(len(point_node)) - state.starts[point_node])[mask].tolist()
        self.replicas.data = {
            "x": np.asarray(xs, dtype=np.float64),
            "y": np.asarray(ys, dtype=np.float64),
            "node": node_of_point,
            "replica": replica,
            "color": [colors[n] for n in node_of_point],
        }

    def _update_chunks(self, placement, recent: list, colors: dict[str, str]) -> None:
        if recent == self._recent_seen and colors == self._colors_seen:
            return
        self._recent_seen = recent
        latest = list(dict(recent).items())  # a chunk placed again: its latest node
        coords = self._coords
        new = [c for c, _ in latest if c not in coords]
        if new:
            pts = placement.coordinates(new)
            xs, ys = self._project(pts)
            coords.update(zip(new, zip(xs, ys)))
        if len(coords) > 2 * MAX_CHUNKS:  # forget chunks no longer shown
            shown = {c for c, _ in latest}
            self._coords = coords = {c: xy for c, xy in coords.items() if c in shown}
        self.chunks.data = {  # coordinates as arrays: sent in binary
            "x": np.array([coords[c][0] for c, _ in latest], dtype=np.float64),
            "y": np.array([coords[c][1] for c, _ in latest], dtype=np.float64),
            "chunk": [c for c, _ in latest],
            "node": [n for _, n in latest],
            "color": [colors.get(n, GONE_COLOR) for _, n in latest],
        }
        self.shown = Counter(n for _, n in latest)

    def _project(self, points: np.ndarray) -> tuple[list[float], list[float]]:
        """First two coordinates (1-D: on y = 1/2). With D > 2, neighbouring chunks'
        colours mix in this projection: nearest is nearest in all D coordinates."""
        if points.shape[0] == 0:
            return [], []
        xs = points[:, 0].tolist()
        ys = points[:, 1].tolist() if points.shape[1] > 1 else [0.5] * len(xs)
        return xs, ys

    def _update_stats(
        self, info: dict, colors: dict[str, str], recent: list, maxlen: int | None
    ) -> None:
        from dask.utils import format_bytes

        nodes: dict[str, dict] = info["nodes"]
        names = sorted(nodes)
        state = info["layout"]
        counts = dict(zip(state.names, state.counts.tolist()))
        rows: dict[str, list] = {k: [] for k in self.stats.data}
        labels = []
        for name in names:
            entry = nodes[name]
            stats = entry.get("stats") or {}
            counters = entry.get("counters") or {}
            hits, misses = _num(stats.get("hits")), _num(stats.get("misses"))
            cached = _num(stats.get("bytes"))
            capacity = stats.get("capacity")
            label = name if len(name) <= 28 else name[:12] + "…" + name[-12:]
            while label in labels:  # distinct factors for the bar charts
                label += "'"
            labels.append(label)
            row = {
                "node": name,
                "cache": f"UNCACHED: {entry['uncached']}" if entry.get("uncached") else "cached",
                "hosts": ", ".join(entry.get("hosts") or ()),
                "directory": str(entry.get("directory") or "-"),
                "workers": len(entry.get("workers") or ()),
                "weight": _num(entry.get("weight")),
                "replicas": int(counts.get(name, 0)),
                "recent": self.shown.get(name, 0),
                "placements": int(_num(counters.get("placements"))),
                "queued": int(_num(entry.get("tasks"))),
                "cached": format_bytes(cached),
                "entries": int(_num(stats.get("entries"))),
                "capacity": format_bytes(capacity) if isinstance(capacity, (int, float)) else "-",
                "hits": int(hits),
                "misses": int(misses),
                "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                "evictions": int(_num(stats.get("evictions"))),
                "steals": int(_num(counters.get("steals"))),
                "on_target": int(_num(counters.get("on-target"))),
                "off_target": int(_num(counters.get("off-target"))),
                "failovers": int(_num(counters.get("failovers"))),
                "color": colors[name],
                "cached_bytes": cached,
                "label": label,
            }
            for k, v in row.items():
                rows[k].append(v)
        if list(self.node_range.factors) != labels[::-1]:
            self.node_range.factors = labels[::-1]  # first node on top
            self.table.height = min(600, 40 + 26 * len(labels))
        if rows != self.stats.data:
            self.stats.data = rows
            # BokehJS 3.9 redraws a DataTable only when its CDSView changes, which a
            # new .data of the same length does not do (bokeh/bokeh issue 13859): touch it.
            self._table_version += 1
            self.table.view.tags = [self._table_version]
        self.bars["cached_bytes"].x_range.end = max([1.0, *rows["cached_bytes"]]) * 1.1
        totals = info.get("counters") or {}
        p = info["placement"]
        hits = sum(rows["hits"])
        lookups = hits + sum(rows["misses"])
        stealing = info.get("stealing")
        uncached = {n: e["uncached"] for n, e in nodes.items() if e.get("uncached")}
        warning = ""
        if uncached:
            warning = (
                '<div class="cacheaffinity-uncached" style="color:#b00000">'
                f"<b>{len(uncached)} node(s) cache nothing</b>"
                + (" and get no placement" if len(uncached) < len(nodes) else "")
                + ": "
                + "; ".join(
                    f"<b>{html.escape(n)}</b>: {html.escape(r)}" for n, r in sorted(uncached.items())
                )
                + "</div>"
            )
        self.header.text = warning + (
            f"<b>cacheaffinity {info.get('version', '')}</b>: {len(names)} cache nodes, "
            f"torus D={p['dimensions']}, {p['replicas']} replicas per unit weight, "
            f"seed {p['seed']}, balance {p['balance'] or 'off'}; "
            f"{int(totals.get('placements', 0)):,} chunk tasks placed, "
            f"{int(totals.get('on-target', 0)):,} finished on their node, "
            f"{int(totals.get('off-target', 0)):,} elsewhere, "
            f"{int(totals.get('steals', 0)):,} stolen "
            f"({'no cacheaffinity stealing' if stealing is None else 'stealing ' + ('on' if stealing.get('enabled') else 'off')}"
            f"{_warm_cost_text(stealing)}), "
            f"{int(totals.get('failovers', 0)):,} failovers; "
            f"cache hit rate {hits / lookups if lookups else 0:.1%} of {lookups:,} lookups, "
            f"{format_bytes(sum(rows['cached_bytes']))} cached. "
            f"Drawn: {len(self.chunks.data['chunk']):,} distinct chunks of the last "
            f"{len(recent):,} placements (at most {maxlen or MAX_CHUNKS:,})."
        ) + _forecast_text(info.get("forecast"))


def _forecast_text(forecast: dict | None) -> str:
    """The newest run's forecast, with a clause per node whose cache is too small."""
    from dask.utils import format_bytes

    if not forecast or forecast.get("capacity_hit_rate") is None:
        return ""
    short = []
    for node, e in sorted((forecast.get("nodes") or {}).items()):
        rate = e.get("capacity_hit_rate")
        if rate is not None and rate < 1.0:
            short.append(
                f"this run needs ~{format_bytes(e['need_bytes'])} on node {html.escape(node)}, "
                f"which holds {format_bytes(e['capacity'])} ({html.escape(str(e['policy']))}): "
                f"expect ~{100 * rate:.0f}% hits"
            )
    head = (
        f"Forecast of run {html.escape(str(forecast.get('run', ''))[:12])}: "
        f"{format_bytes(forecast.get('need_bytes') or 0)} over {len(forecast.get('nodes') or {})} "
        f"nodes, expect ~{100 * forecast['capacity_hit_rate']:.0f}% hits once every chunk was read"
    )
    body = ("; " + "; ".join(short)) if short else " (every node's cache holds its part)"
    return f'<div class="cacheaffinity-forecast">{head}{body}.</div>'


def _warm_cost_text(stealing: dict | None) -> str:
    """'; a warm chunk costs its thief N tasks (learned, node X)' when learned above the prior."""
    costs = (stealing or {}).get("warm-steal-cost") or {}
    prior = (stealing or {}).get("warm-backlog", 0)
    if not costs or max(costs.values()) <= prior:
        return ""
    node = max(costs, key=costs.__getitem__)
    return (
        f"; a stolen warm chunk costs its thief up to {costs[node]:.0f} of its tasks "
        f"(learned on {html.escape(node)}; prior {prior:g})"
    )


def cacheaffinity_doc(scheduler: Scheduler, extra: dict, doc) -> None:
    """Bokeh application function of the page (one call per browser session)."""
    _distributed.dashboard_document(
        doc, TorusView(scheduler), UPDATE_MS, "Dask: Cache Affinity", "simple.html", extra
    )


def individual_doc(scheduler: Scheduler, extra: dict, doc) -> None:
    """Bokeh application function of the page without navigation (JupyterLab's Dask panel)."""
    _distributed.dashboard_document(
        doc, TorusView(scheduler), UPDATE_MS, "Dask: Cache Affinity", None, extra
    )


def install(scheduler: Scheduler) -> bool:
    """Serve the page on ``scheduler``'s dashboard and list it (idempotent).

    Call on the scheduler's event loop. Returns False, without raising, if the
    scheduler has no dashboard or the page could not be added (logged).
    """
    try:
        dashboards = _distributed.dashboard_apps(scheduler)
        if not dashboards:
            logger.debug("cacheaffinity: the scheduler has no dashboard; no %s page", PAGE)
            return False
        if any(PAGE in d.app_paths for d in dashboards):
            return True
        prefix = dashboards[0].prefix
        variables = _distributed.add_dashboard_pages(
            scheduler, {PAGE: cacheaffinity_doc, INDIVIDUAL_PAGE: individual_doc}, prefix
        )
        _distributed.serve_individual_plots(scheduler, prefix, {INDIVIDUAL_NAME: INDIVIDUAL_PAGE})
        plots = variables.setdefault("plots", [])
        url = PAGE.strip("/")
        if not any(p.get("url") == url for p in plots):
            plots.append({"url": url, "name": MENU_NAME})
            plots.sort(key=lambda p: p["name"])  # in place: the pages share this list
        logger.info("cacheaffinity dashboard page at %s%s", prefix, PAGE)
        return True
    except Exception:
        logger.exception("cacheaffinity: the dashboard page %s could not be added", PAGE)
        return False
