"""Command-line samples in the docs, checked against (or rewritten from) real output.

A sample is a console block between markers::

    <!-- sample:NAME -->
    ```console
    $ cacheaffinity stats tcp://127.0.0.1:8786 --last 2     # a comment
    ...the output...
    ```
    <!-- /sample -->

``tests/test_docs_examples.py`` runs the command against a real cluster after running the
docs' examples, and compares the output with the sample, cell by cell, with the values of
one run masked (run ids, times, addresses, node ids, paths: :func:`normalise`).  With
``CACHEAFFINITY_WRITE_SAMPLES=1`` it writes the real output into the samples instead.
``tests/test_demo.py`` does the same for the ``make demo`` sample of docs/install.md.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Sample", "cells", "normalise", "samples", "write"]

SAMPLE = re.compile(
    r"^(?P<indent>[ \t]*)<!-- sample:(?P<name>[\w-]+) -->\n"
    r"[ \t]*```console\n"
    r"[ \t]*\$ (?P<command>[^\n]*)\n"
    r"(?P<body>.*?)"
    r"^[ \t]*```\n[ \t]*<!-- /sample -->",
    re.S | re.M,
)


@dataclass
class Sample:
    """One sample of a page: its name, the command's arguments (after its program,
    ``cacheaffinity`` or ``make``; without the comment), the output lines shown (indentation
    removed) and the program."""

    path: Path
    name: str
    args: list[str]
    output: list[str]
    program: str = "cacheaffinity"


def samples(path: Path) -> list[Sample]:
    """The samples of the page at ``path``."""
    out = []
    for m in SAMPLE.finditer(path.read_text()):
        indent = len(m.group("indent"))
        words = shlex.split(m.group("command"), comments=True)
        assert words and words[0] in ("cacheaffinity", "make"), m.group("command")
        lines = [line[indent:] for line in m.group("body").splitlines()]
        out.append(Sample(path, m.group("name"), words[1:], lines, words[0]))
    return out


def write(path: Path, name: str, output: list[str]) -> None:
    """Put ``output`` into sample ``name`` of the page at ``path`` (its indentation kept)."""
    text = path.read_text()

    def repl(m: re.Match) -> str:
        if m.group("name") != name:
            return m.group(0)
        pad = m.group("indent")
        body = "".join(f"{pad}{line}".rstrip() + "\n" for line in output)
        start = m.start("body") - m.start()
        end = m.end("body") - m.start()
        whole = m.group(0)
        return whole[:start] + body + whole[end:]

    path.write_text(SAMPLE.sub(repl, text))


#: What differs between two real runs of the same commands, and its placeholder.
_MASKS = (
    (re.compile(r"\b[0-9a-f]{32}\b"), "<run>"),
    (re.compile(r"\b[0-9a-f]{12}\b"), "<run>"),  # a run id's first 12 characters
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d( \([^)]*ago\))?"), "<time>"),
    (re.compile(r"tcp://[\w.-]+:\d+"), "<address>"),
    (re.compile(r"^cacheaffinity \S+ on "), "cacheaffinity <version> on "),
    (re.compile(r"^  done in \d+\.\d s$"), "  done in <seconds> s"),  # the demo's data
    (re.compile(r"http://127\.0\.0\.1:\d+/"), "http://127.0.0.1:<port>/"),  # a dashboard
)


def normalise(line: str, replace: dict[str, str] | None = None, mask: bool = True) -> str:
    """``line`` with ``replace``'s strings (a directory, node ids) replaced first, then (with
    ``mask``) the values of one run masked."""
    for old, new in (replace or {}).items():
        line = line.replace(old, new)
    if mask:
        for pattern, placeholder in _MASKS:
            line = pattern.sub(placeholder, line)
    return line


def cells(line: str) -> list[str]:
    """The cells of a table line (columns are at least two spaces apart)."""
    return re.split(r"\s{2,}", line.strip())
