"""The NanoAOD-like files of ``benchmarks/cache_read.py``: columns resampled from a real
NanoAOD sample (with noise), written with each codec."""

from __future__ import annotations

import os

import awkward as ak
import numpy as np
import uproot

CODECS = {
    "LZMA(9)": lambda: uproot.LZMA(9),
    "ZLIB(1)": lambda: uproot.ZLIB(1),
    "LZ4(1)": lambda: uproot.LZ4(1),
    "ZSTD(5)": lambda: uproot.ZSTD(5),
}
COLLECTIONS = {
    "Jet": ["pt", "eta", "phi", "mass", "btagDeepFlavB", "jetId", "puId", "hadronFlavour",
            "area", "nConstituents"],
    "Muon": ["pt", "eta", "phi", "mass", "charge", "pfRelIso04_all", "tightId", "dxy", "dz"],
    "Electron": ["pt", "eta", "phi", "mass", "charge", "cutBased", "pfRelIso03_all", "dxy"],
    "Photon": ["pt", "eta", "phi"],
    "Tau": ["pt", "eta", "phi"],
    "GenPart": ["pt", "eta", "phi", "pdgId", "status", "genPartIdxMother"],
}
FLAT = ["genWeight", "MET_pt", "MET_phi", "MET_sumEt", "PuppiMET_pt", "PuppiMET_phi",
        "PV_npvs", "PV_z", "fixedGridRhoFastjetAll", "Pileup_nTrueInt", "HLT_IsoMu24",
        "Flag_goodVertices"]
MB = 1e6
#: Bumped when make_columns changes, so that old files are not reused.
GENERATOR_VERSION = 2
SERIAL = dict(
    decompression_executor=uproot.TrivialExecutor(),
    interpretation_executor=uproot.TrivialExecutor(),
)


# ------------------------------------------------------------------ data
def _noisy(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Floats with 2 % noise, rounded to 12 mantissa bits; other types as they are."""
    if values.dtype.kind != "f":
        return values
    out = (values * (1 + 0.02 * rng.standard_normal(values.shape))).astype(np.float32)
    bits = out.view(np.uint32)
    bits &= np.uint32(~((1 << (23 - 12)) - 1) & 0xFFFFFFFF)
    return out


def make_columns(source: str, n_events: int, seed: int) -> dict[str, object]:
    """NanoAOD-like columns: ``{collection: ak record array, branch: np array}``."""
    rng = np.random.default_rng(seed)
    tree = uproot.open(source)["Events"]
    n_source = tree.num_entries
    out: dict[str, object] = {}
    for name, fields in COLLECTIONS.items():
        fields = [f for f in fields if f"{name}_{f}" in tree]
        arrays = tree.arrays([f"{name}_{f}" for f in fields], library="ak", **SERIAL)
        pick = rng.integers(0, n_source, n_events)
        record = {}
        counts = ak.num(arrays[f"{name}_{fields[0]}"][pick], axis=1)
        total = int(ak.sum(counts))
        for f in fields:
            pool = ak.to_numpy(ak.flatten(arrays[f"{name}_{f}"]))
            if pool.dtype.kind == "f":  # whole events, with noise
                flat = _noisy(ak.to_numpy(ak.flatten(arrays[f"{name}_{f}"][pick])), rng)
            else:  # integers element by element: no verbatim copies of source events
                flat = pool[rng.integers(0, len(pool), total)]
            record[f] = ak.unflatten(flat, counts)
        out[name] = ak.zip(record)
    pick = rng.integers(0, n_source, n_events)
    flat_names = [b for b in FLAT if b in tree]
    source_flat = tree.arrays(flat_names, library="np", **SERIAL)
    out["run"] = np.full(n_events, 1, np.uint32)
    out["luminosityBlock"] = (np.arange(n_events) // 1000 + 1).astype(np.uint32)
    out["event"] = (np.arange(n_events) + 10_000_000).astype(np.uint64)
    for b in flat_names:
        out[b] = _noisy(source_flat[b][pick], rng)
    return out


def write_file(path: str, codec: str, source: str, n_events: int, seed: int, baskets: int) -> str:
    columns = make_columns(source, n_events, seed)
    types = {
        k: (v.type.content if isinstance(v, ak.Array) else v.dtype) for k, v in columns.items()
    }
    tmp = path + ".part"
    with uproot.recreate(tmp, compression=CODECS[codec]()) as f:
        f.mktree("Events", types)
        edges = np.linspace(0, n_events, baskets + 1).astype(int)
        for start, stop in zip(edges[:-1], edges[1:]):
            f["Events"].extend({k: v[start:stop] for k, v in columns.items()})
    os.replace(tmp, path)
    return path
