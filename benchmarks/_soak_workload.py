"""The soak's workload (:mod:`benchmarks.soak`): its analyses (the light and realistic ones
and :class:`OtherColumnsProcessor`), datasets, schedule of runs and events, and the users who
run them (a session each, or a new process per run).

Sent by value to the workers (the ``other`` analysis's processor), as the soak's own code
was: the workers never import this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import awkward as ak
import cloudpickle
import dask
import hist
import numpy as np
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client

import cacheaffinity
from benchmarks._common import make_dataset, template_path
from benchmarks._runs import normalized
from benchmarks._runs import reference as reference_run
from examples import analysis as light_analysis
from examples import realistic as realistic_analysis

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
#: the script a new-process run starts (``soak.py --child SPEC OUT``)
SCRIPT = ROOT / "benchmarks" / "soak.py"
USERS = ("alice", "bob")


# ----------------------------------------------------------------------------- analyses


class OtherColumnsProcessor(processor.ProcessorABC):
    """Collections neither the light nor the realistic analysis reads: generator jets and
    dressed leptons, isolated tracks, secondary vertices, soft-activity jets, FSR photons,
    track and calorimeter MET.  Integer histograms and counts only (exact whatever the
    order chunks are added in)."""

    def process(self, events):
        dataset = events.metadata["dataset"]
        gj = events.GenJet
        gj = gj[(gj.pt > 20) & (np.abs(gj.eta) < 4.7)]
        dl = events.GenDressedLepton
        trk = events.IsoTrack
        iso = trk[(trk.pt > 5) & (trk.pfRelIso03_all < 0.2)]
        sv = events.SV
        good_sv = sv[(sv.dlenSig > 3) & (sv.ndof > 0) & (np.abs(sv.z) < 30)]
        soft = events.SoftActivityJet
        fsr = events.FsrPhoton
        h_ngen = hist.Hist.new.Integer(0, 20, name="n", label="generator jets").Int64()
        h_ngen.fill(n=ak.to_numpy(ak.num(gj)))
        h_flav = hist.Hist.new.Integer(-1, 6, name="flav", label="hadron flavour").Int64()
        h_flav.fill(flav=ak.to_numpy(ak.flatten(gj.hadronFlavour)))
        h_lep = hist.Hist.new.IntCategory([-15, -13, -11, 11, 13, 15], name="pdg").Int64()
        h_lep.fill(pdg=ak.to_numpy(ak.flatten(dl.pdgId)))
        h_trk = hist.Hist.new.Reg(40, 0, 200, name="pt", label="isolated track pT").Int64()
        h_trk.fill(pt=ak.to_numpy(ak.flatten(iso.pt)))
        h_sv = hist.Hist.new.Reg(30, 0, 6, name="m", label="SV mass").Reg(20, 0, 2, name="r", label="SV r").Int64()
        h_sv.fill(m=ak.to_numpy(ak.flatten(good_sv.mass)), r=ak.to_numpy(ak.flatten(np.hypot(good_sv.x, good_sv.y))))
        h_soft = hist.Hist.new.Reg(25, 0, 250, name="pt", label="soft-activity jet pT").Int64()
        h_soft.fill(pt=ak.to_numpy(ak.flatten(soft.pt)))
        h_met = hist.Hist.new.Reg(30, 0, 300, name="tk", label="TkMET").Reg(
            30, 0, 300, name="calo", label="CaloMET"
        ).Int64()
        h_met.fill(tk=ak.to_numpy(events.TkMET.pt), calo=ak.to_numpy(events.CaloMET.pt))
        return {
            dataset: {
                "entries": len(events),
                "ngen": h_ngen,
                "flavour": h_flav,
                "lepton_pdg": h_lep,
                "isotrack_pt": h_trk,
                "sv_mass": h_sv,
                "soft_pt": h_soft,
                "met": h_met,
                "fsr_photons": int(ak.sum(ak.num(fsr[fsr.pt > 2]))),
                "sv_tracks": int(ak.sum(sv.ndof > 0)),
            }
        }

    def postprocess(self, accumulator):
        return accumulator


def other_summary(out: dict) -> dict:
    """Comparable plain-Python summary of :class:`OtherColumnsProcessor`'s output."""
    result = {}
    for dataset, d in sorted(out.items()):
        result[dataset] = {
            k: (np.asarray(v.view(flow=True)).tolist() if isinstance(v, hist.Hist) else v)
            for k, v in sorted(d.items())
        }
    return result


#: name -> (processor class, summary function)
ANALYSES = {
    "light": (light_analysis.DimuonJetProcessor, light_analysis.summary),
    "realistic": (realistic_analysis.TTbarLikeProcessor, realistic_analysis.summary),
    "other": (OtherColumnsProcessor, other_summary),
}
#: how often each analysis is drawn
ANALYSIS_WEIGHTS = {"light": 0.4, "realistic": 0.35, "other": 0.25}


# ----------------------------------------------------------------------------- data


def analysis_branches(template: str | None = None) -> list[str]:
    """The branches the three analyses read from the template, plus the kinematics
    NanoEvents' behaviours need for each collection read (the datasets hold these only:
    coffea builds a file's form for every chunk, so fewer branches keep runs short)."""
    import uproot

    path = template or template_path()
    read: set[str] = set()
    for proc_cls, _ in ANALYSES.values():
        read |= set(realistic_analysis.branches_read(proc_cls(), path))
    colls = {b.split("_")[0] for b in read if "_" in b}
    with uproot.open(path) as f:
        names = set(f["Events"].keys())
    kin = {f"{c}_{k}" for c in colls for k in ("pt", "eta", "phi", "mass", "charge")}
    return sorted(read | (kin & names))


def prepare_datasets(cfg) -> dict[str, list[str]]:
    """``{name: files}`` of the soak's datasets (LZMA, the branches of
    :func:`analysis_branches`), generated once per parameters and reused."""
    branches = analysis_branches()
    out = {}
    for name, (events, files, seed) in sorted(cfg.datasets.items()):
        d = Path(cfg.data) / f"{name}-{events}ev-{files}f-seed{seed}-b{cfg.basket_events}"
        stamp = d / "params.json"
        params = {"events": events, "files": files, "seed": seed, "basket_events": cfg.basket_events,
                  "branches": branches}  # fmt: skip
        if not stamp.exists() or json.loads(stamp.read_text()) != params:
            shutil.rmtree(d, ignore_errors=True)
            make_dataset(
                d, events=events, files=files, codec="lzma", seed=seed, branches=branches,
                basket_events=cfg.basket_events, progress=cfg.progress,
            )  # fmt: skip
            stamp.write_text(json.dumps(params))
        out[name] = sorted(str(f) for f in d.glob("nano_*.root"))
    return out


def chunk_ids(files: dict[str, list[str]]) -> int:
    """Chunk ids the soak's runs can place: every placement stripe of every file
    (:func:`cacheaffinity.coffea._identity.default_stripe_entries`, whatever the chunksize)
    and one preprocessing id per file: what bounds the locator's ``holder``."""
    import uproot

    from cacheaffinity.coffea._identity import default_stripe_entries

    n = 0
    for fs in files.values():
        for f in fs:
            with uproot.open(f) as rf:
                entries = rf["Events"].num_entries
            n += -(-entries // default_stripe_entries(entries)) + 1
    return n


# ----------------------------------------------------------------------------- schedule


@dataclasses.dataclass
class RunSpec:
    run: int
    user: str
    analysis: str
    dataset: str
    chunksize: int
    process: str = "same"  # or "new"


@dataclasses.dataclass
class Step:
    step: int
    runs: list[RunSpec]
    #: before the step: "scale-down", "scale-up", "chunksize"
    events: list[str] = dataclasses.field(default_factory=list)
    #: kill a worker during the step: (slot index among the live workers, n: it dies when
    #: starting its n-th task of the step)
    kill: tuple[int, float] | None = None

    def describe(self) -> str:
        ev = list(self.events) + (["kill"] if self.kill else [])
        return ",".join(ev)


def make_schedule(cfg) -> list[Step]:
    """The soak's steps: deterministic for ``cfg.seed`` (and the other settings).

    The first runs are a tour of every (analysis, dataset) pair, and the first runs after
    the chunksize change one of every dataset, so that every chunk the workload has is
    placed early (structures per chunk stop growing then); the rest are drawn at random
    (analysis by :data:`ANALYSIS_WEIGHTS`, dataset and user uniformly, ``alice`` 60 %),
    with a kill's run on the largest dataset (every worker gets tasks)."""
    rng = random.Random(cfg.seed)
    names = sorted(cfg.datasets)
    analyses = list(ANALYSIS_WEIGHTS)
    weights = [ANALYSIS_WEIGHTS[a] for a in analyses]
    change = cfg.change_at()
    down_at = set(range(cfg.scale_every, cfg.runs + 1, cfg.scale_every)) if cfg.scale_every else set()
    up_at = {r + max(1, cfg.scaled_down_runs) for r in down_at}
    kills = set(range(cfg.kill_every, cfg.runs + 1, cfg.kill_every)) if cfg.kill_every else set()
    news = set(range(cfg.new_process_every, cfg.runs + 1, cfg.new_process_every)) if cfg.new_process_every else set()
    largest = max(names, key=lambda n: cfg.datasets[n][0])
    tour = [(a, d) for a in analyses for d in names]
    rng.shuffle(tour)
    tours = {r: pair for r, pair in enumerate(tour, start=1)}
    tours.update({change + i: (None, d) for i, d in enumerate(names)})
    steps: list[Step] = []
    r = 1
    while r <= cfg.runs:
        def spec(run: int, user: str) -> RunSpec:
            analysis, dataset = tours.get(run, (None, None))
            return RunSpec(
                run=run, user=user, analysis=analysis or rng.choices(analyses, weights)[0],
                dataset=dataset or rng.choice(names), chunksize=cfg.chunksize if run < change else cfg.chunksize_after,
                process="new" if run in news else "same",
            )  # fmt: skip

        events = []
        if r in down_at:
            events.append("scale-down")
        if r in up_at:
            events.append("scale-up")
        if r == change:
            events.append("chunksize")
        # two runs at once: neither a kill, a new process or an event before the second
        nxt = r + 1
        pair = (
            nxt <= cfg.runs and rng.random() < cfg.concurrent_share
            and not ({r, nxt} & (kills | news)) and nxt not in down_at | up_at and nxt != change
        )  # fmt: skip
        if pair:
            runs = [spec(r, "alice"), spec(nxt, "bob")]
        else:
            runs = [spec(r, rng.choices(USERS, (0.6, 0.4))[0])]
        kill = None
        if r in kills:  # the victim dies when it starts its 1st or 2nd task of the run
            kill = (rng.randrange(cfg.processes()), rng.randint(1, 2))
            if r not in tours:
                runs[0].dataset = largest
        steps.append(Step(step=len(steps) + 1, runs=runs, events=events, kill=kill))
        r += len(runs)
    return steps


# ----------------------------------------------------------------------------- runs


def client_run(executor, analysis: str, fileset: dict, chunksize: int, metadata_cache: dict | None) -> dict:
    """One run (a ``Runner`` call) of ``analysis``: ``{"wall_s", "summary", "stats"}``."""
    proc_cls, summary = ANALYSES[analysis]
    runner = processor.Runner(
        executor=executor, schema=NanoAODSchema, chunksize=chunksize, savemetrics=True,
        metadata_cache=metadata_cache,
    )  # fmt: skip
    t0 = time.perf_counter()
    out, _ = runner(fileset, processor_instance=proc_cls(), treename="Events")
    wall = time.perf_counter() - t0
    stats = getattr(executor, "last_run_stats", None)
    return {"wall_s": wall, "summary": normalized(summary(out)), "stats": dict(stats) if stats else None}


def reference(analysis: str, fileset: dict, chunksize: int) -> Any:
    """coffea's ``IterativeExecutor`` result of ``analysis`` (the comparison's truth)."""
    proc_cls, summary = ANALYSES[analysis]
    return reference_run(proc_cls, summary, fileset, chunksize)["summary"]


class User:
    """A user's session: a client and executor of its own, coffea's metadata cache kept."""

    def __init__(self, name: str, address: str):
        self.name, self.address = name, address
        self.generation = 0
        self._connect()

    def _connect(self) -> None:
        self.client = Client(self.address, timeout="60s", name=f"soak-{self.name}")
        self.executor = cacheaffinity.CacheAffinityExecutor(client=self.client, status=False)
        self.metadata_cache: dict = {}
        self.generation += 1

    def abandon(self) -> None:
        """After a hung run: leave the old client (closed in the background), start afresh."""
        old = self.client
        threading.Thread(target=lambda: _quietly(old.close, timeout=10), daemon=True).start()
        self._connect()

    def close(self) -> None:
        _quietly(self.client.close, timeout=20)


def _quietly(fn, *args, **kwargs) -> None:
    with contextlib.suppress(Exception):
        fn(*args, **kwargs)


def new_process_run(address: str, spec: RunSpec, fileset: dict, timeout: float, workdir: Path) -> dict:
    """``spec`` run by a new ``sys.executable`` process (this script, ``--child``);
    ``{"wall_s", "summary", "stats", "process_s"}``; raises ``subprocess.TimeoutExpired``."""
    d = Path(tempfile.mkdtemp(prefix="child-", dir=workdir))
    try:
        spec_path, out_path, err_path = d / "spec.json", d / "out.json", d / "output"
        spec_path.write_text(json.dumps({
            "scheduler": address, "analysis": spec.analysis, "fileset": fileset, "chunksize": spec.chunksize,
            "dask_config": {"cacheaffinity.client": dask.config.get("cacheaffinity.client", {})},
        }))  # fmt: skip
        t0 = time.perf_counter()
        with open(err_path, "w") as err:
            proc = subprocess.run(
                [sys.executable, str(SCRIPT), "--child", str(spec_path), str(out_path)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, timeout=timeout,
                env=dict(os.environ), cwd=str(ROOT),
            )  # fmt: skip
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"new-process run failed (exit {proc.returncode}):\n{err_path.read_text()[-3000:]}")
        out = json.loads(out_path.read_text())
        out["process_s"] = time.perf_counter() - t0
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def child_main(spec_path: str, out_path: str) -> int:
    """``--child SPEC OUT``: one run as a user's new script does it."""
    spec = json.loads(Path(spec_path).read_text())
    with dask.config.set(spec["dask_config"]):
        with Client(spec["scheduler"], timeout="60s", name="soak-new-process") as client:
            executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
            out = client_run(executor, spec["analysis"], spec["fileset"], spec["chunksize"], None)
    out["pid"] = os.getpid()
    Path(out_path).write_text(json.dumps(out, default=str))
    return 0
