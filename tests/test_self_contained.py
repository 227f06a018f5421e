"""The repository is self-contained: a clone alone has everything the tests, the demo and
the examples read.  No tracked file names a folder outside the repository or an absolute
path of the machine it was written on, and the real NanoAOD samples that
``data/nanoaod/README.md`` lists are in the repository and open with uproot."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES_README = REPO / "data" / "nanoaod" / "README.md"

# The strings this module looks for are built from parts, so that it does not find itself.
SHARED = "/" + "shared"
#: a folder beside the repository (the repository must not reach out of itself)
OUTSIDE = re.compile(re.escape(".." + SHARED) + "|" + re.escape(SHARED + "/data"))
#: absolute paths of a development machine: its work tree and root's home.  ``/tmp`` is
#: left out (examples name ``/tmp/cacheaffinity-<user>`` on purpose) and so are URLs
#: (``root://host//store/...``, ``file:///...``): only a path that starts a word counts.
MACHINE_PATH = re.compile(r"(?<![\w:/.~-])/(?:work|root)/")
#: folders a walk of the tree (no git) leaves out: not part of a clone
WALK_SKIP = {".git", ".venv", ".venv-oldest", ".venv-newest", "__pycache__", ".demo",
             ".bench-data", ".pytest_cache", ".hypothesis", "_build", "build", "dist"}  # fmt: skip


def _files() -> list[Path]:
    """The tracked files (``git ls-files``), or every file of the tree outside
    :data:`WALK_SKIP` when there is no git checkout (an unpacked sdist)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        names = [n for n in proc.stdout.decode().split("\0") if n]
        if names:
            return [REPO / n for n in names if (REPO / n).is_file()]
    except (OSError, subprocess.SubprocessError):
        pass
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in WALK_SKIP and not d.endswith(".egg-info")]
        out.extend(Path(root) / f for f in files)
    return out


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _offending(pattern: re.Pattern, files: list[Path], base: Path = REPO) -> list[str]:
    """``file:line: text`` of every line of a text file in ``files`` that ``pattern``
    finds (binary files are skipped)."""
    hits = []
    for path in files:
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(base)}:{number}: {line.strip()[:120]}")
    return hits


@pytest.fixture(scope="module")
def files() -> list[Path]:
    found = _files()
    assert REPO / "tests" / "test_self_contained.py" in found
    return found


def test_the_checks_find_what_they_are_for(tmp_path):
    """The checks below fail on such lines and pass on the lines they must allow: run on
    files written here (binary files skipped)."""
    work, root = "/" + "work/", "/" + "root/"
    outside = [f"see ..{SHARED}/data/nanoaod", f"{work}x{SHARED}/data/nanoaod/nano_dy.root",
               f"DATA = REPO.parent  # ..{SHARED}"]  # fmt: skip
    machine = [f'"data": "{work}main/.bench-data/x"', f"cd {root}cacheaffinity",
               f"`{work}main/.venv/bin/python`", f"path={root}x", f"({work}x)"]  # fmt: skip
    allowed = ["root://eospublic.cern.ch//eos/opendata/cms/x.root", "/tmp/cacheaffinity-alice",
               f"file://{work}x", "/scratch/$USER/cache", f"https://example.org{work}x",
               f"~{work}x", "data/nanoaod/nano_dy.root", "a/b/root/c"]  # fmt: skip
    bad = tmp_path / "bad.md"
    bad.write_text("\n".join(["fine", *outside, *machine, "fine"]) + "\n")
    good = tmp_path / "good.md"
    good.write_text("\n".join(allowed) + "\n")
    binary = tmp_path / "data.root"
    binary.write_bytes(b"root\0" + f"{work}x ..{SHARED}".encode())
    files = [bad, good, binary]
    assert [h.split(":")[1] for h in _offending(OUTSIDE, files, tmp_path)] == ["2", "3", "4"]
    assert [h.split(":")[1] for h in _offending(MACHINE_PATH, files, tmp_path)] == [
        "3", "5", "6", "7", "8", "9"]  # fmt: skip


def test_no_tracked_file_reaches_outside_the_repository(files):
    hits = _offending(OUTSIDE, files)
    assert not hits, "files name a folder outside the repository:\n" + "\n".join(hits)


def test_no_tracked_file_names_an_absolute_path_of_this_machine(files):
    hits = _offending(MACHINE_PATH, files)
    assert not hits, (
        "files name an absolute path of a development machine (record paths relative to "
        "the repository; benchmarks: benchmarks/_common.portable_path):\n" + "\n".join(hits)
    )


def test_git_grep_finds_no_outside_folder():
    """What a reviewer runs, ``git grep -n -e '..<SHARED>' -e '<SHARED>/data'`` (with
    :data:`SHARED`; patterns as regular expressions, as typed), finds nothing in the tracked
    files (nor in new ones: ``--untracked``)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(REPO), "grep", "--untracked", "-n", "-e", ".." + SHARED,
             "-e", SHARED + "/data"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except OSError:
        pytest.skip("no git here (an unpacked sdist): the tree walk above checked the files")
    if proc.returncode not in (0, 1) or "not a git repository" in proc.stderr:
        pytest.skip("not a git checkout (an unpacked sdist): the tree walk above checked it")
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout


def _listed_samples() -> list[str]:
    """The ``.root`` files named in the first column of data/nanoaod/README.md's table."""
    names = re.findall(r"^\|\s*`?([\w.-]+\.root)`?\s*\|", SAMPLES_README.read_text(), re.M)
    assert names, f"{SAMPLES_README.relative_to(REPO)} lists no .root file in its table"
    return names


def test_every_listed_sample_is_in_the_repository_and_opens():
    import uproot

    names = _listed_samples()
    folder = SAMPLES_README.parent
    on_disk = sorted(p.name for p in folder.glob("*.root"))
    assert sorted(names) == on_disk, "README's table and data/nanoaod/*.root differ"
    assert "nano_dy.root" in names  # the default template of testbed.synthetic
    for name in names:
        with uproot.open(folder / name) as f:
            events = f["Events"]
            assert events.num_entries >= 0 and len(events.keys()) > 100, name
    licence = (folder / "LICENSE-coffea").read_text()
    assert "BSD 3-Clause" in licence and "Fermilab" in licence


def test_the_samples_are_found_in_the_repository_by_default(monkeypatch):
    from testbed import samples, synthetic

    monkeypatch.delenv(samples.DIR_ENV, raising=False)
    monkeypatch.delenv(synthetic.TEMPLATE_ENV, raising=False)
    assert samples.samples_dir() == REPO / "data" / "nanoaod"
    assert synthetic.default_template_path() == REPO / "data" / "nanoaod" / "nano_dy.root"
    monkeypatch.setenv(synthetic.TEMPLATE_ENV, str(REPO / "nowhere.root"))
    with pytest.raises(FileNotFoundError, match="data/nanoaod/"):
        synthetic.resolve_template()


def test_benchmark_results_record_paths_relative_to_the_repository(tmp_path):
    """What benchmarks/_common.write_json records for paths: relative to the repository
    inside it, the base name outside (no folder of the machine that ran it)."""
    import json

    from benchmarks._common import portable_path, write_json

    inside = REPO / ".bench-data" / "consecutive_runs"
    outside = tmp_path / "work-dir" / "cache"
    assert portable_path(inside) == ".bench-data/consecutive_runs"
    assert portable_path(REPO / "data" / "nanoaod" / "nano_dy.root") == "data/nanoaod/nano_dy.root"
    assert portable_path(outside) == "cache" and portable_path(REPO) == "."
    out = tmp_path / "r.json"
    write_json(str(out), config={"data": str(inside), "out": outside, "n": 3, "note": "a b /x"},
               results=[{"directory": str(outside), "files": [str(inside / "f.root")]}],
               extra_path=str(inside))  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["config"] == {"data": ".bench-data/consecutive_runs", "out": "cache", "n": 3,
                             "note": "a b /x"}  # fmt: skip
    assert doc["results"] == [{"directory": "cache",
                               "files": [".bench-data/consecutive_runs/f.root"]}]  # fmt: skip
    assert doc["extra_path"] == ".bench-data/consecutive_runs"
    assert str(tmp_path) not in out.read_text() and str(REPO) not in out.read_text()
