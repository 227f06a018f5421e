"""Jitter of :mod:`testbed.synthetic`: small random changes of floating-point values.

Each float value of a generated event is multiplied by ``1 + N(0, sigma)`` and rounded to the
template's precision of its branch, so that generated baskets do not repeat the template's few
value sequences; integers, bools, counters, indices and special values are copied exactly.
A value's random number depends only on (seed, file, branch, event position in the file,
position in the event's collection), never on how the file is cut into baskets.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from testbed.nanoaod_template import Template, _Collection, _Plan

# --------------------------------------------------------------------------------------------
# jitter: small random changes of floating-point values that break exact repeats

# A value's random number depends on (seed, file, branch, event position in the file, position
# in the event's collection): counter = event position << _INNER_BITS | index in the event.
_INNER_BITS = 24
_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)

# Branch-level and value-level rules (see make_dataset's docstring), from the template's values:
# a value occurring at least this often in a branch is a special value, copied exactly...
_FREQUENT_MIN_COUNT = 3
_FREQUENT_MIN_FRACTION = 0.05
# ... a branch with at most this many distinct values per value is discrete, copied exactly...
_DISCRETE_MAX_UNIQUE_FRACTION = 0.25
# ... and values are rounded to the branch's mantissa precision, at least this many bits.
_MIN_MANTISSA_BITS = 6

_MANTISSA = {np.dtype(np.float32): (23, np.uint32), np.dtype(np.float64): (52, np.uint64)}


def _normal(key: int, counters: np.ndarray) -> np.ndarray:
    """Standard normal numbers, one per counter, from a counter-based hash (splitmix64 of
    ``key + (counter + 1) * golden``, Box-Muller on its two 32-bit halves; |z| < 6.8)."""
    x = counters.astype(np.uint64)  # a copy; uint64 arithmetic wraps around
    x += _U64(1)
    x *= _GOLDEN
    x += _U64(key)
    x ^= x >> _U64(30)
    x *= _MIX1
    x ^= x >> _U64(27)
    x *= _MIX2
    x ^= x >> _U64(31)
    u1 = ((x >> _U64(32)).astype(np.float64) + 0.5) * 2.0**-32
    u2 = (x & _U64(0xFFFFFFFF)).astype(np.float64) * (2.0 * np.pi * 2.0**-32)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(u2)


def _mantissa_bits(values: np.ndarray) -> np.ndarray:
    """Mantissa bits in use by each float (23 or 52 minus the trailing zero bits)."""
    nbits, utype = _MANTISSA[values.dtype]
    mantissa = values.view(utype) & utype((1 << nbits) - 1)
    lowest = mantissa & (~mantissa + utype(1))  # lowest set bit (0 for a zero mantissa)
    trailing = np.where(mantissa == 0, nbits, np.log2(np.maximum(lowest, 1)).astype(np.int64))
    return nbits - trailing


def _round_mantissa(values: np.ndarray, bits: int) -> np.ndarray:
    """Round floats (in place) to ``bits`` mantissa bits, to nearest (halves away from zero; a
    carry goes into the exponent), like NanoAOD's reduced precision
    (CMSSW ``MiniFloatConverter::reduceMantissaToNbitsRounding``)."""
    nbits, utype = _MANTISSA[values.dtype]
    if bits >= nbits:
        return values
    shift = nbits - bits
    width = 8 * np.dtype(utype).itemsize
    u = values.view(utype)
    u += utype(1 << (shift - 1))
    u &= utype(((1 << width) - 1) >> shift << shift)
    return values


@dataclass(frozen=True)
class _JitterSpec:
    """How one floating-point branch is jittered."""

    bits: int  # mantissa bits kept (>= 23 or 52: full precision)
    exact: np.ndarray  # special values copied exactly (sorted)
    wrap_phi: bool  # an angle in [-pi, pi]: wrapped back into it
    unit: bool  # template values in [-1, 1]: clipped to it


def _jitter_specs(template: Template, plan: _Plan) -> tuple[dict[str, _JitterSpec], set[str]]:
    """Jitter rules of the plan's floating-point branches, learnt from the template's values;
    and the ``pt`` branches of collections whose objects the template sorts by decreasing pt."""
    arrays: dict[str, np.ndarray] = {}
    sort_descending: set[str] = set()
    for group in plan.groups:
        if isinstance(group, str):
            arrays[group] = template.scalars[group]
            continue
        for field, content in zip(group.fields, group.contents):
            arrays[group.branch(field)] = content
        if "pt" in group.fields:
            pt = group.contents[group.fields.index("pt")]
            offsets = group.offsets
            same_event = np.ones(max(len(pt) - 1, 0), bool)
            inner = offsets[(offsets > 0) & (offsets < len(pt))]
            same_event[inner - 1] = False  # pairs across an event boundary
            if pt.dtype.kind == "f" and np.all(np.diff(pt)[same_event] <= 0):
                sort_descending.add(group.branch("pt"))

    specs: dict[str, _JitterSpec] = {}
    for name, array in arrays.items():
        if array.dtype not in _MANTISSA:
            continue
        values = array.ravel()
        values = values[np.isfinite(values)]
        if values.size == 0:
            continue
        unique, counts = np.unique(values, return_counts=True)
        if len(unique) <= _DISCRETE_MAX_UNIQUE_FRACTION * values.size:
            continue  # discrete values (a constant mass, a grid of areas, weights +-w)
        threshold = max(_FREQUENT_MIN_COUNT, _FREQUENT_MIN_FRACTION * values.size)
        exact = unique[counts >= threshold]
        jittered = values[~np.isin(values, exact)] if exact.size else values
        jittered = jittered[jittered != 0]
        if jittered.size == 0:
            continue
        bits = max(int(_mantissa_bits(jittered).max()), _MIN_MANTISSA_BITS)
        lowest, highest = float(values.min()), float(values.max())
        wrap_phi = name.lower().endswith("phi") and -3.2 < lowest and highest < 3.2
        unit = -1.0 <= lowest and highest <= 1.0
        specs[name] = _JitterSpec(bits, exact, wrap_phi, unit)
    sort_descending &= set(specs)
    return specs, sort_descending


class _Jitter:
    """Jitter of one file: ``apply`` multiplies the values of a branch by 1 + N(0, sigma)."""

    def __init__(
        self,
        sigma: float,
        seed: int,
        file_index: int,
        specs: dict[str, _JitterSpec],
        sort_descending: set[str],
    ):
        self.sigma = sigma
        self.specs = specs
        self.sort_descending = sort_descending
        self.keys = {
            name: int.from_bytes(
                hashlib.blake2b(f"{seed}/{file_index}/{name}".encode(), digest_size=8).digest(),
                "little",
            )
            for name in specs
        }

    def touches(self, coll: _Collection) -> bool:
        return any(b in self.specs for b in coll.branches)

    def apply(self, name: str, values: np.ndarray, counters: np.ndarray) -> np.ndarray:
        """``values`` (a fresh array, changed in place) jittered; ``counters`` identify them."""
        spec = self.specs.get(name)
        if spec is None or values.size == 0:
            return values
        flat = values.reshape(-1)  # a view: values is contiguous
        todo = np.isfinite(flat)
        todo &= flat != 0
        if spec.exact.size:
            todo &= ~np.isin(flat, spec.exact)
        where = np.flatnonzero(todo)
        if where.size == 0:
            return values
        z = _normal(self.keys[name], counters.reshape(-1)[where])
        new = flat[where].astype(np.float64)
        new *= 1.0 + self.sigma * z
        if spec.wrap_phi:
            new[new > np.pi] -= 2.0 * np.pi
            new[new < -np.pi] += 2.0 * np.pi
        if spec.unit:
            np.clip(new, -1.0, 1.0, out=new)
        flat[where] = _round_mantissa(new.astype(values.dtype), spec.bits)
        return values
