"""A small, real coffea analysis: dimuon invariant mass and jet HT.

Used by the demo, the examples, the tests and the benchmarks, so every part of
cacheaffinity is exercised by the same physics code a user would write.
Histograms use integer (count) storage, so results compare exactly whatever
order chunks are added in.
"""

from __future__ import annotations

import awkward as ak
import hist
import numpy as np
from coffea import processor


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
