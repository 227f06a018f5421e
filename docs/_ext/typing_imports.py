"""Resolve bare names that cacheaffinity imports only for type checking.

The scheduler side annotates with distributed's classes, imported under
``if TYPE_CHECKING:`` (``from distributed.scheduler import TaskState``) so that importing the
module does not import the scheduler.  Autodoc cannot evaluate such annotations and writes
them as they are (``TaskState``), and numpydoc type fields name them the same way; the Python
domain, which knows no ``TaskState``, leaves the reference unresolved.

This extension reads every module of the package once (``ast``, nothing imported), maps each
name imported under ``TYPE_CHECKING`` to its full name, and on ``missing-reference`` retries a
bare name as that full name: first among the documented objects, then through the other
resolvers (``reexports``, intersphinx).  A name imported under two different full names is
taken from the module that defines the referring object, or left alone.  Unlike
``autodoc_type_aliases`` this needs no list kept by hand, and it also works inside
``X | None`` and ``dict[X, Y]``.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

PACKAGE = "cacheaffinity"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_imports(path: Path) -> dict[str, str]:
    """Bare name -> full name of what ``path`` imports under ``if TYPE_CHECKING:``."""
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                for alias in stmt.names:
                    out[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
    return out


def _imports(env) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(module name -> its map, bare name -> full name where every module agrees)."""
    cached = getattr(env, "_typing_imports", None)
    if cached is not None:
        return cached
    root = Path(importlib.import_module(PACKAGE).__file__).parent
    per_module: dict[str, dict[str, str]] = {}
    seen: defaultdict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        per_module[name] = _module_imports(path)
        for bare, full in per_module[name].items():
            seen[bare].add(full)
    unique = {bare: next(iter(fulls)) for bare, fulls in seen.items() if len(fulls) == 1}
    env._typing_imports = per_module, unique
    return env._typing_imports


def _defining_module(node) -> str | None:
    """The module that defines the object whose documentation holds ``node``."""
    module, cls = node.get("py:module"), node.get("py:class")
    if not (module and cls and module.startswith(PACKAGE)):
        return None
    try:
        obj = importlib.import_module(module)
        for attr in cls.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError):
        return None
    return getattr(obj, "__module__", None)


def missing_reference(app, env, node, contnode):
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.isidentifier():
        return None
    per_module, unique = _imports(env)
    full = per_module.get(_defining_module(node) or "", {}).get(target) or unique.get(target)
    if full is None:
        return None
    retry = node.deepcopy()
    retry["reftarget"] = full
    domain = env.domains["py"]
    found = domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], full, retry, contnode
    )
    if found is not None:
        return found
    # the other resolvers (reexports, intersphinx); a dotted name never comes back here
    return app.emit_firstresult("missing-reference", env, retry, contnode)


def setup(app):
    app.connect("missing-reference", missing_reference, priority=450)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
