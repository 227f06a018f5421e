"""Tests of :mod:`cacheaffinity.chunk_id`: the chunk-id grammar ``<file>/<tree>/s<S>:<k>``,
its round trips (paths, URLs, trees with ``/``) and the ids it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheaffinity.chunk_id import ChunkId, format_chunk_id, parse_chunk_id, parse_stripe

ROUND_TRIPS = [
    pytest.param("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.0123456789abcdef", "Events", 200000, 3,
                 id="uuid-and-stamp"),
    pytest.param("/data/s1/run:2/f.root", "Events", 1000, 0, id="path-with-slash-colon-s"),
    pytest.param("/data/x/s5:7", "Events", 10, 1, id="path-that-looks-like-a-stripe"),
    pytest.param("root://host.example.org//store/s/f.root.abcdef", "Events", 5000, 12,
                 id="xrootd-url"),
    pytest.param("https://host:8443/a/b.parquet", "Events", 1, 99, id="https-url-with-port"),
    pytest.param("u", "dir/sub/Events", 1500, 1, id="tree-with-slashes"),
    pytest.param("root://h//p/f.root", "dir/s10:2", 100, 4, id="url-and-stripe-like-tree"),
    pytest.param("u", "100%/tree%2F", 7, 0, id="tree-with-percent"),
    pytest.param("", "", 1, 0, id="empty-file-and-tree"),
    pytest.param("f/", "t", 3, 2, id="file-ending-in-slash"),
    pytest.param("ü/ñ", "Ēvents", 10, 3, id="non-ascii"),
]  # fmt: skip


@pytest.mark.parametrize("file, tree, stripe_entries, k", ROUND_TRIPS)
def test_round_trip(file, tree, stripe_entries, k):
    chunk = format_chunk_id(file, tree, stripe_entries, k)
    parsed = parse_chunk_id(chunk)
    assert parsed == ChunkId(file, tree, stripe_entries, k)
    assert parsed.text() == chunk
    stripe = parse_stripe(chunk)
    assert (stripe.stripe_entries, stripe.stripe) == (stripe_entries, k)
    assert stripe.sibling(k) == chunk
    assert parse_chunk_id(stripe.sibling(k + 1)) == ChunkId(file, tree, stripe_entries, k + 1)


def test_the_format_is_the_one_chunk_ids_always_had():
    """Trees without ``%`` or ``/`` (every tree of the tests and examples): unchanged ids."""
    assert format_chunk_id("u.t", "Events", 1500, 1) == "u.t/Events/s1500:1"
    assert format_chunk_id("root://h//f.root", "Events", 10, 0) == "root://h//f.root/Events/s10:0"
    assert format_chunk_id("u", "a/b", 10, 0) == "u/a%2Fb/s10:0"


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=30),
    st.text(max_size=20),
    st.integers(min_value=1, max_value=10**9),
    st.integers(min_value=0, max_value=10**6),
)
def test_round_trip_of_any_text(file, tree, stripe_entries, k):
    chunk = format_chunk_id(file, tree, stripe_entries, k)
    assert parse_chunk_id(chunk) == (file, tree, stripe_entries, k)


MALFORMED = [
    "chunk-7", "", "u/Events", "u/Events/s", "u/Events/s10", "u/Events/s10:", "u/Events/s:3",
    "u/Events/sx:3", "u/Events/s10:y", "u/Events/s0:3", "u/Events/s-1:3", "u/Events/s10:-3",
    "u/Events/s10:3:4", "u/Events/s10:3 ", "u/Events/s²:1", "u/Events/s10:١",
    "Events/s10:3",  # no file part
    "u/Ev%ents/s10:3", "u/Ev%2Gnts/s10:3",  # a % that escapes nothing
    "u/Events/S10:3", "u/Events/t10:3",
]  # fmt: skip


@pytest.mark.parametrize("chunk", MALFORMED)
def test_malformed_ids_are_none(chunk):
    assert parse_chunk_id(chunk) is None


def test_stripe_without_a_file_part_is_still_a_stripe():
    """The locator reads the stripe of any id ending in ``/s<S>:<k>`` (user chunk ids too)."""
    assert parse_stripe("Events/s10:3") == ("Events/s10:", 10, 3)
    assert parse_stripe("/s10:3").sibling(4) == "/s10:4"
    assert parse_stripe("x/s010:02").sibling(1) == "x/s010:1"  # as written
    for chunk in ("chunk-7", "u/Events/s0:3", "u/Events/s²:1", "u/Events/s10:3:4"):
        assert parse_stripe(chunk) is None
    assert parse_chunk_id(None) is None


@pytest.mark.parametrize(
    "args", [("u", "t", 0, 0), ("u", "t", 10, -1), ("u", "t", True, 0), ("u", "t", 1.5, 0)]
)
def test_format_refuses_bad_stripes(args):
    with pytest.raises(ValueError):
        format_chunk_id(*args)
