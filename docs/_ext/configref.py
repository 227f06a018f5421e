"""Sphinx extension: the configuration reference, generated at build time from
``cacheaffinity/cacheaffinity.yaml`` (defaults and the comment above each key) and
``cacheaffinity/cacheaffinity-schema.yaml`` (type, bounds, allowed values, examples, the
one-line description).

Usage in a page (MyST)::

    ```{cacheaffinity-config}
    ```

Every leaf key becomes a ``confval`` entry (Sphinx's standard domain: indexed, linkable as
``{confval}`cacheaffinity.worker.capacity```) with its default, type, allowed values,
environment variable and description.  A key in the yaml without a schema entry, or the
reverse, stops the build: the reference cannot drift from the code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

PACKAGE = Path(__file__).resolve().parents[2] / "cacheaffinity"
DEFAULTS = PACKAGE / "cacheaffinity.yaml"
SCHEMA = PACKAGE / "cacheaffinity-schema.yaml"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_-]+):(?P<rest>.*)$")
_LITERAL = re.compile(r"(``.+?``)")


def comments(text: str) -> dict[str, str]:
    """Dotted key -> the comment block written directly above it in the yaml file."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped[1:].strip())
            continue
        m = _KEY.match(line)
        if not m:
            block = []
            continue
        indent = len(m.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group("key")))
        out[".".join(k for _, k in stack)] = " ".join(block)
        block = []
    return out


def leaves(defaults: dict, schema: dict, prefix: str = ""):
    """(dotted key, default, schema entry) of every leaf of the defaults."""
    props = schema.get("properties", {})
    missing = sorted(set(props) - set(defaults))
    if missing:
        raise ExtensionError(f"{SCHEMA.name}: {prefix or 'top level'} has schema keys "
                             f"{missing} with no default in {DEFAULTS.name}")
    for key, value in defaults.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in props:
            raise ExtensionError(f"{DEFAULTS.name}: {dotted} has no entry in {SCHEMA.name}")
        sub = props[key]
        if isinstance(value, dict) and sub.get("type") == "object" and "properties" in sub:
            yield from leaves(value, sub, dotted)
        else:
            yield dotted, value, sub


def escape(text: str) -> str:
    """Prose from a yaml comment as rST: ``literals`` kept, other markup characters escaped."""
    parts = _LITERAL.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*`|_\[\]<>])", r"\\\1", parts[i])
    return "".join(parts)


def env_name(key: str) -> str:
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


def shown(value) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


def type_text(sub: dict) -> str:
    types = sub.get("type", "any")
    types = types if isinstance(types, list) else [types]
    text = " or ".join(types)
    if sub.get("format") == "bytes":
        text += " (bytes: ``10 GiB`` or an integer)"
    elif sub.get("format") == "duration":
        text += " (duration: ``5 s``, ``250ms`` or seconds)"
    return text


def allowed_text(sub: dict) -> str | None:
    if "enum" in sub:
        return ", ".join(f"``{shown(v)}``" for v in sub["enum"])
    bounds = []
    for word, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                     ("exclusiveMaximum", "<")):
        if word in sub:
            bounds.append(f"{op} {sub[word]}")
    extra = sub.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type"):
        bounds.append(f"values: {type_text(extra)}" + "".join(
            f", {op} {extra[w]}" for w, op in (("minimum", ">="), ("exclusiveMinimum", ">"))
            if w in extra))
    return ", ".join(bounds) or None


def reference_lines() -> list[str]:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    schema = yaml.safe_load(SCHEMA.read_text())
    notes = comments(DEFAULTS.read_text())
    lines: list[str] = []
    section = None
    for key, value, sub in leaves(defaults, schema):
        group = ".".join(key.split(".")[:-1])
        if group != section:
            section = group
            title = f"``{group}``"
            lines += ["", title, "-" * len(title), ""]
        lines += [f".. confval:: {key}", f"   :type: {type_text(sub)}",
                  f"   :default: ``{shown(value)}``", ""]
        if sub.get("description"):
            lines += [f"   {escape(sub['description'])}", ""]
        if notes.get(key):
            lines += [f"   {escape(notes[key])}", ""]
        allowed = allowed_text(sub)
        if allowed:
            lines += [f"   :Allowed: {allowed}"]
        if sub.get("examples"):
            lines += ["   :Example: " + ", ".join(f"``{shown(v)}``" for v in sub["examples"])]
        lines += [f"   :Environment: ``{env_name(key)}``", ""]
    return lines


class ConfigReference(SphinxDirective):
    has_content = False

    def run(self):
        self.env.note_dependency(str(DEFAULTS))
        self.env.note_dependency(str(SCHEMA))
        lines = StringList(reference_lines(), source=str(DEFAULTS))
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, lines, container)
        return container.children


def setup(app):
    app.add_directive("cacheaffinity-config", ConfigReference)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
