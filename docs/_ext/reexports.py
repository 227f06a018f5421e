"""Resolve Python cross-references to cacheaffinity objects documented under another name.

The API reference documents each object once, under its public name (``cacheaffinity.ColumnCache``),
but the object's ``__module__`` is the private module that defines it
(``cacheaffinity.worker._store.cache``), and a re-exported name (``cacheaffinity.client.chunk``,
``cacheaffinity.scheduler.CacheAffinityPlugin``) is the same object as the documented one.
Autodoc writes type hints and base classes with the defining module's path, and docstrings may
name any public path of an object, so Sphinx's Python domain finds no target for them.

On ``missing-reference`` this extension imports the referenced ``cacheaffinity.*`` name and,
when it is the very object documented under another name, links there (and shows the
documented name where the link text was a private module's path).  Only objects that have an
identity of their own (classes, functions, methods, properties, modules) are matched, never
plain values.  Names that import nothing, or name an undocumented object, stay unresolved and
are reported by a nitpicky build as before.

A documented class's "Bases:" line leaves out a base class defined in a private module that no
public module exports (``ColumnCache``'s storage protocol): it has no entry to link to.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from docutils import nodes
from sphinx.util.nodes import make_refnode

PACKAGE = "cacheaffinity"
_MISSING = object()


def _import(name: str) -> Any:
    """The object a dotted name designates, importing its module; _MISSING if none."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _has_identity(obj: Any) -> bool:
    return (
        inspect.isclass(obj)
        or inspect.isroutine(obj)
        or inspect.ismodule(obj)
        or isinstance(obj, (property, classmethod, staticmethod))
        or hasattr(obj, "__wrapped__")
        or type(obj).__module__.startswith("click")  # click commands (the preloads, the CLI)
    )


#: env id -> (number of py objects when computed, id(object) -> (name, entry), the objects).
#: Kept here, not on the environment, which Sphinx pickles.
_CACHE: dict[int, tuple[int, dict[int, tuple[str, Any]], list[Any]]] = {}


def _documented(env) -> dict[int, tuple[str, Any]]:
    """id(object) -> (documented name, domain entry) of every documented cacheaffinity object."""
    objects = env.domains["py"].objects
    cached = _CACHE.get(id(env))
    if cached is not None and cached[0] == len(objects):
        return cached[1]
    found: dict[int, tuple[str, Any]] = {}
    keep: list[Any] = []  # keep the objects alive while their ids are keys
    for name, entry in objects.items():
        if not name.startswith(PACKAGE) or getattr(entry, "aliased", False):
            continue
        obj = _import(name)
        if obj is _MISSING or not _has_identity(obj):
            continue
        keep.append(obj)
        found.setdefault(id(obj), (name, entry))
    _CACHE[id(env)] = (len(objects), found, keep)
    return found


def _candidates(node) -> list[str]:
    target = node.get("reftarget", "")
    if target.startswith(PACKAGE + "."):
        return [target]
    module = node.get("py:module") or ""
    if module.startswith(PACKAGE):
        names = [f"{module}.{target}"]
        if node.get("py:class"):
            names.insert(0, f"{module}.{node['py:class']}.{target}")
        return names
    return []


def missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    documented = None
    for name in _candidates(node):
        obj = _import(name)
        if obj is _MISSING or not _has_identity(obj):
            continue
        documented = documented or _documented(env)
        hit = documented.get(id(obj))
        if hit is None:
            continue
        canonical, entry = hit
        if contnode.astext() == node["reftarget"] and "._" in node["reftarget"]:
            # autodoc's type hints show the defining (private) module's path: show the public name
            if isinstance(contnode, nodes.Text):
                contnode = nodes.Text(canonical)
            else:
                contnode = contnode.deepcopy()
                contnode.children = []
                contnode += nodes.Text(canonical)
        return make_refnode(
            app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, canonical
        )
    return None


def _private(cls) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(PACKAGE) and any(part.startswith("_") for part in module.split("."))


def _exported(obj) -> bool:
    """Whether a public module of the package names ``obj`` in its ``__all__``."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(PACKAGE) or "._" in name:
            continue
        for attr in getattr(module, "__all__", ()):
            if module.__dict__.get(attr) is obj:
                return True
    return False


def process_bases(app, name, obj, options, bases):
    bases[:] = [b for b in bases if not (inspect.isclass(b) and _private(b) and not _exported(b))]


def setup(app):
    app.connect("autodoc-process-bases", process_bases)
    # before intersphinx (priority 500): these names are ours, never another project's
    app.connect("missing-reference", missing_reference, priority=400)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
