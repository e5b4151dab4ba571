"""Histograms and min/median/max of a column, computed in SQL (no per-item Python objects).

Contract: :func:`binned` counts the rows of ``source WHERE where`` by the first bin whose upper
bound exceeds ``expr`` (the last bin takes the rest) and returns every bin label in order,
zeros included. :func:`stats` returns ``{"min", "median", "max"}`` of a numeric expression
(all None without rows); the median of an even count is the mean of the two middle values,
an int when it is whole.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

Bins = tuple[tuple[str, float], ...]

SHORT_SIDE_BINS: Bins = (
    ("<64", 64), ("64-127", 128), ("128-255", 256), ("256-511", 512), ("512-1023", 1024),
    ("1024-2047", 2048), (">=2048", math.inf))
ASPECT_BINS: Bins = (
    ("<0.5", 0.5), ("0.5-0.75", 0.75), ("0.75-0.9", 0.9), ("0.9-1.1", 1.1), ("1.1-1.33", 1.33),
    ("1.33-1.8", 1.8), ("1.8-2.5", 2.5), (">=2.5", math.inf))


def _case(expr: str, bins: Bins) -> str:
    whens = " ".join(f"WHEN {expr} < {upper!r} THEN '{label}'" for label, upper in bins[:-1])
    return f"CASE {whens} ELSE '{bins[-1][0]}' END"


def binned(db: sqlite3.Connection, source: str, where: str, expr: str, bins: Bins) -> dict[str, int]:
    counts = dict(db.execute(f"SELECT {_case(expr, bins)} AS b, COUNT(*) FROM {source} WHERE {where} GROUP BY b"))
    return {label: counts.get(label, 0) for label, _ in bins}


def stats(db: sqlite3.Connection, source: str, where: str, expr: str) -> dict[str, Any]:
    n, lo, hi = db.execute(f"SELECT COUNT(*), MIN({expr}), MAX({expr}) FROM {source} WHERE {where}").fetchone()
    if not n:
        return {"min": None, "median": None, "max": None}
    middle = [db.execute(f"SELECT {expr} FROM {source} WHERE {where} ORDER BY 1 LIMIT 1 OFFSET ?", (k,)).fetchone()[0]
              for k in ((n - 1) // 2, n // 2)]
    m = sum(middle) / 2
    return {"min": lo, "median": int(m) if m == int(m) else m, "max": hi}
