"""Split assignment: a pure function of (item id, seed), fixed before anything is derived.

Each item id maps to ``u`` in [0, 1) through sha256; with a fraction ``f`` an item is held
out iff ``u < f`` (adding items never moves existing ones). With a count ``n`` the ``n``
usable items of smallest ``u`` are held out. Exact duplicates take the split of the first
copy, so the same bytes never sit on both sides.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable

TRAIN, HOLDOUT = "train", "holdout"


def split_u(item_id: str, seed: int) -> float:
    # surrogatepass: the same bytes as UTF-8 for every valid id, and an id with a surrogate (sources spell such
    # names with \xNN, but an API caller may not) still hashes deterministically instead of raising
    digest = hashlib.sha256(f"{seed}\x00{item_id}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def by_fraction(item_id: str, seed: int, fraction: float) -> str:
    return split_of_u(split_u(item_id, seed), fraction)


def split_of_u(u: float, fraction: float) -> str:
    """The split of an item whose hash value is ``u`` (for duplicates: the first copy's ``u``)."""
    return HOLDOUT if fraction > 0 and u < fraction else TRAIN


def count_threshold(item_ids: Iterable[str], seed: int, n: int) -> float:
    """The ``u`` at or below which exactly the ``n`` smallest of ``item_ids`` fall (-1 if n == 0)."""
    if n <= 0:
        return -1.0
    smallest = heapq.nsmallest(n, (split_u(i, seed) for i in item_ids))
    return smallest[-1] if smallest else -1.0


def by_threshold(item_id: str, seed: int, threshold: float) -> str:
    return HOLDOUT if split_u(item_id, seed) <= threshold else TRAIN
