"""Tests of testbed.synthetic: NanoAOD-like files resampled from a real NanoAOD template."""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import os
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import uproot

from testbed import synthetic
from testbed.samples import samples_dir
from testbed.synthetic import (
    EVENT_ID_BRANCHES,
    TEMPLATE_ENV,
    dataset_stats,
    default_template_path,
    load_template,
    make_dataset,
)

# the real NanoAOD samples (see data/nanoaod/README.md); the tests pin nano_dy.root
DATA = samples_dir()
TEMPLATE = DATA / "nano_dy.root"
SMALL = ["Muon_*", "Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "LHEPdfWeight", "MET_pt"]
COFFEA_WARNINGS = pytest.mark.filterwarnings(
    "ignore:Missing cross-reference:RuntimeWarning",
    "ignore:Branch .* already exists:RuntimeWarning",
    "ignore::DeprecationWarning",
    "ignore::FutureWarning",
)


def _basket_magic(branch, i: int = 0) -> bytes:
    """The first two bytes of a basket's payload: ROOT's compression algorithm tag."""
    seek = int(branch.member("fBasketSeek")[i])
    key = branch.basket_key(i)
    with open(branch.file.file_path, "rb") as f:
        f.seek(seek + key.fKeylen)
        return f.read(2)


def _arrays(path, names=None) -> dict[str, ak.Array]:
    with uproot.open(path) as f:
        tree = f["Events"]
        out = {}
        for name in names or tree.keys():
            array = tree[name].array(library="ak")
            out[name] = array
        return out


@functools.cache
def _read_all(path) -> dict[str, ak.Array]:
    """Every branch of a generated file, read once per test session (ak arrays are immutable)."""
    return _arrays(path)


def _same(a, b) -> bool:
    """Equal values (NaN equal to NaN) and structure; coffea's behaviour parameters and int
    widths aside."""
    return ak.array_equal(a, b, dtype_exact=False, check_parameters=False, equal_nan=True)


def _expected_names(template, patterns) -> set[str]:
    names = set()
    for pattern in patterns:
        names.update(fnmatch.filter(template.order, pattern))
    names.update(EVENT_ID_BRANCHES)
    names.update(
        "n" + c for c, coll in template.collections.items() if names & set(coll.branches)
    )
    return names


@pytest.fixture(scope="module", autouse=True)
def _pin_template():
    """Whatever $CACHEAFFINITY_NANOAOD_TEMPLATE says outside, these tests use nano_dy.root."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TEMPLATE_ENV, str(TEMPLATE))
        yield


@pytest.fixture(scope="module")
def template():
    return load_template()


SMALL_ARGS = dict(events=1001, files=3, branches=SMALL, codec="zlib", seed=7, basket_events=100)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """1001 events in 3 files (334, 334, 333), baskets of 100 events, zlib; default jitter."""
    return make_dataset(tmp_path_factory.mktemp("small"), **SMALL_ARGS)


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """The events of ``small`` without jitter: exact copies of template events."""
    return make_dataset(tmp_path_factory.mktemp("exact"), jitter=0, **SMALL_ARGS)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Every writable template branch (~1500), 300 events, one file."""
    directory = tmp_path_factory.mktemp("full")
    return make_dataset(directory, events=300, files=1, codec="zlib", basket_events=128)


# ---------------------------------------------------------------------------------------------
# layout


def test_files_are_ttrees_with_requested_entries(small):
    assert [Path(p).name for p in small] == ["nano_000.root", "nano_001.root", "nano_002.root"]
    entries = []
    for path in small:
        with uproot.open(path) as f:
            tree = f["Events"]
            assert isinstance(tree, uproot.TTree)
            assert tree.classname == "TTree"
            assert f.classnames()["Events;1"] == "TTree"
            entries.append(tree.num_entries)
            # several baskets of 100 events: 334 entries -> 4 baskets
            assert tree["Muon_pt"].num_baskets == -(-tree.num_entries // 100)
            assert tree["run"].num_baskets == -(-tree.num_entries // 100)
    assert entries == [334, 334, 333]
    assert sum(entries) == 1001


def test_branch_names_and_dtypes_match_template(small, template):
    expected = _expected_names(template, SMALL)
    with uproot.open(small[0]) as f, uproot.open(template.path) as t:
        tree, source = f["Events"], t["Events"]
        assert set(tree.keys()) == expected
        for name in tree.keys():
            interp = tree[name].interpretation
            dtype = (interp.content if isinstance(interp, uproot.AsJagged) else interp).from_dtype
            if name.startswith("n") and name[1:] in template.collections:
                assert tree[name].typename == "int32_t"  # uproot's generated counters
                continue
            assert dtype.newbyteorder("=") == template.dtypes[name].newbyteorder("="), name
            assert tree[name].typename == source[name].typename, name


def test_counters_consistent_with_collections(small):
    for path in small:
        arrays = _arrays(path)
        for counter in ("nMuon", "nJet", "nLHEPdfWeight"):
            members = [
                n for n in arrays if n == counter[1:] or n.startswith(counter[1:] + "_")
            ]
            assert members
            for name in members:
                assert ak.all(ak.num(arrays[name], axis=1) == arrays[counter]), name
        assert ak.sum(arrays["nMuon"]) > 0 and ak.sum(arrays["nJet"]) > 0


def test_events_are_whole_template_events(exact, template):
    """Without jitter every output event is one template event: all branches copied together."""
    by_event = {int(e): i for i, e in enumerate(template.scalars["event"])}
    assert len(by_event) == template.num_entries  # event numbers identify template events
    arrays = _arrays(exact[1])
    idx = np.array([by_event[int(e)] for e in arrays["event"]])
    muons = template.collections["Muon"]
    for field in ("pt", "eta", "charge"):
        content = muons.contents[muons.fields.index(field)]
        expected = ak.unflatten(
            np.concatenate([content[muons.offsets[i] : muons.offsets[i + 1]] for i in idx]),
            np.diff(muons.offsets)[idx],
        )
        assert ak.array_equal(arrays[f"Muon_{field}"], expected)
    assert np.array_equal(arrays["MET_pt"].to_numpy(), template.scalars["MET_pt"][idx])
    assert np.array_equal(arrays["run"].to_numpy(), template.scalars["run"][idx])
    assert len(np.unique(idx)) > template.num_entries // 2  # resampled, not a fixed event


def test_all_branches_by_default(full, template):
    with uproot.open(full[0]) as f, uproot.open(template.path) as t:
        tree, source = f["Events"], t["Events"]
        assert tree.num_entries == 300
        keys = tree.keys()
        assert set(keys) == set(template.order)
        assert keys[:3] == ["run", "luminosityBlock", "event"]
        # each collection is written together, counter first, at its first branch's place
        assert keys.index("nMuon") + 1 == keys.index("Muon_dxy")
        assert keys.index("nElectron") < keys.index("Electron_genPartIdx") < keys.index("nFatJet")
        assert len(tree.keys()) == len(source.keys()) - len(template.skipped)
        for name in tree.keys():
            if name.startswith("n") and name[1:] in template.collections:
                assert tree[name].typename == "int32_t"
            else:
                assert tree[name].typename == source[name].typename, name


# ---------------------------------------------------------------------------------------------
# coffea


@COFFEA_WARNINGS
def test_coffea_nanoaodschema_reads_collections(small):
    from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

    events = NanoEventsFactory.from_root(
        {small[0]: "Events"}, schemaclass=NanoAODSchema, mode="eager"
    ).events()
    raw = _arrays(small[0], ["Muon_pt", "Muon_eta", "Jet_pt", "nJet", "LHEPdfWeight"])
    assert len(events) == 334
    assert _same(events.Muon.pt, raw["Muon_pt"])
    assert _same(events.Muon.eta, raw["Muon_eta"])
    assert _same(events.Jet.pt, raw["Jet_pt"])
    assert np.array_equal(ak.num(events.Jet).to_numpy(), raw["nJet"].to_numpy())
    assert _same(events.LHEPdfWeight, raw["LHEPdfWeight"])
    assert ak.all(events.Muon.charge**2 == 1)


@COFFEA_WARNINGS
def test_coffea_reads_full_file(full):
    from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

    events = NanoEventsFactory.from_root(
        {full[0]: "Events"}, schemaclass=NanoAODSchema, mode="virtual"
    ).events()
    for collection in ("Muon", "Jet", "Electron", "GenPart", "Tau", "Photon"):
        assert collection in events.fields
    raw = _arrays(full[0], ["nJet", "nElectron", "Muon_pt", "GenPart_pdgId"])
    assert np.array_equal(ak.num(events.Jet.pt).to_numpy(), raw["nJet"].to_numpy())
    assert np.array_equal(ak.num(events.Electron.pt).to_numpy(), raw["nElectron"].to_numpy())
    assert _same(events.Muon.pt, raw["Muon_pt"])
    assert _same(events.GenPart.pdgId, raw["GenPart_pdgId"])


# ---------------------------------------------------------------------------------------------
# determinism


def test_same_seed_same_content_whatever_codec_and_baskets(small, tmp_path):
    again = make_dataset(
        tmp_path, events=1001, files=3, branches=SMALL, codec="lz4", seed=7, basket_events=250
    )
    for a, b in zip(small, again):
        left, right = _arrays(a), _arrays(b)
        assert left.keys() == right.keys()
        for name in left:
            assert ak.array_equal(left[name], right[name]), name
        with uproot.open(a) as fa, uproot.open(b) as fb:
            assert fa.file.uuid != fb.file.uuid  # a new ROOT file every time, by design


def test_files_and_seeds_differ(small, exact, tmp_path):
    one = _arrays(small[0], ["nMuon", "Muon_pt"])
    two = _arrays(small[1], ["nMuon", "Muon_pt"])
    assert not np.array_equal(one["nMuon"][:333].to_numpy(), two["nMuon"].to_numpy())
    other = make_dataset(tmp_path, events=1001, files=3, branches=SMALL, codec="zlib", seed=8)
    three = _arrays(other[0], ["nMuon", "Muon_pt"])
    assert not np.array_equal(one["nMuon"].to_numpy(), three["nMuon"].to_numpy())
    assert not ak.array_equal(one["Muon_pt"], three["Muon_pt"])
    # without jitter, the template event numbers show the different draws
    first, second = (_arrays(p, ["event"])["event"].to_numpy() for p in exact[:2])
    assert not np.array_equal(first[:333], second)


def test_branch_subset_holds_the_same_events(tmp_path):
    kwargs = dict(events=200, files=1, seed=3, codec="zlib")
    wide = make_dataset(tmp_path / "w", branches=["Muon_*", "Jet_*"], **kwargs)
    narrow = make_dataset(tmp_path / "n", branches=["Jet_pt"], **kwargs)
    a, b = _arrays(wide[0]), _arrays(narrow[0])
    assert set(b) == {"run", "luminosityBlock", "event", "nJet", "Jet_pt"}
    for name in b:
        assert ak.array_equal(a[name], b[name]), name


# ---------------------------------------------------------------------------------------------
# compression


@pytest.mark.parametrize(
    "codec, level, fcompress, magic",
    [
        pytest.param("zlib", None, uproot.ZLIB(1), b"ZL", id="zlib-default"),
        pytest.param("lzma", None, uproot.LZMA(9), b"XZ", id="lzma-default-9"),
        pytest.param("lzma", 2, uproot.LZMA(2), b"XZ", id="lzma-2"),
        pytest.param("zstd", None, uproot.ZSTD(5), b"ZS", id="zstd"),
        pytest.param("lz4", None, uproot.LZ4(4), b"L4", id="lz4"),
    ],
)
def test_codec_recorded_in_file(tmp_path, codec, level, fcompress, magic):
    # without jitter: a jittered MET_pt, like the real one, hardly compresses, and a basket
    # that does not shrink is stored uncompressed
    (path,) = make_dataset(
        tmp_path, events=500, files=1, branches=["Jet_pt", "MET_pt"], codec=codec, level=level,
        jitter=False,
    )  # fmt: skip
    with uproot.open(path) as f:
        assert f.file.compression == fcompress
        tree = f["Events"]
        for name in ("Jet_pt", "MET_pt", "event"):
            assert _basket_magic(tree[name]) == magic, name
        assert tree["Jet_pt"].compressed_bytes < tree["Jet_pt"].uncompressed_bytes


def test_uncompressed(tmp_path):
    (path,) = make_dataset(tmp_path, events=500, files=1, branches=["Jet_pt"], codec=None)
    with uproot.open(path) as f:
        tree = f["Events"]
        assert f.file.compression is None
        assert tree["Jet_pt"].compressed_bytes == tree["Jet_pt"].uncompressed_bytes


def test_lzma_smaller_than_zlib_for_same_content(tmp_path):
    kwargs = dict(events=3000, files=1, branches=["Jet_*", "Muon_*", "Electron_*"], seed=1)
    (zlib_path,) = make_dataset(tmp_path / "zlib", codec="zlib", **kwargs)
    (lzma_path,) = make_dataset(tmp_path / "lzma", codec="lzma", **kwargs)
    zlib_stats, lzma_stats = dataset_stats([zlib_path]), dataset_stats([lzma_path])
    assert zlib_stats["uncompressed_bytes"] == lzma_stats["uncompressed_bytes"]
    assert lzma_stats["file_bytes"] < zlib_stats["file_bytes"]
    assert lzma_stats["compression_ratio"] > zlib_stats["compression_ratio"] > 1


# ---------------------------------------------------------------------------------------------
# jitter


def _flat(array) -> np.ndarray:
    return ak.to_numpy(ak.flatten(array, axis=None))


def _check_jittered(name, got, want, spec, sigma):
    """Jittered float values ``got`` against the exact ones ``want`` (flat, same order)."""
    assert got.dtype == want.dtype, name
    tol = 8 * sigma + 2.0**-spec.bits  # |z| < 6.8, plus rounding to the branch's precision
    kept = ~np.isfinite(want) | (want == 0) | np.isin(want, spec.exact)
    assert np.array_equal(got[kept], want[kept], equal_nan=True), name  # special values kept
    got, want = got[~kept].astype(np.float64), want[~kept].astype(np.float64)
    if spec.wrap_phi:
        diff = np.remainder(got - want + np.pi, 2 * np.pi) - np.pi
        assert np.all(np.abs(diff) <= tol * np.abs(want) + 1e-6), name
        assert np.all(np.abs(got) <= np.pi + 1e-3), name
    else:
        assert np.all(np.sign(got) == np.sign(want)), name
        assert np.all(np.abs(got / want - 1) <= tol), name
    if spec.bits < 23:  # rounded to the template's precision
        assert synthetic._mantissa_bits(got.astype(np.float32)).max() <= spec.bits, name


def test_jitter_changes_floats_only(small, exact, template):
    """Same events as without jitter: ints, bools and counters exact; floats close."""
    plan = synthetic._select(template, SMALL)
    specs, sort_descending = synthetic._jitter_specs(template, plan)
    assert {"Muon_pt", "Muon_eta", "Muon_phi", "Jet_pt", "LHEPdfWeight", "MET_pt"} <= set(specs)
    assert "Muon_mass" not in specs  # one value in the template: discrete, copied
    assert {"Muon_pt", "Jet_pt"} <= sort_descending
    sigma = synthetic.DEFAULT_JITTER
    for jittered, plain in zip(small, exact):
        left, right = _read_all(jittered), _read_all(plain)
        assert left.keys() == right.keys()
        for name in left:
            got, want = left[name], right[name]
            if name == "event":
                continue
            if name in specs:
                assert ak.array_equal(ak.num(got, axis=-1), ak.num(want, axis=-1)), name
                _check_jittered(name, _flat(got), _flat(want), specs[name], sigma)
            else:
                assert ak.array_equal(got, want), name
    # unique event numbers 1, 2, ... over the whole dataset
    events = np.concatenate([_read_all(p)["event"].to_numpy() for p in small])
    assert events.dtype == np.uint64
    assert np.array_equal(events, np.arange(1, 1002))


def test_jitter_statistics(small, exact):
    left, right = _read_all(small[0]), _read_all(exact[0])
    sigma = synthetic.DEFAULT_JITTER
    for name in ("Muon_pt", "Jet_pt", "Jet_eta", "LHEPdfWeight", "MET_pt"):
        got, want = _flat(left[name]).astype(np.float64), _flat(right[name]).astype(np.float64)
        assert np.mean(got != want) > 0.9, name  # exact repeats are broken
        ratio = got[want != 0] / want[want != 0] - 1
        assert abs(np.mean(ratio)) < 0.3 * sigma, name
        assert 0.7 * sigma < np.std(ratio) < 1.3 * sigma, name
    # leading objects stay leading: pt decreases within every event, as in the template
    for name in ("Muon_pt", "Jet_pt"):
        pt = left[name]
        assert ak.all(pt[:, 1:] <= pt[:, :-1]), name


def _dimuon_mass(arrays) -> np.ndarray:
    two = arrays["nMuon"] == 2
    pt, eta, phi, mass = (arrays[f"Muon_{f}"][two] for f in ("pt", "eta", "phi", "mass"))
    pt, eta, phi, mass = (ak.to_numpy(x).astype(np.float64) for x in (pt, eta, phi, mass))
    px, py, pz = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)
    energy = np.sqrt(px**2 + py**2 + pz**2 + mass**2)
    return np.sqrt(np.maximum(energy.sum(1) ** 2 - (px.sum(1) ** 2 + py.sum(1) ** 2
                                                     + pz.sum(1) ** 2), 0))  # fmt: skip


def test_jitter_keeps_the_z_peak(small, exact):
    got = np.concatenate([_dimuon_mass(_read_all(p)) for p in small])
    want = np.concatenate([_dimuon_mass(_read_all(p)) for p in exact])
    assert len(got) == len(want) > 100
    assert np.all(np.abs(got / want - 1) < 0.15)
    near_z = np.abs(want - 91.19) < 15
    assert near_z.mean() > 0.5
    assert abs(np.median(got[near_z]) - np.median(want[near_z])) < 1.0
    assert np.mean(got != want) > 0.9


def test_jitter_lowers_lzma_ratio(tmp_path):
    branches = ["Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "MET_pt"]
    kwargs = dict(events=1500, files=1, codec="lzma", seed=2, branches=branches)
    ratios = {}
    for jitter in (False, True):
        (path,) = make_dataset(tmp_path / str(jitter), jitter=jitter, **kwargs)
        ratios[jitter] = dataset_stats([path])["compression_ratio"]
    assert ratios[True] < 0.7 * ratios[False]  # 1.8 against 3.6
    assert 1.5 < ratios[True] < 5


def test_jitter_is_deterministic_and_scales(tmp_path):
    kwargs = dict(events=300, files=1, seed=4, codec="zlib", branches=["Jet_pt", "nJet"])
    a, b = (make_dataset(tmp_path / d, jitter=0.03, **kwargs)[0] for d in ("a", "b"))
    plain = make_dataset(tmp_path / "plain", jitter=False, **kwargs)[0]
    one = _flat(_arrays(a, ["Jet_pt"])["Jet_pt"]).astype(np.float64)
    assert np.array_equal(one, _flat(_arrays(b, ["Jet_pt"])["Jet_pt"]))
    want = _flat(_arrays(plain, ["Jet_pt"])["Jet_pt"]).astype(np.float64)
    assert 0.02 < np.std(one / want - 1) < 0.04


def test_jitter_file_with_every_branch(full, template):
    """Every branch of the full file against the template events it was drawn from."""
    plan = synthetic._select(template, None)
    specs, _ = synthetic._jitter_specs(template, plan)
    assert len(specs) > 150
    idx = synthetic._event_indices(0, 0, 0, 300, template.num_entries)
    expected = synthetic._build_basket(plan, template, idx)  # no jitter
    with uproot.open(full[0]) as f:
        got = f["Events"].arrays(library="ak", how=dict)
    for group, want in expected.items():
        if isinstance(want, np.ndarray):
            items = {group: want}
        else:  # a collection: its counter and fields
            fields = ak.fields(want) or [""]
            items = {"n" + group: ak.num(want)}
            items.update({(f"{group}_{f}" if f else group): want[f] if f else want
                          for f in fields})  # fmt: skip
        for name, values in items.items():
            if name == "event":
                assert np.array_equal(got[name].to_numpy(), np.arange(1, 301)), name
            elif name in specs:
                _check_jittered(
                    name, _flat(got[name]), _flat(ak.Array(values)), specs[name],
                    synthetic.DEFAULT_JITTER,
                )  # fmt: skip
            else:
                assert _same(got[name], ak.Array(values)), name


def test_round_mantissa():
    values = np.array([1 + 2**-11, 1 + 3 * 2**-11, -1.5, 2 - 2**-20, 3.0e-5], np.float32)
    rounded = synthetic._round_mantissa(values.copy(), 10)
    # halves round up (in magnitude), a carry goes into the exponent
    assert rounded[:4].tolist() == [1 + 2**-10, 1 + 2**-9, -1.5, 2.0]
    assert abs(rounded[4] / values[4] - 1) <= 2**-11
    assert synthetic._mantissa_bits(rounded).max() <= 10
    bits = synthetic._mantissa_bits(np.array([1.0, 1.5, 1.25, 1 + 2**-23], np.float32))
    assert bits.tolist() == [0, 1, 2, 23]


# ---------------------------------------------------------------------------------------------
# arguments


def _bad(id, error, match, **kwargs):
    return pytest.param({"events": 10, "files": 1, **kwargs}, error, match, id=id)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        _bad("no-events", ValueError, "events must be >= 1", events=0),
        _bad("negative-events", ValueError, "events must be >= 1", events=-5),
        _bad("no-files", ValueError, "files must be >= 1", files=0),
        _bad("files>events", ValueError, r"files \(4\) must be <= events \(3\)", events=3, files=4),
        _bad("float-events", TypeError, "events must be an int", events=10.0),
        _bad("bool-events", TypeError, "events must be an int", events=True),
        _bad("str-files", TypeError, "files must be an int", files="2"),
        _bad("negative-seed", ValueError, "seed must be >= 0", seed=-1),
        _bad("zero-basket", ValueError, "basket_events must be >= 1", basket_events=0),
        _bad("unknown-codec", ValueError, "unknown codec 'gzip'", codec="gzip"),
        _bad("lzma-level-10", ValueError, r"must be in 1\.\.9", codec="lzma", level=10),
        _bad("zlib-level-0", ValueError, r"must be in 1\.\.9", codec="zlib", level=0),
        _bad("level-no-codec", ValueError, "without a codec", codec=None, level=3),
        _bad("float-level", TypeError, "level must be an int", codec="zstd", level=2.5),
        _bad("empty-branches", ValueError, "selects nothing", branches=[]),
        _bad("no-match", ValueError, r"'Nope_\*' matches no writable branch", branches=["Nope_*"]),
        _bad("non-str-pattern", TypeError, "glob patterns", branches=[3]),
        _bad("negative-jitter", ValueError, r"jitter must be in 0\.\.0\.1", jitter=-0.01),
        _bad("large-jitter", ValueError, r"jitter must be in 0\.\.0\.1", jitter=0.5),
        _bad("nan-jitter", ValueError, "jitter must be in", jitter=float("nan")),
        _bad("str-jitter", TypeError, "jitter must be a bool or a float", jitter="0.02"),
        _bad(
            "missing-template",
            FileNotFoundError,
            f"/nonexistent/nano.root.*{TEMPLATE_ENV}",
            template="/nonexistent/nano.root",
        ),
        _bad("empty-template", ValueError, "has no events", template=DATA / "nano_dy_empty.root"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_dataset(tmp_path / "out", **kwargs)
    assert not list(tmp_path.glob("out/*.root"))


def test_missing_default_template_names_env_var(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere.root"
    monkeypatch.setenv(TEMPLATE_ENV, str(missing))
    with pytest.raises(FileNotFoundError) as info:
        make_dataset(tmp_path, events=10, files=1)
    assert str(missing) in str(info.value)
    assert TEMPLATE_ENV in str(info.value)


def test_template_env_var_and_argument(monkeypatch, tmp_path):
    other = DATA / "nano_dimuon.root"
    monkeypatch.setenv(TEMPLATE_ENV, str(other))
    assert default_template_path() == other
    kwargs = dict(events=50, files=1, branches=["Muon_pt"], jitter=0)  # template event numbers
    (via_env,) = make_dataset(tmp_path / "env", **kwargs)
    monkeypatch.delenv(TEMPLATE_ENV)
    assert default_template_path().resolve() == TEMPLATE.resolve()  # repo-relative default
    (via_arg,) = make_dataset(tmp_path / "arg", template=other, **kwargs)
    source_events = set(load_template(other).scalars["event"].tolist())
    for path in (via_env, via_arg):
        assert set(_arrays(path, ["event"])["event"].to_list()) <= source_events


def test_allow_empty(tmp_path):
    paths = make_dataset(tmp_path, events=2, files=4, branches=["Muon_pt"], allow_empty=True)
    entries = [uproot.open(p)["Events"].num_entries for p in paths]
    assert entries == [1, 1, 0, 0]
    with uproot.open(paths[-1]) as f:
        assert f["Events"].classname == "TTree"
        assert set(f["Events"].keys()) == {*EVENT_ID_BRANCHES, "nMuon", "Muon_pt"}
        assert len(f["Events"]["Muon_pt"].array()) == 0
    (zero,) = make_dataset(
        tmp_path / "zero", events=0, files=1, branches=["Jet_pt"], allow_empty=True
    )
    assert uproot.open(zero)["Events"].num_entries == 0


def test_progress_bar_and_overwrite(tmp_path, capsys):
    first = make_dataset(tmp_path, events=100, files=2, branches=["Jet_pt"], progress=True)
    err = capsys.readouterr().err
    assert "100/100" in err
    uuid = uproot.open(first[0]).file.uuid
    second = make_dataset(tmp_path, events=100, files=2, branches=["Jet_pt"])
    assert first == second
    assert uproot.open(second[0]).file.uuid != uuid
    assert sorted(os.listdir(tmp_path)) == ["nano_000.root", "nano_001.root"]  # no temp files


def test_default_basket_size(tmp_path, template):
    (path,) = make_dataset(tmp_path, events=1500, files=1, branches=["Jet_pt"], codec="lz4")
    with uproot.open(path) as f:
        # a few small branches: the upper bound of the default, 10k events, gives one basket
        assert f["Events"]["Jet_pt"].num_baskets == 1
    plan = synthetic._select(template, None)
    default = synthetic.DEFAULT_CLUSTER_BYTES / plan.bytes_per_event
    assert synthetic.MIN_DEFAULT_BASKET_EVENTS <= default <= synthetic.MAX_DEFAULT_BASKET_EVENTS


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli(tmp_path, capsys):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "make_dataset.py"
    spec = importlib.util.spec_from_file_location("make_dataset_cli", script)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "cli"
    code = cli.main(
        [str(out), "--events", "300", "--files", "2", "--codec", "zstd", "--level", "3",
         "--branches", "Muon_*", "Jet_pt", "--no-progress", "--jitter", "0.01", "--read-speed"]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "compression ratio" in text and "events             300" in text
    assert "jitter             0.01" in text and "MB/s decompressed per core" in text
    assert sorted(p.name for p in out.iterdir()) == ["nano_000.root", "nano_001.root"]
    with uproot.open(out / "nano_001.root") as f:
        assert f.file.compression == uproot.ZSTD(3)
        assert f["Events"].num_entries == 150
    assert cli.main([str(out), "--events", "1", "--files", "2", "--no-progress"]) == 2
    assert "must be <= events" in capsys.readouterr().err
    assert cli.main([str(out), "--events", "10", "--jitter", "0.3", "--no-progress"]) == 2
    assert "jitter must be in" in capsys.readouterr().err
