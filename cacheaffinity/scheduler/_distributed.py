"""The one place where cacheaffinity uses distributed's undocumented internals.

Runs in the scheduler (``fail_worker_start``: in a worker). Mechanism only; what
to steal and when is decided in ``_stealing``. ``NAMES`` lists the internals that
live on modules and classes; ``check`` names those gone (called, with the instance
attributes checked on a real scheduler, by ``tests/test_dask_faithful.py``).
Besides them: ``WorkStealing``'s ``key_stealable``, ``in_flight``,
``in_flight_tasks``, ``metrics``, ``count``; ``Scheduler.extensions["stealing"]``,
``periodic_callbacks``, ``idle``, ``http_application.applications``;
``PeriodicCallback.callback``; ``PrometheusCollector.namespace``, ``subsystem``;
and one private name, ``Worker._pending_plugins``.
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

#: ``(module, dotted name)`` of the undocumented names used that live on a module or class.
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
    """Have ``worker`` set ``plugin`` up as it starts, so that a raising ``setup``
    fails the start; False if this distributed has no such list."""
    pending = getattr(worker, "_pending_plugins", None)
    if not isinstance(pending, tuple):
        return False
    worker._pending_plugins = (*pending, plugin)
    return True


def check() -> list[str]:
    """The entries of ``NAMES`` the installed distributed no longer has."""
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
    """Dask's ``WorkStealing``, except that tasks keyed in ``chunk_tasks`` (the
    locator's live container) never enter the stealable sets."""

    chunk_tasks: Container = frozenset()

    def put_key_in_stealable(self, ts: TaskState) -> None:
        if ts.key in self.chunk_tasks:
            return
        super().put_key_in_stealable(ts)


def adopt_stealing(scheduler: Scheduler, chunk_tasks: Container) -> WorkStealing | None:
    """Make the scheduler's stealing extension leave ``chunk_tasks`` alone (idempotent).

    The object Dask made only changes class, so it keeps its state, plugin
    registration and ``steal-response`` handler, and plain tasks are stolen by
    stock code. None: no extension, or one of another kind (left as it is).
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
    """Give ``chunk_tasks`` back to stock stealing if the extension still holds this
    very container (a plugin that replaced ours keeps its own)."""
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
    """Count and log one round's ``[(task, victim, thief)]`` as stock stealing does
    (``stealing`` event topic, ``dask_stealing_request_count_total``)."""
    if not moved:
        return
    ext.metrics["request_count_total"][0] += len(moved)
    ext.log(("request", [(now, 0, ts.key, 0, v.address, 0, t.address, 0) for ts, v, t in moved]))
    ext.count += 1


def start_periodic(
    scheduler: Scheduler, name: str, callback: Callable[[], Any], interval: float
) -> PeriodicCallback:
    """Run ``callback`` every ``interval`` s as ``scheduler.periodic_callbacks[name]``
    (stopped when the scheduler closes); another callback under ``name`` is replaced."""
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
    """Chunk tasks queued on ``victim``, not started nor being moved, that may run on
    ``thief``, in ``victim.processing`` order."""
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

    Resources always bind; workers and hosts unless restrictions are loose (as
    cacheaffinity's own are). Actors never move.
    """
    if ts.actor:
        return False
    if ts.resource_restrictions:
        have = ws.resources
        if any(have.get(r, 0) < need for r, need in ts.resource_restrictions.items()):
            return False
    if ts.loose_restrictions:
        return True
    # as Scheduler.valid_workers: the named workers and the workers on the named hosts
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
    as distributed serves its dashboard; returns its memoised template variables,
    whose ``plots`` list is the "More..." menu of every page."""
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
    every ``interval_ms``, its theme and, with ``template``, its navigation."""
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
    """Answer ``<prefix>/individual-plots.json`` with distributed's list plus ``extra``.

    distributed lists only its own application's ``individual-*`` pages; tornado
    tries routes added by ``add_handlers`` first. ``tests/test_dashboard.py`` checks it.
    """
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
