"""The admission policy's node-wide scalars as ``admission_state`` holds them (``admitter.Admitter``):
the ``state`` row (the policy's ``scalars()`` as compact JSON) and the ``writers`` row (the
node's processes that save, JSON), encoded and decoded by one process.

Every write transaction of the node saves the state, and every process whose last read is
older than another process's save reads it again. What a state holds grows as the node works:
its ``reuses`` window fills up to the policy's ``window`` sampled reuse distances (63) after
the second run, so the row is ~1 KB, and on a node of several processes every insert
transaction re-read and re-wrote it (measured, 63 whole-number floats: ``json.dumps`` 20 µs,
``json.loads`` 10 µs). The window and the parameters change rarely (a sampled key looked up
again; never), so :class:`StateRows` keeps their JSON from the last time and encodes or
decodes only the rest; what it returns is what ``json.dumps(st, separators=(",", ":"))`` and
``json.loads`` give (the row's format is unchanged: earlier versions read it).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SEPARATORS", "StateRows"]

#: The state row's JSON separators (compact), as every version wrote it.
SEPARATORS = (",", ":")
#: Where the window's JSON starts in a state row: a key of the top-level object (inside a JSON
#: string a quote is escaped, so this text occurs only as a key).
_REUSES = '"reuses":['


class StateRows:
    """Encode and decode the ``state`` and ``writers`` rows, keeping what did not change."""

    __slots__ = ("_params", "_reuses_out", "_reuses_in", "_writers_in")

    def __init__(self) -> None:
        self._params: tuple[dict, str] | None = None  # parameters, their JSON
        self._reuses_out: tuple[tuple, str] | None = None  # window written, its JSON
        self._reuses_in: tuple[str, list] | None = None  # window read: its JSON, its values
        self._writers_in: tuple[str, dict] | None = None  # writers row read, its values

    def encode(self, scalars: dict[str, Any]) -> str:
        """``json.dumps(scalars, separators=SEPARATORS)``, its parameters and window encoded
        only when they differ from the last call's (compared with ``==``: a value equal to the
        last one in another type, ``4`` for ``4.0``, keeps the last one's text; the policy's
        window holds floats and its parameters never change)."""
        params, reuses = scalars.get("params"), scalars.get("reuses")
        if not isinstance(params, dict) or not isinstance(reuses, list):
            return json.dumps(scalars, separators=SEPARATORS)
        if self._params is None or self._params[0] != params:
            self._params = (dict(params), json.dumps(params, separators=SEPARATORS))
        window = tuple(reuses)
        if self._reuses_out is None or self._reuses_out[0] != window:
            self._reuses_out = (window, json.dumps(reuses, separators=SEPARATORS))
        rest = dict(scalars)
        rest["params"] = rest["reuses"] = None  # top-level keys: each "key":null occurs once
        out = json.dumps(rest, separators=SEPARATORS)
        out = out.replace('"params":null', '"params":' + self._params[1], 1)
        return out.replace('"reuses":null', '"reuses":' + self._reuses_out[1], 1)

    def decode(self, raw: str) -> Any:
        """``json.loads(raw)`` (raises as it does), the window parsed again only when its text
        differs from the last row's."""
        cached = self._reuses_in
        i = raw.find(_REUSES)
        if i >= 0:
            start = i + len(_REUSES) - 1
            end = raw.find("]", start) + 1
            text = raw[start:end] if end > 0 else None
            if cached is not None and text == cached[0]:
                try:
                    st = json.loads(raw[:start] + "null" + raw[end:])
                except ValueError:
                    st = None
                if isinstance(st, dict) and "reuses" in st and st["reuses"] is None:
                    st["reuses"] = list(cached[1])
                    return st
        st = json.loads(raw)
        if i >= 0 and text is not None and isinstance(st, dict) and isinstance(st.get("reuses"), list):
            try:
                same = json.loads(text) == st["reuses"]  # the text found is the window's
            except ValueError:
                same = False
            if same:
                self._reuses_in = (text, list(st["reuses"]))
        return st

    def writers(self, raw: str) -> dict[str, float]:
        """The ``writers`` row as ``{token: clock}`` (raises ``TypeError``, ``ValueError`` or
        ``AttributeError`` for a row that is not such an object), parsed only when it changed."""
        cached = self._writers_in
        if cached is not None and cached[0] == raw:
            return dict(cached[1])
        out = {str(k): float(v) for k, v in json.loads(raw).items()}
        self._writers_in = (raw, dict(out))
        return out
