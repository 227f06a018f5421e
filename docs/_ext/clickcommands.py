"""Document a click command (``@click.command``) as the function it decorates.

``cacheaffinity.preload.command_line_setup`` and ``cacheaffinity.cli.cli`` are click command
objects.  ``autofunction`` takes their docstring from the decorated function, but their
signature and type hints from ``click.Command.__call__`` (``*args: t.Any, **kwargs: t.Any``,
annotations click writes with its own ``typing`` alias): a signature nobody calls and three
references that resolve nowhere.  This shows the decorated function's parameters instead
(without type hints: click passes what its options parse to).
"""

from __future__ import annotations

import inspect

from sphinx.util.inspect import stringify_signature


def process_signature(app, what, name, obj, options, signature, return_annotation):
    try:
        import click
    except ImportError:
        return None
    callback = getattr(obj, "callback", None)
    if not (isinstance(obj, click.Command) and callable(callback)):
        return None
    # the type hints autodoc recorded from click.Command.__call__ would be listed as parameters
    app.env.current_document.autodoc_annotations.pop(name, None)
    sig = inspect.signature(inspect.unwrap(callback))
    return stringify_signature(sig, show_annotation=False, show_return_annotation=False), None


def setup(app):
    # after autodoc recorded the type hints of the object it was given (priority 500)
    app.connect("autodoc-process-signature", process_signature, priority=600)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
