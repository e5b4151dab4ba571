"""Which planned items an image output would write: the ``usable`` view.

Contract: after :func:`~shardsmith.scan.decode_check.decode_all`, :func:`define_usable` creates
the temporary view ``usable`` (the ``items`` columns) over the items whose plan status is ``ok``
(so not an extra copy when ``split.dedup`` is on), that are images, decode, and whose upright
shorter side is at least ``images.min_size``. Their splits are the planner's.
"""

from __future__ import annotations

import sqlite3

#: an upright shorter side below ``min_size`` is skipped:too_small by the sample makers
SHORT_SIDE = "MIN(d.width, d.height)"


def define_usable(db: sqlite3.Connection, min_size: int) -> None:
    db.execute("CREATE TEMP VIEW usable AS SELECT i.* FROM items i JOIN decoded d ON d.idx = i.idx "
               f"WHERE i.plan_status = 'ok' AND i.kind = 'image' AND d.status = 'ok' "
               f"AND {SHORT_SIDE} >= {int(min_size)}")
