"""A small, real coffea analysis: dimuon invariant mass and jet HT.

Used by the demo, the examples, the tests and the benchmarks, so every part of
cacheaffinity is exercised by the same physics code a user would write.
Histograms use integer (count) storage, so results compare exactly whatever
order chunks are added in.
"""

from __future__ import annotations

import warnings

import awkward as ak
import hist
import numpy as np
from coffea import processor
from distributed.diagnostics.plugin import WorkerPlugin


class DimuonJetProcessor(processor.ProcessorABC):
    """Opposite-sign dimuon mass, jet multiplicity and HT per dataset."""

    def process(self, events):
        dataset = events.metadata["dataset"]
        muons = events.Muon
        good = muons[(muons.pt > 5) & (np.abs(muons.eta) < 2.4)]
        pairs = ak.combinations(good, 2, fields=["a", "b"])
        opposite = pairs.a.charge != pairs.b.charge
        mass = (pairs.a + pairs.b).mass[opposite]

        jets = events.Jet
        central = jets[(jets.pt > 30) & (np.abs(jets.eta) < 2.5)]
        ht = ak.sum(central.pt, axis=1)

        h_mass = hist.Hist.new.Reg(120, 0, 120, name="mass", label="m(mu mu) [GeV]").Int64()
        h_mass.fill(mass=ak.to_numpy(ak.flatten(mass, axis=None)))
        h_ht = hist.Hist.new.Reg(50, 0, 1000, name="ht", label="HT [GeV]").Int64()
        h_ht.fill(ht=ak.to_numpy(ht))
        h_njet = hist.Hist.new.Integer(0, 15, name="njet", label="central jets").Int64()
        h_njet.fill(njet=ak.to_numpy(ak.num(central)))
        return {
            dataset: {
                "entries": len(events),
                "mass": h_mass,
                "ht": h_ht,
                "njet": h_njet,
                "muons": int(ak.sum(ak.num(good))),
            }
        }

    def postprocess(self, accumulator):
        return accumulator


def summary(out: dict) -> dict:
    """Comparable plain-Python summary of an output (for tests and printing)."""
    result = {}
    for dataset, d in sorted(out.items()):
        result[dataset] = {
            "entries": d["entries"],
            "muons": d["muons"],
            "mass": d["mass"].values(flow=True).tolist(),
            "ht": d["ht"].values(flow=True).tolist(),
            "njet": d["njet"].values(flow=True).tolist(),
        }
    return result


#: coffea's NanoAOD schema warnings that the bundled CMS samples, and the data
#: generated from them (``testbed.synthetic``), raise by design: their NanoAOD
#: versions have no such index branches (and an empty Photon mass/charge that coffea
#: fills with 0).  None of them touches the Muon and Jet columns analysed here.
#: Matched exactly (whole message), so any other schema warning still shows.
KNOWN_SCHEMA_WARNINGS = (
    r"Missing cross-reference index for (FatJet_genJetAK8Idx => GenJetAK8"
    r"|FatJet_subJetIdx[12] => SubJet"
    r"|LowPtElectron_electronIdx => Electron"
    r"|LowPtElectron_genPartIdx => GenPart"
    r"|LowPtElectron_photonIdx => Photon)$",
    r"Branch Photon_(charge|mass) already exists but its values will be replaced with 0\.0$",
)
#: The module that raises them.
SCHEMA_MODULE = r"coffea\.nanoevents\.schemas\.nanoaod"


def quiet_known_schema_warnings() -> None:
    """Ignore :data:`KNOWN_SCHEMA_WARNINGS` in this process (and nothing else)."""
    for message in KNOWN_SCHEMA_WARNINGS:
        warnings.filterwarnings(
            "ignore", message=message, category=RuntimeWarning, module=SCHEMA_MODULE
        )


class QuietKnownSchemaWarnings(WorkerPlugin):
    """Worker plugin: :func:`quiet_known_schema_warnings` in every worker process.

    The schema is built where the chunks are processed, so without it every worker
    prints each known warning once before the demo's table.
    """

    name = "examples-quiet-known-schema-warnings"
    idempotent = True

    def setup(self, worker) -> None:
        quiet_known_schema_warnings()


def quiet_known_schema_warnings_on(client) -> None:
    """Ignore :data:`KNOWN_SCHEMA_WARNINGS` in this process and on ``client``'s workers
    (present and future); for the demo and notebooks over the bundled/generated data."""
    quiet_known_schema_warnings()
    client.register_plugin(QuietKnownSchemaWarnings())
