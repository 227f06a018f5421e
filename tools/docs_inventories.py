"""Regenerate docs/_inventories/: the small intersphinx inventories of the offline docs build.

The documentation links to Python, NumPy, Dask, distributed, coffea, dask-gateway and Click,
but its build (CI, tests/test_docs.py, a user's checkout) has no network.  So each
project's ``objects.inv`` (Sphinx inventory version 2, zlib-compressed) is committed under
docs/_inventories/, cut down to the names the documentation references, and docs/conf.py
points ``intersphinx_mapping`` at those files.

Where the entries come from (``DEBIAN``, ``TABLE``):

- a Debian documentation package that ships the project's own ``objects.inv`` (Python, Dask,
  distributed): ``apt-get download`` (no installation), ``dpkg-deb -x`` to a temporary
  directory, read the inventory; the links keep the project's page names, joined to the base
  URL docs/conf.py gives (``INVENTORIES``);
- for a project with no such package (NumPy: Debian dropped python-numpy-doc; coffea;
  dask-gateway; Click, whose Debian inventory has other page names than its site) the entries
  are written from ``TABLE`` below: name, role, page on the project's public documentation
  site.  Add a row when the docs start referencing a new name.

``ALIASES`` adds names under which an object is commonly referenced but which an older
Debian inventory lists under its defining module only (``distributed.Scheduler`` is
``distributed.scheduler.Scheduler``); ``EXTRA`` links a name that the project's documentation
describes on a page without an object entry (distributed's work stealing).

Which names the docs reference is measured, not listed: the tool builds the documentation
once (Sphinx's ``dummy`` builder, nothing written to docs/) with the complete inventories and
records every cross-reference that reaches intersphinx.  Run it after docstrings or pages
start referencing new names of these projects; a nitpicky build (``-n``) says when::

    python tools/docs_inventories.py                 # downloads the .deb files (Debian mirror)
    python tools/docs_inventories.py --debs DIR      # .deb files already in DIR (offline)

It prints the names it could not find in any inventory, writes docs/_inventories/*.inv and
docs/_inventories/README.md (sources, versions, licences, counts), and needs ``apt-get`` and
``dpkg-deb`` (Debian, Ubuntu) unless ``--debs`` is given (then only ``dpkg-deb``).
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
OUT = DOCS / "_inventories"


@dataclass(frozen=True)
class Deb:
    """A Debian package whose files include the project's Sphinx ``objects.inv``."""

    package: str
    inventory: str  # path inside the package
    licence: str  # of the documentation the inventory indexes (debian/copyright)


#: project (a key of docs/conf.py's INVENTORIES) -> the Debian package with its objects.inv
DEBIAN = {
    "python": Deb(
        "python3.11-doc",
        "usr/share/doc/python3.11/html/objects.inv",
        "PSF-2.0 (Python Software Foundation License Version 2)",
    ),
    "dask": Deb(
        "python-dask-doc", "usr/share/doc/python-dask-doc/html/objects.inv", "BSD-3-Clause"
    ),
    "distributed": Deb(
        "python-distributed-doc",
        "usr/share/doc/python-distributed-doc/html/objects.inv",
        "BSD-3-Clause",
    ),
}

#: project -> (project name, version label, licence of its documentation, entries).  Each entry
#: is (name, domain:role, page#anchor relative to the base URL of docs/conf.py's INVENTORIES);
#: the page names were checked against the projects' published documentation.
TABLE = {
    "numpy": (
        "NumPy",
        "stable",
        "BSD-3-Clause",
        [
            ("numpy.ndarray", "py:class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
            ("numpy.dtype", "py:class", "reference/generated/numpy.dtype.html#numpy.dtype"),
        ],
    ),
    "coffea": (
        "coffea",
        "latest",
        "BSD-3-Clause",
        [
            ("coffea.processor", "py:module", "modules/coffea.processor.html#module-coffea.processor"),
            ("coffea.processor.Runner", "py:class", "api/coffea.processor.Runner.html#coffea.processor.Runner"),
            ("coffea.processor.DaskExecutor", "py:class",
             "api/coffea.processor.DaskExecutor.html#coffea.processor.DaskExecutor"),
            # autodoc names a base class by its defining module: the same page
            ("coffea.processor.executor.DaskExecutor", "py:class",
             "api/coffea.processor.DaskExecutor.html#coffea.processor.DaskExecutor"),
            ("coffea.processor.IterativeExecutor", "py:class",
             "api/coffea.processor.IterativeExecutor.html#coffea.processor.IterativeExecutor"),
            ("coffea.processor.FuturesExecutor", "py:class",
             "api/coffea.processor.FuturesExecutor.html#coffea.processor.FuturesExecutor"),
            ("coffea.processor.ProcessorABC", "py:class",
             "api/coffea.processor.ProcessorABC.html#coffea.processor.ProcessorABC"),
        ],
    ),
    "dask_gateway": (
        "dask-gateway",
        "latest",
        "BSD-3-Clause",
        [
            ("dask_gateway.Gateway", "py:class", "api-client.html#dask_gateway.Gateway"),
            ("dask_gateway.GatewayCluster", "py:class", "api-client.html#dask_gateway.GatewayCluster"),
        ],
    ),
    # Debian's python-click-doc has an objects.inv, but of an "html" build (api.html);
    # click's site is a "dirhtml" build (api/)
    "click": (
        "Click",
        "stable",
        "BSD-3-Clause",
        [
            ("click.ClickException", "py:exception", "api/#click.ClickException"),
            ("click.exceptions.ClickException", "py:exception", "api/#click.ClickException"),
            ("click.Command", "py:class", "api/#click.Command"),
            ("click.Group", "py:class", "api/#click.Group"),
        ],
    ),
}  # fmt: skip

#: project -> {alias: name in that project's Debian inventory}
ALIASES = {
    "distributed": {
        "distributed.Scheduler": "distributed.scheduler.Scheduler",
        "distributed.Worker": "distributed.worker.Worker",
        "distributed.Nanny": "distributed.nanny.Nanny",
    },
}

#: project -> entries added to its Debian inventory: (name, domain:role, page#anchor) for a
#: name the project's documentation describes without an object entry of its own
EXTRA = {
    "distributed": [
        # the work-stealing extension; its page documents it, autodoc does not
        ("distributed.stealing.WorkStealing", "py:class", "work-stealing.html"),
    ],
}

HEADER = (
    "# Sphinx inventory version 2\n"
    "# Project: {project}\n"
    "# Version: {version}\n"
    "# The remainder of this file is compressed using zlib.\n"
)


def conf_inventories() -> dict[str, str]:
    """docs/conf.py's INVENTORIES (project -> base URL), read without importing Sphinx."""
    namespace: dict = {"__file__": str(DOCS / "conf.py")}
    source = (DOCS / "conf.py").read_text()
    start = source.index("INVENTORIES = {")
    end = source.index("}", start) + 1
    exec(source[start:end], namespace)  # a literal dict of strings
    return namespace["INVENTORIES"]


def priority(role: str) -> int:
    return {"py:module": 0, "std:label": -1, "std:doc": -1}.get(role, 1)


def write_inventory(path: Path, project: str, version: str, entries) -> int:
    """Write (name, domain:role, uri, display name) entries; the bytes depend on them only."""
    lines = []
    for name, role, uri, display in sorted(set(entries)):
        if uri.endswith("#" + name):
            uri = uri[: -len(name)] + "$"
        lines.append(f"{name} {role} {priority(role)} {uri} {display if display != name else '-'}\n")
    header = HEADER.format(project=project, version=version)
    path.write_bytes(header.encode() + zlib.compress("".join(lines).encode(), 9))
    return len(lines)


def load(path: Path):
    from sphinx.util.inventory import InventoryFile

    return InventoryFile.loads(path.read_bytes(), uri="")


def fetch_debs(debs: Path | None, work: Path) -> dict[str, tuple[Path, str]]:
    """project -> (extracted objects.inv, package version)."""
    if debs is None:
        debs = work / "debs"
        debs.mkdir()
        packages = [deb.package for deb in DEBIAN.values()]
        subprocess.run(["apt-get", "download", *packages], cwd=debs, check=True)
    found = {}
    for project, deb in DEBIAN.items():
        files = sorted(debs.glob(f"{deb.package}_*.deb"))
        if not files:
            sys.exit(f"no {deb.package}_*.deb in {debs}")
        version = subprocess.run(
            ["dpkg-deb", "-f", str(files[-1]), "Version"], check=True, capture_output=True, text=True
        ).stdout.strip()
        into = work / deb.package
        subprocess.run(["dpkg-deb", "-x", str(files[-1]), str(into)], check=True)
        found[project] = (into / deb.inventory, version)
    return found


def referenced_targets(mapping: dict, work: Path) -> set[tuple[str, str]]:
    """(domain, target) of every cross-reference the documentation leaves to intersphinx."""
    from sphinx.application import Sphinx

    seen: set[tuple[str, str]] = set()

    def record(app, env, node, contnode):
        domain, target = node.get("refdomain") or "std", node.get("reftarget", "")
        seen.add((domain, target))
        prefix, _, rest = target.partition(":")
        if rest and prefix in mapping:  # an explicit "project:name"
            seen.add((domain, rest))

    warnings = io.StringIO()
    app = Sphinx(
        str(DOCS), str(DOCS), str(work / "out"), str(work / "doctrees"), "dummy",
        confoverrides={"intersphinx_mapping": mapping}, status=None, warning=warnings,
        freshenv=True,
    )  # fmt: skip
    app.connect("missing-reference", record, priority=1)  # before every resolver
    app.build()
    return seen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--debs", type=Path, help="directory holding the .deb files (offline)")
    args = parser.parse_args(argv)
    bases = conf_inventories()
    if set(DEBIAN) | set(TABLE) != set(bases):
        differ = sorted((set(DEBIAN) | set(TABLE)) ^ set(bases))
        sys.exit(f"docs/conf.py's INVENTORIES and this tool's sources differ: {differ}")
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        debs = fetch_debs(args.debs, work)
        counts: dict[str, tuple[int, int]] = {}
        for project, (name, version, _licence, rows) in TABLE.items():
            n = write_inventory(OUT / f"{project}.inv", name, version, [(*r, "-") for r in rows])
            counts[project] = (n, n)
        # the full Debian inventories, the table ones as written
        mapping = {p: (bases[p], str(debs[p][0])) for p in DEBIAN}
        mapping.update({p: (bases[p], str(OUT / f"{p}.inv")) for p in TABLE})
        targets = referenced_targets(mapping, work)
        resolved: set[tuple[str, str]] = set()
        versions = {}
        for project in DEBIAN:
            inv = load(debs[project][0])
            aliases = ALIASES.get(project, {})
            entries = []
            for role, items in inv.data.items():
                domain = role.split(":")[0]
                names = {name: name for name in items}
                names.update({a: n for a, n in aliases.items() if n in items})
                for shown, name in names.items():
                    if (domain, shown) in targets:
                        entries.append((shown, role, items[name].uri, items[name].display_name))
                        resolved.add((domain, shown))
            for name, role, uri in EXTRA.get(project, []):
                if (role.split(":")[0], name) in targets:
                    entries.append((name, role, uri, "-"))
                    resolved.add((role.split(":")[0], name))
            first = next(iter(next(iter(inv.data.values())).values()))
            project_name = first.project_name
            # dask's inventory has no version: the upstream part of the package's
            version = first.project_version or re.sub(r"[+-].*", "", debs[project][1])
            n = write_inventory(OUT / f"{project}.inv", project_name, version, entries)
            counts[project] = (n, sum(len(items) for items in inv.data.values()))
            versions[project] = debs[project][1]
        for _n, _v, _l, rows in TABLE.values():
            resolved |= {(role.split(":")[0], name) for name, role, _uri in rows}
    write_readme(bases, versions, counts)
    prefixes = tuple(f"{p}." for p in bases) + ("collections.", "typing.", "os.", "numpy.")
    unknown = sorted(t for d, t in targets - resolved if d == "py" and t.startswith(prefixes))
    for project, (kept, total) in sorted(counts.items()):
        size = (OUT / f"{project}.inv").stat().st_size
        print(f"{project}: {kept} of {total} entries, {size} bytes")
    if unknown:
        print("referenced, but in no inventory (add to TABLE or ALIASES, or fix the reference):")
        print("\n".join(f"  {t}" for t in unknown))


def write_readme(bases: dict, versions: dict, counts: dict) -> None:
    rows = []
    for project in bases:
        kept = counts[project][0]
        if project in DEBIAN:
            deb = DEBIAN[project]
            source = f"Debian package `{deb.package}` {versions[project]}, `/{deb.inventory}`"
            licence = deb.licence
        else:
            source = "written from the table `TABLE` in tools/docs_inventories.py"
            licence = TABLE[project][2]
        rows.append(f"| `{project}.inv` | {bases[project]} | {source} | {licence} | {kept} |")
    system = "this machine"
    os_release = Path("/etc/os-release")
    if os_release.is_file():
        found = re.search(r'^PRETTY_NAME="?([^"\n]*)', os_release.read_text(), re.M)
        system = found.group(1) if found else system
    text = README.format(rows="\n".join(rows), system=system)
    (OUT / "README.md").write_text(text)


README = """\
# Intersphinx inventories (generated)

The documentation links to other projects' documentation with intersphinx, and builds without
network: `docs/conf.py` points `intersphinx_mapping` at these files instead of the projects'
online `objects.inv`. Each is a Sphinx inventory (version 2, zlib-compressed) holding only the
entries the documentation references; the links go to the projects' online documentation
(the base URL below, from `INVENTORIES` in `docs/conf.py`).

Generated by `tools/docs_inventories.py`; do not edit. Regenerate after docstrings or pages
reference new names of these projects (a nitpicky build, `sphinx -n`, reports them):

    python tools/docs_inventories.py              # apt-get download of the Debian packages
    python tools/docs_inventories.py --debs DIR   # .deb files already downloaded to DIR

| file | links to | entries from | licence of the source | entries |
| --- | --- | --- | --- | --- |
{rows}

The Debian packages are those of {system}, where the files were last generated; `ALIASES`
and `EXTRA` in the tool add a few entries to a Debian inventory (e.g. `distributed.Scheduler`,
listed by the 2022 inventory as `distributed.scheduler.Scheduler` only).

An inventory is an index of names and page addresses, derived from the project's documentation
(whose licence is given); the Debian packages' `debian/copyright` files state it. Entries
written from the table link to pages of the projects' public documentation sites.
"""


if __name__ == "__main__":
    main()
