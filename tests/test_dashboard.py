"""The cacheaffinity page of the Dask dashboard, rendered by a real headless Chromium.

The browser test needs the Debian packages ``chromium`` and ``chromium-driver`` and the
PyPI package ``selenium``; it is skipped (with the reason) only when chromium is not
installed.  The other tests read the page over HTTP and the page's Bokeh models on a
real scheduler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest

from testbed import skip_or_fail
from distributed import Client, LocalCluster, Scheduler
from distributed.utils_test import async_poll_for, gen_cluster
from tornado.httpclient import AsyncHTTPClient, HTTPClient

import cacheaffinity
from cacheaffinity import CacheAffinityPlugin, CacheWorkerPlugin
from cacheaffinity.protocol import HOST_NODE_PREFIX
from cacheaffinity.scheduler._dashboard import (
    INDIVIDUAL_NAME,
    INDIVIDUAL_PAGE,
    PAGE,
    TABLE_COLUMNS,
    TorusView,
    install,
)

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
HTTP = {"dashboard": True, "dashboard_address": "127.0.0.1:0"}
COLUMNS = 3
#: Category10, the colours of the first three nodes (sorted by id)
NODE_COLORS = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C)]


def chunk_ids(n, run="a"):
    return [f"uuid-{run}{i // 10}/Events/{(i % 10) * 100}-{(i % 10 + 1) * 100}" for i in range(n)]


def cache_chunk(chunk):
    """A chunk task: its columns from the node cache, else made and cached."""
    front = cacheaffinity.cachestrategy()
    for i in range(COLUMNS):
        key = f"{chunk}/col{i}"
        if front.get(key) is None:
            front[key] = np.arange(1000, dtype=np.float32) + i
    return cacheaffinity.worker_cache().node_id


# ---------------------------------------------------------------- browser
@pytest.fixture
def browser(tmp_path):
    if CHROMIUM is None:
        skip_or_fail("chromium is not installed (Debian packages: chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install selenium (drives chromium)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    # an explicit driver: Selenium Manager must not try to download one
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_js(driver, script, predicate, timeout=60, what="the page"):
    """Run ``script`` in the page until ``predicate(result)`` holds; the last result."""
    from selenium.common.exceptions import WebDriverException

    deadline = time.monotonic() + timeout
    result = None
    while time.monotonic() < deadline:
        try:
            result = driver.execute_script(script)
        except WebDriverException as e:  # page still loading: Bokeh not there yet
            result = e
        if not isinstance(result, Exception) and predicate(result):
            return result
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last value: {result!r}")


#: The page's models as the browser sees them (BokehJS document and views).
READ_PAGE = """
if (!window.Bokeh || !Bokeh.documents || !Bokeh.documents.length) return null;
const doc = Bokeh.documents[0];
const get = (name) => doc.get_model_by_name(name);
const replicas = get('cacheaffinity-replica-points');
const chunks = get('cacheaffinity-chunk-points');
const stats = get('cacheaffinity-node-stats');
const root = Object.values(Bokeh.index)[0];
if (!replicas || !chunks || !stats || !root) return null;
const view = (name) => root.owner.find_one(get(name));
const torus = view('cacheaffinity-torus');
const table = view('cacheaffinity-table');
const col = (src, c) => Array.from(src.get_column(c) || []);
const box = torus ? torus.el.getBoundingClientRect() : null;
return {
  title: document.title,
  replica_renderer: view('cacheaffinity-replicas') ? view('cacheaffinity-replicas').model.type : null,
  chunk_renderer: view('cacheaffinity-chunks') ? view('cacheaffinity-chunks').model.type : null,
  torus_box: box ? [box.x, box.y, box.width, box.height] : null,
  table_cells: table ? Array.from(table.shadow_el.querySelectorAll('.slick-row')).map(
    (r) => Array.from(r.querySelectorAll('.slick-cell')).map((c) => c.textContent)) : null,
  replicas: {x: col(replicas, 'x'), y: col(replicas, 'y'), node: col(replicas, 'node')},
  chunks: {x: col(chunks, 'x'), y: col(chunks, 'y'), node: col(chunks, 'node'),
           chunk: col(chunks, 'chunk')},
  stats: Object.fromEntries(['node', 'placements', 'hits', 'misses', 'entries', 'recent',
                             'hit_rate', 'evictions', 'steals', 'replicas']
                            .map((c) => [c, col(stats, c)])),
};
"""


def rendered(page, field):
    """The text of one column of the table as the browser drew it, row by row."""
    i = [f for f, _, _ in TABLE_COLUMNS].index(field)
    return [row[i] for row in page["table_cells"]]


def nearest_node_2d(chunk_xy, replica_xy, replica_node):
    """Node of the nearest replica by periodic L1 distance in the unit square."""
    d = np.abs(chunk_xy[:, None, :] - replica_xy[None, :, :])
    d = np.minimum(d, 1.0 - d).sum(axis=2)
    return np.asarray(replica_node)[d.argmin(axis=1)]


def check_png(path: Path, box=None, colors=()):
    """A real screenshot: a PNG, not one colour, the node colours inside ``box``."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000, path.stat().st_size
    img = Image.open(path).convert("RGB")
    assert img.width >= 1000 and img.height >= 700, img.size
    assert len(img.getcolors(maxcolors=1 << 20)) > 50  # not blank
    if box is not None:
        x, y, w, h = (int(v) for v in box)
        plot = np.asarray(img.crop((x, y, x + w, y + h))).reshape(-1, 3)
        for c in colors:  # the filled replica circles of every node
            assert (plot == c).all(axis=1).sum() > 500, f"too few pixels of node colour {c}"


@pytest.mark.timeout(300)
def test_page_in_headless_chromium(browser, tmp_path):
    """Preloaded plugin (distributed.scheduler.preload), 3 cache nodes, 2-D torus:
    the More menu links the page; the page draws every replica point and every chunk
    in its node's colour, one table row per node, and follows new runs live."""
    n_chunks = 300
    ids = chunk_ids(n_chunks)
    with dask.config.set(
        {
            "distributed.scheduler.preload": ["cacheaffinity"],
            "cacheaffinity.scheduler.dimensions": 2,  # the projection is the torus
            "cacheaffinity.scheduler.stealing.enabled": False,  # every chunk on its node
        }
    ):
        cluster = LocalCluster(
            n_workers=3, threads_per_worker=1, processes=False,
            dashboard_address="127.0.0.1:0",
        )
    with cluster, Client(cluster) as client:
        client.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
        s = cluster.scheduler
        plugin = s.plugins["cacheaffinity"]

        def nodes_ready():
            nodes = plugin.info()["nodes"]
            return len(nodes) == 3 and not any(n.startswith(HOST_NODE_PREFIX) for n in nodes)

        deadline = time.monotonic() + 30
        while not nodes_ready():
            assert time.monotonic() < deadline, "cache nodes did not register"
            time.sleep(0.1)
        nodes = sorted(plugin.membership.node_workers)
        replicas = plugin.placement.replicas
        run1 = client.gather(cacheaffinity.map_chunks(client, cache_chunk, ids, chunk_ids=ids))
        assert set(run1) == set(nodes)
        base = f"http://127.0.0.1:{s.http_server.port}"

        # The main page's "More..." menu lists the page.
        browser.get(f"{base}/status")
        # the template's title, then the Bokeh document's once it is embedded
        assert browser.title in ("Dask Diagnostic UI", "Dask: Status"), browser.title
        links = {
            a.get_attribute("textContent").strip(): a.get_attribute("href")
            for a in browser.find_elements("css selector", ".dropdown-content a")
        }
        assert links.get("Cache Affinity") == f"{base}{PAGE}", links
        assert "Task Stream" in links  # distributed's own entries are still there
        browser.get(links["Cache Affinity"])

        def complete(page, hits):
            return (
                page is not None
                and page["torus_box"] is not None
                and len(page["chunks"]["x"]) == n_chunks
                and len(page["stats"]["node"]) == 3
                and sum(page["stats"]["hits"]) == hits
                and sum(page["stats"]["entries"]) == n_chunks * COLUMNS
            )

        page = wait_js(browser, READ_PAGE, lambda p: complete(p, 0), what="run 1 on the page")
        assert page["title"] == "Dask: Cache Affinity"
        assert page["replica_renderer"] == page["chunk_renderer"] == "GlyphRenderer"
        # every replica point of every node, in the unit square
        assert len(page["replicas"]["x"]) == 3 * replicas
        assert sorted(set(page["replicas"]["node"])) == nodes
        rxy = np.column_stack([page["replicas"]["x"], page["replicas"]["y"]])
        cxy = np.column_stack([page["chunks"]["x"], page["chunks"]["y"]])
        assert ((rxy >= 0) & (rxy < 1)).all() and ((cxy >= 0) & (cxy < 1)).all()
        # every chunk where it ran, and drawn next to its node (nearest replica point)
        ran_on = dict(zip(ids, run1))
        assert sorted(page["chunks"]["chunk"]) == sorted(ids)
        assert [ran_on[c] for c in page["chunks"]["chunk"]] == page["chunks"]["node"]
        drawn_nearest = nearest_node_2d(cxy, rxy, page["replicas"]["node"])
        assert list(drawn_nearest) == page["chunks"]["node"]
        # the table: one row per node, run 1's numbers
        st = page["stats"]
        assert st["node"] == nodes
        assert rendered(page, "node") == nodes  # the table as drawn: one row per node
        assert rendered(page, "placements") == [str(run1.count(n)) for n in nodes]
        assert st["placements"] == st["recent"] == [run1.count(n) for n in nodes]
        assert st["misses"] == [COLUMNS * run1.count(n) for n in nodes]
        assert st["replicas"] == [replicas] * 3
        assert sum(st["evictions"]) == sum(st["steals"]) == 0

        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot))
        check_png(shot, page["torus_box"], NODE_COLORS)

        # Live: run 2 (same chunks) shows up without reloading the page.
        client.gather(
            cacheaffinity.map_chunks(client, cache_chunk, ids, chunk_ids=ids, pure=False)
        )
        page = wait_js(
            browser, READ_PAGE,
            lambda p: complete(p, n_chunks * COLUMNS)
            and rendered(p, "hit_rate") == ["50.0%"] * 3,  # drawn, not only sent
            what="run 2 on the page",
        )
        st = page["stats"]
        assert st["placements"] == [2 * run1.count(n) for n in nodes]
        assert st["hits"] == st["misses"] == [COLUMNS * run1.count(n) for n in nodes]
        assert st["hit_rate"] == [0.5] * 3
        assert rendered(page, "placements") == [str(2 * run1.count(n)) for n in nodes]
        assert rendered(page, "hits") == [str(COLUMNS * run1.count(n)) for n in nodes]
        assert len(page["chunks"]["x"]) == n_chunks == len(set(page["chunks"]["chunk"]))
        assert browser.save_screenshot(str(shot))
        check_png(shot, page["torus_box"], NODE_COLORS)
        if os.environ.get("CACHEAFFINITY_SAVE_SCREENSHOT"):  # docs/dashboard.png
            shutil.copy(shot, os.environ["CACHEAFFINITY_SAVE_SCREENSHOT"])

        # JupyterLab's Dask panel: the page named in /individual-plots.json renders the
        # same document, without the navigation bar
        plots = json.loads(HTTPClient().fetch(f"{base}/individual-plots.json").body)
        assert plots[INDIVIDUAL_NAME] == INDIVIDUAL_PAGE, plots
        browser.get(f"{base}{plots[INDIVIDUAL_NAME]}")
        page = wait_js(
            browser, READ_PAGE, lambda p: complete(p, n_chunks * COLUMNS),
            what="the individual page",
        )
        assert page["title"] == "Dask: Cache Affinity"
        assert not browser.find_elements("css selector", ".dropdown-content a")  # no menu
        shot = tmp_path / "individual.png"
        assert browser.save_screenshot(str(shot))
        check_png(shot, page["torus_box"], NODE_COLORS)
        browser.get("about:blank")  # leave the page before the scheduler closes


# ---------------------------------------------------------------- HTTP and models
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, scheduler_kwargs=HTTP)
async def test_page_added_when_plugin_registered_on_a_running_scheduler(c, s, a, b, tmp_path):
    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{s.http_server.port}"
    status = (await http.fetch(f"{base}/status")).body.decode()
    assert 'href="cacheaffinity"' not in status
    missing = await http.fetch(f"{base}{PAGE}", raise_error=False)
    assert missing.code == 404
    plots = json.loads((await http.fetch(f"{base}/individual-plots.json")).body)
    assert "Individual Task Stream" in plots and INDIVIDUAL_NAME not in plots

    await c.register_plugin(CacheAffinityPlugin())
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(
        lambda: len(plugin.membership.node_workers) == 2
        and not any(n.startswith(HOST_NODE_PREFIX) for n in plugin.membership.node_workers),
        timeout=30,
    )
    status = (await http.fetch(f"{base}/status")).body.decode()
    assert status.count('href="cacheaffinity"') == 1
    page = (await http.fetch(f"{base}{PAGE}")).body.decode()
    # a Bokeh server session (the document was built for this request) in Dask's template
    assert "embed_document" in page and "Dask Diagnostic UI" in page
    assert 'href="cacheaffinity"' in page  # its own menu too
    await check_individual_page(http, base)

    # Registered again (replaced): still one page, one menu entry.
    with pytest.warns(UserWarning, match="overwriting"):
        await s.register_scheduler_plugin(CacheAffinityPlugin(), idempotent=False)
    assert install(s) is True
    pages = [x for x in s.http_application.applications if PAGE in getattr(x, "app_paths", ())]
    assert len(pages) == 1
    await check_individual_page(http, base)
    status = (await http.fetch(f"{base}/status")).body.decode()
    assert status.count('href="cacheaffinity"') == 1

    # The page's models, filled from the current plugin.
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(lambda: len(plugin.membership.node_workers) == 2, timeout=30)
    ids = chunk_ids(40, run="b")
    await c.gather(cacheaffinity.map_chunks(c, cache_chunk, ids, chunk_ids=ids))
    view = TorusView(s)
    n_points = len(plugin.placement._state.points)
    assert n_points == 2 * plugin.placement.replicas
    assert len(view.replicas.data["x"]) == n_points
    assert sorted(view.chunks.data["chunk"]) == sorted(ids)
    homes = plugin.where(ids)
    assert view.chunks.data["node"] == [homes[i]["node"] for i in view.chunks.data["chunk"]]
    assert view.stats.data["node"] == sorted(plugin.membership.node_workers)
    assert sum(view.stats.data["placements"]) == len(ids)
    assert "2 cache nodes" in view.header.text and "torus D=3" in view.header.text

    # Without the plugin: a notice, nothing drawn, no error.
    await c.unregister_scheduler_plugin("cacheaffinity")
    view.update()
    assert "no cacheaffinity plugin" in view.header.text
    assert view.replicas.data["x"] == [] and view.stats.data["node"] == []


async def check_individual_page(http, base):
    """``/individual-plots.json`` lists the page once, beside distributed's own, and it
    serves a Bokeh document without the dashboard's navigation."""
    plots = json.loads((await http.fetch(f"{base}/individual-plots.json")).body)
    assert plots[INDIVIDUAL_NAME] == INDIVIDUAL_PAGE, plots
    assert list(plots.values()).count(INDIVIDUAL_PAGE) == 1
    assert plots.get("Individual Task Stream") == "/individual-task-stream", plots
    page = (await http.fetch(f"{base}{INDIVIDUAL_PAGE}")).body.decode()
    assert "embed_document" in page and "Dask: Cache Affinity" in page
    assert 'href="cacheaffinity"' not in page  # no navigation bar


@pytest.mark.parametrize("preload", ["cacheaffinity", "cacheaffinity.preload"])
def test_individual_page_listed_with_local_cluster(preload):
    """``LocalCluster`` with the preload in the Dask config (either entry point)."""
    with dask.config.set({"distributed.scheduler.preload": [preload]}):
        cluster = LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False,
            dashboard_address="127.0.0.1:0",
        )
    with cluster:
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"

        async def fetch():
            http = AsyncHTTPClient()
            await check_individual_page(http, base)

        cluster.sync(fetch)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_no_dashboard_no_page(c, s, a):
    await c.register_plugin(CacheAffinityPlugin())  # starts fine without a dashboard
    assert "cacheaffinity" in s.plugins
    assert install(s) is False


#: A site's own click-configurable scheduler preload (as dask-gateway's is).
SITE_PRELOAD = """
import click

@click.command()
@click.option("--site-flag", default="off")
def dask_setup(scheduler, site_flag):
    scheduler.site_flag = site_flag
"""


def _dask_scheduler(tmp_path, *preload_args):
    scheduler_file = tmp_path / "scheduler.json"
    (tmp_path / "site_preload.py").write_text(SITE_PRELOAD)
    args = [str(tmp_path / "site_preload.py") if a == "SITE" else a for a in preload_args]
    with open(tmp_path / "scheduler.log", "w") as log:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dask"), "scheduler",
                "--host", "127.0.0.1", "--port", "0",
                "--dashboard-address", "127.0.0.1:0",
                "--scheduler-file", str(scheduler_file),
                *args,
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )
    return proc, scheduler_file


@pytest.mark.timeout(120)
def test_two_click_preloads_refused_by_dask(tmp_path):
    """Why ``cacheaffinity.preload`` exists: distributed refuses two click preloads."""
    proc, _ = _dask_scheduler(
        tmp_path, "--preload", "SITE", "--preload", "cacheaffinity", "--site-flag", "on"
    )
    assert proc.wait(90) != 0
    assert "Multiple --preload modules with click-configurable setup" in (
        tmp_path / "scheduler.log"
    ).read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "preload_args",
    [
        pytest.param(("--preload", "cacheaffinity"), id="click"),
        pytest.param(
            ("--preload", "SITE", "--preload", "cacheaffinity.preload", "--site-flag", "on"),
            id="composed-with-a-click-preload",
        ),
    ],
)
def test_page_with_dask_scheduler_preload(tmp_path, preload_args):
    """``dask scheduler --preload cacheaffinity`` (a real process) serves the page; so
    does ``--preload cacheaffinity.preload`` next to another click preload."""
    proc, scheduler_file = _dask_scheduler(tmp_path, *preload_args)
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        port = json.loads(scheduler_file.read_text())["services"]["dashboard"]
        http = HTTPClient()
        try:
            base = f"http://127.0.0.1:{port}"
            page = http.fetch(f"{base}{PAGE}").body.decode()
            status = http.fetch(f"{base}/status").body.decode()
        finally:
            http.close()
        assert "embed_document" in page and 'href="cacheaffinity"' in page
        assert 'href="cacheaffinity"' in status
        http = HTTPClient()
        try:
            plots = json.loads(http.fetch(f"{base}/individual-plots.json").body)
            individual = http.fetch(f"{base}{INDIVIDUAL_PAGE}").body.decode()
        finally:
            http.close()
        assert plots[INDIVIDUAL_NAME] == INDIVIDUAL_PAGE, plots
        assert "embed_document" in individual
        address = json.loads(scheduler_file.read_text())["address"]
        with Client(address, timeout=60) as client:
            ran = client.run_on_scheduler(
                lambda dask_scheduler: (
                    getattr(dask_scheduler, "site_flag", None),
                    "cacheaffinity" in dask_scheduler.plugins,
                )
            )
        assert ran == ("on" if "SITE" in preload_args else None, True)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_page_of_a_thousand_nodes():
    """A facility's 1000 nodes: the page updates (Bokeh's palettes end at 256 colours: it
    raised), every node has a row and a colour, and neighbours in name order differ."""
    import asyncio

    from benchmarks.scheduler_scale import SETTINGS, add_fake_worker, chunk_ids as scale_chunk_ids
    from cacheaffinity.protocol import ANNOTATION
    from cacheaffinity.scheduler._dashboard import node_colors

    async def main():
        with dask.config.set(SETTINGS):
            s = Scheduler(host="127.0.0.1", port=0, dashboard=False, validate=False)
            await s
            try:
                for i in range(1000):
                    add_fake_worker(s, i, 8)
                plugin = CacheAffinityPlugin()
                s.add_plugin(plugin)
                await plugin.start(s)
                keys = [f"t-{i}" for i in range(3000)]
                for k in keys:
                    s.new_task(k, None, "released")
                plugin.update_graph(s, keys=set(), tasks=keys,
                                    annotations={ANNOTATION: dict(zip(keys, scale_chunk_ids(3000)))},
                                    stimulus_id="place")  # fmt: skip
                view = TorusView(s)
                view.update()
                nodes = view.stats.data["node"]
                assert nodes == sorted(plugin.membership.node_workers) and len(nodes) == 1000
                assert sum(view.stats.data["placements"]) == 3000
                assert "1,000 cache nodes" in view.header.text or "1000 cache nodes" in view.header.text
            finally:
                for a in list(s.stream_comms):
                    s.stream_comms.pop(a, None)
                await s.close()

    asyncio.run(main())
    colors = node_colors([f"node-{i:05d}" for i in range(1000)])
    names = sorted(colors)
    assert len(colors) == 1000 and all(c.startswith("#") for c in colors.values())
    assert all(colors[a] != colors[b] for a, b in zip(names, names[1:]))
    assert colors == node_colors(list(reversed(names)))  # stable for a node set
