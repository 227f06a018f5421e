"""The chunk-id grammar ``<file>/<tree>/s<S>:<k>``, the one place that knows it (any process).

A coffea chunk id names a placement *stripe*: entries ``[k*S, (k+1)*S)`` of a file's tree. The
client formats it, the scheduler's locator parses it back. ``file`` is any text; ``tree`` is any
text with ``%`` and ``/`` written ``%25`` and ``%2F`` (so the last ``/`` before ``s<S>:<k>``
ends the file part); ``S >= 1`` and ``k >= 0`` in decimal. Imports nothing of cacheaffinity.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["ChunkId", "Stripe", "format_chunk_id", "parse_chunk_id", "parse_stripe"]

#: Separator before the stripe part (``/s<S>:<k>``).
STRIPE_SEP = "/s"

_UNESCAPE = re.compile(r"%(25|2F)")
_ESCAPED = {"25": "%", "2F": "/"}


def _escape_tree(tree: str) -> str:
    if "%" in tree:
        tree = tree.replace("%", "%25")
    if "/" in tree:
        tree = tree.replace("/", "%2F")
    return tree


def _unescape_tree(text: str) -> str | None:
    """The tree of an escaped tree part; None if a ``%`` escapes nothing."""
    if "%" not in text:
        return text
    if text.count("%") != len(_UNESCAPE.findall(text)):
        return None
    return _UNESCAPE.sub(lambda m: _ESCAPED[m.group(1)], text)


def _number(text: str) -> int | None:
    """A non-negative decimal written in ASCII digits, else None."""
    return int(text) if text.isascii() and text.isdigit() else None


class ChunkId(NamedTuple):
    """A parsed chunk id: stripe ``stripe`` of ``stripe_entries`` entries of ``file``'s ``tree``."""

    file: str
    tree: str
    stripe_entries: int
    stripe: int

    def text(self) -> str:
        """The chunk id (:func:`format_chunk_id`)."""
        return format_chunk_id(*self)


class Stripe(NamedTuple):
    """The stripe part of a chunk id, as written (the locator names neighbouring stripes by it)."""

    #: ``<file>/<tree>/s<S>:``, the id without its stripe number
    prefix: str
    stripe_entries: int
    stripe: int

    def sibling(self, k: int) -> str:
        """The id of stripe ``k`` of the same file, tree and stripe size."""
        return f"{self.prefix}{k}"


def format_chunk_id(file: str, tree: str, stripe_entries: int, k: int) -> str:
    """The chunk id of stripe ``k`` (entries ``[k*S, (k+1)*S)``, ``S = stripe_entries``) of ``file``'s ``tree``."""
    if isinstance(stripe_entries, bool) or not isinstance(stripe_entries, int) or stripe_entries < 1:
        raise ValueError(f"stripe_entries={stripe_entries!r} must be an integer >= 1")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"stripe k={k!r} must be an integer >= 0")
    return f"{file}/{_escape_tree(tree)}{STRIPE_SEP}{stripe_entries}:{k}"


def parse_stripe(chunk: str) -> Stripe | None:
    """The stripe part of ``chunk``, or None: every id whose tail after its last ``/s`` reads
    ``<S>:<k>`` with ``S >= 1`` is a stripe, whatever comes before."""
    head, sep, tail = chunk.rpartition(STRIPE_SEP)
    if not sep:
        return None
    size, colon, k = tail.partition(":")
    if not colon:
        return None
    s, j = _number(size), _number(k)
    if s is None or j is None or s < 1:
        return None
    return Stripe(chunk[: len(chunk) - len(k)], s, j)


def parse_chunk_id(chunk: str) -> ChunkId | None:
    """``chunk`` as a :class:`ChunkId`; None if it does not follow the grammar."""
    if not isinstance(chunk, str):
        return None
    stripe = parse_stripe(chunk)
    if stripe is None:
        return None
    head = stripe.prefix[: stripe.prefix.rindex(STRIPE_SEP)]
    file, slash, tree_text = head.rpartition("/")
    if not slash:
        return None
    tree = _unescape_tree(tree_text)
    if tree is None:
        return None
    return ChunkId(file, tree, stripe.stripe_entries, stripe.stripe)
