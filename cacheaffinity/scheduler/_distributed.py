"""The one place where cacheaffinity touches distributed's scheduler internals.

Runs in the scheduler process.  Everything the scheduler side needs from
distributed beyond its documented plugin API (``SchedulerPlugin`` hooks,
``Scheduler.tasks``/``workers``/``log_event``, ``TaskState`` restriction
fields) goes through this module, so that an upstream change breaks one file
and the test that checks these names (``tests/test_dask_faithful.py::
test_distributed_internals_used_by_the_adapter_exist``).

Undocumented names of distributed used here (none starts with an underscore):

* ``distributed.stealing.WorkStealing`` and of its instances:
  ``put_key_in_stealable(ts)`` (the seam :class:`ChunkAwareWorkStealing`
  overrides), ``key_stealable``, ``remove_key_from_stealable(ts)``,
  ``move_task_request(ts, victim, thief)`` (the steal-request protocol),
  ``in_flight``, ``in_flight_tasks``, ``metrics["request_count_total"]``,
  ``log(msg)``, ``count``;
* ``tornado.ioloop.PeriodicCallback.callback`` (who registered a periodic callback);
* ``Scheduler.extensions["stealing"]``, ``Scheduler.periodic_callbacks``,
  ``Scheduler.idle``, ``Scheduler.coerce_hostname(host)``,
  ``Scheduler.bulk_schedule_unrunnable_after_adding_worker(ws)``,
  ``Scheduler.transitions(recs, stimulus_id)``;
* ``WorkerState.processing``, ``executing``, ``long_running``, ``resources``,
  ``status``;
* the dashboard's (for :mod:`cacheaffinity.scheduler.dashboard`):
  ``Scheduler.http_application`` (a ``distributed.http.routing.RoutingApplication``:
  ``applications``, ``add_application(app)``),
  ``distributed.dashboard.core.BokehApplication``,
  ``distributed.dashboard.scheduler.template_variables(scheduler)`` (memoised),
  ``distributed.dashboard.components.add_periodic_callback``,
  ``distributed.dashboard.components.scheduler.BOKEH_THEME`` and ``env`` (its
  Jinja templates), ``distributed.http.scheduler.info.IndividualPlots``;
* ``distributed.http.prometheus.PrometheusCollector`` (``build_name``,
  ``namespace``, ``subsystem``; for :mod:`cacheaffinity.scheduler.metrics`);
* one private name, of the worker (for :mod:`cacheaffinity.preload`):
  ``Worker._pending_plugins``, the plugins a worker sets up as it starts
  (:func:`fail_worker_start`).

:data:`NAMES` lists those that live on modules and classes; :func:`check` says
which are gone (the test above calls it; instance attributes are checked there
on a real scheduler).

It holds mechanism only (what Dask allows, how a move or a periodic callback
is made); what to steal and when is decided in
:mod:`cacheaffinity.scheduler.stealing`.

Checked (tests/test_stealing.py, test_scheduler_plugin.py, test_dask_faithful.py
pass) with distributed/dask 2026.8.0 (the project's pin), 2026.3.0 and 2026.1.2
(2026.1.0 cannot be installed with dask 2026.1.0: its metadata asks for dask
2025.12).

Notes
-----
Stock stealing is *adopted*, not replaced: the ``WorkStealing`` object Dask
created keeps its state, its plugin registration and its ``steal-response``
stream handler; only its class becomes :class:`ChunkAwareWorkStealing`, whose
single override keeps chunk tasks out of the stealable sets.  So plain tasks
are balanced exactly as stock Dask does (same object, same code), and the
locality policy moves chunk tasks with the same ``steal-request`` protocol, so
the in-flight bookkeeping of both is one.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

from distributed.http.prometheus import PrometheusCollector
from distributed.stealing import WorkStealing

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState
    from tornado.ioloop import PeriodicCallback

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = [
    "NAMES",
    "fail_worker_start",
    "ChunkAwareWorkStealing",
    "PrometheusCollector",
    "add_dashboard_pages",
    "adopt_stealing",
    "check",
    "dashboard_apps",
    "dashboard_document",
    "idle_workers",
    "in_flight",
    "in_flight_tasks",
    "is_executing",
    "may_run_on",
    "queued",
    "record_requests",
    "release_stealing",
    "request_move",
    "schedule_unrunnable",
    "serve_individual_plots",
    "stealable_from",
    "stealing_extension",
    "start_periodic",
    "stop_periodic",
]

#: ``(module, dotted name)`` of the undocumented names above that live on a module
#: or a class (:func:`check`).
NAMES = (
    ("distributed.stealing", "WorkStealing.put_key_in_stealable"),
    ("distributed.stealing", "WorkStealing.remove_key_from_stealable"),
    ("distributed.stealing", "WorkStealing.move_task_request"),
    ("distributed.stealing", "WorkStealing.log"),
    ("distributed.scheduler", "Scheduler.coerce_hostname"),
    ("distributed.scheduler", "Scheduler.bulk_schedule_unrunnable_after_adding_worker"),
    ("distributed.scheduler", "Scheduler.transitions"),
    ("distributed.scheduler", "WorkerState.processing"),
    ("distributed.scheduler", "WorkerState.executing"),
    ("distributed.scheduler", "WorkerState.long_running"),
    ("distributed.scheduler", "WorkerState.resources"),
    ("distributed.scheduler", "WorkerState.status"),
    ("tornado.ioloop", "PeriodicCallback"),
    ("distributed.http.routing", "RoutingApplication.add_application"),
    ("distributed.dashboard.core", "BokehApplication"),
    ("distributed.dashboard.scheduler", "template_variables"),
    ("distributed.dashboard.components", "add_periodic_callback"),
    ("distributed.dashboard.components.scheduler", "BOKEH_THEME"),
    ("distributed.dashboard.components.scheduler", "env"),
    ("distributed.http.scheduler.info", "IndividualPlots"),
    ("distributed.http.prometheus", "PrometheusCollector.build_name"),
)


def fail_worker_start(worker: Any, plugin: Any) -> bool:
    """Add ``plugin`` to the plugins ``worker`` sets up as it starts (so that a plugin
    whose ``setup`` raises makes the start fail with that error); False if this
    distributed has no such list (the caller raises instead)."""
    pending = getattr(worker, "_pending_plugins", None)
    if not isinstance(pending, tuple):
        return False
    worker._pending_plugins = (*pending, plugin)
    return True


def check() -> list[str]:
    """Which of :data:`NAMES` the installed distributed no longer has (empty: all)."""
    problems = []
    for module, dotted in NAMES:
        try:
            obj: Any = importlib.import_module(module)
        except ImportError as e:
            problems.append(f"{module}: {e}")
            continue
        for part in dotted.split("."):
            if not hasattr(obj, part):
                problems.append(f"{module}.{dotted} is gone")
                break
            obj = getattr(obj, part)
    return problems


class ChunkAwareWorkStealing(WorkStealing):
    """Dask's ``WorkStealing`` that leaves chunk tasks alone.

    The only override is :meth:`put_key_in_stealable`: a task whose key is in
    :attr:`chunk_tasks` never enters the stealable sets, so stock balancing
    never picks it.  Everything else (cost levels, fast-task blocklist,
    restriction checks, in-flight protocol, metrics, interval) is stock.
    """

    #: Keys of the tasks cacheaffinity places (a live container owned by the
    #: placement plugin's locator); empty: behaves exactly as ``WorkStealing``.
    chunk_tasks: Container = frozenset()

    def put_key_in_stealable(self, ts: TaskState) -> None:
        if ts.key in self.chunk_tasks:
            return
        super().put_key_in_stealable(ts)


def adopt_stealing(scheduler: Scheduler, chunk_tasks: Container) -> WorkStealing | None:
    """Make the scheduler's stealing extension leave ``chunk_tasks`` alone.

    Returns the extension, or None when the scheduler has none
    (``distributed.scheduler.work-stealing: false``) or has a stealing
    extension of another kind (left as it is, with a warning: it may move chunk
    tasks).  Idempotent.
    """
    ext: Any = scheduler.extensions.get("stealing")
    if ext is None:
        return None
    if type(ext) is WorkStealing:
        ext.__class__ = ChunkAwareWorkStealing
    if not isinstance(ext, ChunkAwareWorkStealing):
        logger.warning(
            "cacheaffinity: the scheduler's stealing extension is a %s, not Dask's "
            "WorkStealing; it is left as it is and may move chunk tasks off their cache node",
            type(ext).__name__,
        )
        return None
    ext.chunk_tasks = chunk_tasks
    for ts in [ts for ts in ext.key_stealable if ts.key in chunk_tasks]:
        ext.remove_key_from_stealable(ts)
    return ext


def release_stealing(scheduler: Scheduler, chunk_tasks: Container) -> None:
    """Give chunk tasks back to stock stealing (the plugin is going away), if the
    scheduler's stealing extension still leaves ``chunk_tasks`` (the same
    container) alone; a plugin that replaced it keeps its own."""
    ext = scheduler.extensions.get("stealing")
    if isinstance(ext, ChunkAwareWorkStealing) and ext.chunk_tasks is chunk_tasks:
        ext.chunk_tasks = frozenset()


def stealing_extension(scheduler: Scheduler) -> ChunkAwareWorkStealing | None:
    """The scheduler's stealing extension if it leaves chunk tasks to cacheaffinity."""
    ext = scheduler.extensions.get("stealing")
    return ext if isinstance(ext, ChunkAwareWorkStealing) else None


def in_flight(ext: WorkStealing | None) -> dict[TaskState, dict]:
    """Tasks with a steal request under way (the stock extension's record)."""
    return {} if ext is None else ext.in_flight


def queued(ext: WorkStealing | None, ws: WorkerState) -> int:
    """Tasks processing on ``ws`` beyond its threads, net of pending steal requests
    (negative: free threads)."""
    return len(ws.processing) + in_flight_tasks(ext, ws) - ws.nthreads


def record_requests(ext: WorkStealing, moved: list[tuple[Any, ...]], now: float) -> None:
    """Count and log steal requests of one round as stock stealing does its own:
    ``moved`` is ``[(task, victim, thief)]``; the ``stealing`` event topic gets one
    ``request`` entry and ``dask_stealing_request_count_total`` grows by ``len(moved)``."""
    if not moved:
        return
    ext.metrics["request_count_total"][0] += len(moved)
    ext.log(("request", [(now, 0, ts.key, 0, v.address, 0, t.address, 0) for ts, v, t in moved]))
    ext.count += 1


def start_periodic(
    scheduler: Scheduler, name: str, callback: Callable[[], Any], interval: float
) -> PeriodicCallback:
    """Run ``callback`` every ``interval`` seconds as ``scheduler.periodic_callbacks[name]``
    (as distributed's own extensions register theirs; the scheduler stops them
    when it closes).  A callback of another object under ``name`` (a plugin that
    was replaced) is stopped and replaced; the same one again: left running."""
    from tornado.ioloop import PeriodicCallback

    pcs = scheduler.periodic_callbacks
    old = pcs.get(name)
    if old is not None:
        if old.callback == callback:
            return old
        old.stop()
    pc = pcs[name] = PeriodicCallback(callback, interval * 1000)
    pc.start()
    return pc


def stop_periodic(scheduler: Scheduler, name: str, callback: Callable[[], Any]) -> None:
    """Stop ``scheduler.periodic_callbacks[name]`` if it runs ``callback`` (idempotent)."""
    pcs = scheduler.periodic_callbacks
    pc = pcs.get(name)
    if pc is not None and pc.callback == callback:
        del pcs[name]
        pc.stop()


def request_move(ext: WorkStealing, ts: TaskState, victim: WorkerState, thief: WorkerState) -> bool:
    """Send the stock ``steal-request`` for ``ts``; True if a request went out."""
    if ts in ext.in_flight:
        return False
    out = ext.move_task_request(ts, victim, thief)
    return out not in ("in-flight", "comm-closed")


def in_flight_tasks(ext: WorkStealing | None, ws: WorkerState) -> int:
    """Net tasks moving to (+) or away from (-) ``ws`` by pending steal requests."""
    return 0 if ext is None else ext.in_flight_tasks[ws]


def is_executing(ws: WorkerState, ts: TaskState) -> bool:
    """Whether ``ts`` has started on ``ws`` (a steal request would be refused)."""
    return ts in ws.executing or ts in ws.long_running


def stealable_from(
    scheduler: Scheduler,
    ext: WorkStealing | None,
    victim: WorkerState,
    thief: WorkerState,
    chunk_tasks: Container,
) -> list[TaskState]:
    """The tasks processing on ``victim`` that the stealing policy may hand to
    ``thief``: chunk tasks (key in ``chunk_tasks``) without a steal request
    under way, not started (:func:`is_executing`) and that :func:`may_run_on`
    ``thief``; in ``victim.processing`` order.  One pass; a task with loose
    restrictions and neither resources nor an actor is not looked at twice."""
    in_flight = ext.in_flight if ext is not None else {}
    executing, long_running = victim.executing, victim.long_running
    out = []
    for ts in victim.processing:
        if (
            ts.key in chunk_tasks
            and ts not in in_flight
            and ts not in executing
            and ts not in long_running
            and (
                (ts.loose_restrictions and not ts.resource_restrictions and not ts.actor)
                or may_run_on(scheduler, ts, thief)
            )
        ):
            out.append(ts)
    return out


def idle_workers(scheduler: Scheduler) -> dict[str, WorkerState]:
    """The scheduler's idle, running workers by address (paused ones excluded)."""
    return {a: ws for a, ws in scheduler.idle.items() if ws.status.name == "running"}


def may_run_on(scheduler: Scheduler, ts: TaskState, ws: WorkerState) -> bool:
    """Whether moving ``ts`` to ``ws`` respects every restriction a user set.

    Resource restrictions are always binding (a worker without the resource
    cannot run the task).  Worker and host restrictions bind unless the task
    allows other workers (cacheaffinity's own restrictions of chunk tasks always
    do).  Actors never move.
    """
    if ts.actor:
        return False
    if ts.resource_restrictions:
        have = ws.resources
        if any(have.get(r, 0) < need for r, need in ts.resource_restrictions.items()):
            return False
    if ts.loose_restrictions:
        return True
    # As Scheduler.valid_workers: the named workers and the workers on the named hosts.
    allowed: bool | None = None
    if ts.worker_restrictions:
        allowed = ws.address in ts.worker_restrictions
    if ts.host_restrictions:
        on_host = ws.host in {scheduler.coerce_hostname(h) for h in ts.host_restrictions}
        allowed = on_host or bool(allowed)
    return allowed is not False


def schedule_unrunnable(scheduler: Scheduler, ws: WorkerState, stimulus_id: str) -> None:
    """Let tasks waiting in ``no-worker`` run on ``ws`` if they may (a node joined)."""
    scheduler.transitions(scheduler.bulk_schedule_unrunnable_after_adding_worker(ws), stimulus_id)


# ---------------------------------------------------------------------------
# The dashboard: a page of our own beside distributed's
# ---------------------------------------------------------------------------
def dashboard_apps(scheduler: Scheduler) -> list:
    """The Bokeh applications of ``scheduler``'s dashboard (empty: it has none)."""
    from bokeh.server.tornado import BokehTornado

    app = getattr(scheduler, "http_application", None)
    if app is None:
        return []
    return [a for a in getattr(app, "applications", ()) if isinstance(a, BokehTornado)]


def add_dashboard_pages(
    scheduler: Scheduler, pages: Mapping[str, Callable], prefix: str
) -> dict[str, Any]:
    """Serve Bokeh ``pages`` (``{path: f(scheduler, extra, doc)}``) under ``prefix``
    as distributed serves its dashboard (same settings, stopped with the scheduler).
    Returns the dashboard's template variables (one memoised dict: its ``plots``
    list is the "More..." menu of every page)."""
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables
    from tornado.ioloop import IOLoop

    variables = template_variables(scheduler)
    app = BokehApplication(dict(pages), scheduler, prefix=prefix, template_variables=variables)
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return variables


def dashboard_document(
    doc: Any, view: Any, interval_ms: int, title: str, template: str | None, extra: dict
) -> None:
    """Fill a Bokeh ``doc`` as distributed's pages are: ``view.root``, ``view.update``
    every ``interval_ms``, the dashboard's theme and (``template``: one of its
    templates, e.g. ``"simple.html"``) its navigation with variables ``extra``."""
    from distributed.dashboard.components import add_periodic_callback
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    doc.title = title
    add_periodic_callback(doc, view, interval_ms)
    doc.add_root(view.root)
    if template is not None:
        doc.template = env.get_template(template)
        doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def serve_individual_plots(scheduler: Scheduler, prefix: str, extra: Mapping[str, str]) -> None:
    """Answer ``<prefix>/individual-plots.json`` with distributed's list plus ``extra``
    (``{name: path}``).  distributed lists only the ``individual-*`` pages of its own
    Bokeh application; tornado tries routes added with ``add_handlers`` before the
    ones the application was created with, so this answers instead (same URL).
    tests/test_dashboard.py fetches the JSON: a change upstream fails there."""
    from distributed.http.scheduler.info import IndividualPlots

    added = dict(extra)

    class ExtendedIndividualPlots(IndividualPlots):
        def write(self, chunk):
            if isinstance(chunk, dict):
                chunk = {**chunk, **added}
            return super().write(chunk)

    route = "/" + prefix.strip("/")
    route = (route if route.endswith("/") else route + "/") + "individual-plots.json"
    scheduler.http_application.add_handlers(
        r".*$", [(route, ExtendedIndividualPlots, {"dask_server": scheduler})]
    )
