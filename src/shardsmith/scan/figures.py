"""The scan report's figures, read from the dry run's ledger with SQL aggregates.

Contract: each function reads the ``items`` rows the planner wrote (and, for pictures, the
``decoded`` rows and the ``usable`` view) and returns one JSON-ready section of the report:

- :func:`sources`: per source, its declaration, item count and bytes read by the probe;
- :func:`licenses`: items per declared licence (``undeclared`` where none);
- :func:`kinds`: items per media kind;
- :func:`images`: every image that decodes (duplicate copies and items with a caption problem
  included): shorter-side and aspect histograms, width and height, PIL modes, formats, decode
  notes, how many are below ``images.min_size``;
- :func:`problems`: every item a build could not use, in plan order: the planner's status and
  detail (skipped duplicates excepted), else the first failure an output records for it (scan's
  ``results``), else the decode / probe failure of an item no output decided;
- :func:`not_taken`: items no output of the recipe takes (each skips it as a kind it does not take);
- :func:`duplicates`: the planner's exact-duplicate groups (first copy, then its copies);
- :func:`labels`, :func:`captions`: label and caption counts.

Ordering of ``most common`` counts: by count, then first appearance in plan order.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from shardsmith.records import SourceInfo
from shardsmith.scan.histograms import ASPECT_BINS, SHORT_SIDE_BINS, binned, stats
from shardsmith.scan.usable import SHORT_SIDE

KINDS = ("image", "video", "audio", "other")
DECODED = "decoded d"
DECODED_OK = "d.status = 'ok'"
LABEL = "COALESCE(label_name, CAST(label AS TEXT))"  # a label's name, else its number


def sources(db: sqlite3.Connection, infos: list[SourceInfo]) -> dict[str, dict[str, Any]]:
    per = {s: (n, b) for s, n, b in db.execute("SELECT source, COUNT(*), COALESCE(SUM(size_bytes), 0) "
                                               "FROM items GROUP BY source")}
    return {info.name: {"path": info.path, "kind": info.kind, "origin": info.origin, "license": info.license,
                        "items": per.get(info.index, (0, 0))[0], "bytes": per.get(info.index, (0, 0))[1],
                        "labels": list(info.label_names) if info.label_names else None}
            for info in infos}


def licenses(srcs: dict[str, dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in srcs.values():
        if s["items"]:
            key = s["license"] or "undeclared"
            out[key] = out.get(key, 0) + s["items"]
    return dict(sorted(out.items()))


def kinds(db: sqlite3.Connection) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    out.update(db.execute("SELECT kind, COUNT(*) FROM items GROUP BY kind ORDER BY MIN(idx)"))
    return out


def _most_common(db: sqlite3.Connection, sql: str) -> dict[str, int]:
    """``sql`` selects (value, count, first position): counts by count, then first position."""
    return {v: n for v, n, _ in sorted(db.execute(sql), key=lambda r: (-r[1], r[2]))}


def images(db: sqlite3.Connection, min_size: int) -> dict[str, Any]:
    count = db.execute(f"SELECT COUNT(*) FROM {DECODED} WHERE {DECODED_OK}").fetchone()[0]
    below = db.execute(f"SELECT COUNT(*) FROM {DECODED} WHERE {DECODED_OK} AND {SHORT_SIDE} < ?",
                       (min_size,)).fetchone()[0]
    return {
        "count": count,
        "short_side": binned(db, DECODED, DECODED_OK, SHORT_SIDE, SHORT_SIDE_BINS),
        "aspect": binned(db, DECODED, DECODED_OK, "d.width * 1.0 / d.height", ASPECT_BINS),
        "width": stats(db, DECODED, DECODED_OK, "d.width"),
        "height": stats(db, DECODED, DECODED_OK, "d.height"),
        "modes": _most_common(db, f"SELECT d.mode, COUNT(*), MIN(d.idx) FROM {DECODED} WHERE {DECODED_OK} "
                                  "GROUP BY d.mode"),
        "formats": _most_common(db, f"SELECT COALESCE(d.format, 'unknown') AS f, COUNT(*), MIN(d.idx) "
                                    f"FROM {DECODED} WHERE {DECODED_OK} GROUP BY f"),
        "notes": _most_common(db, "SELECT note, COUNT(*), MIN(rowid) FROM decoded_notes GROUP BY note"),
        "min_size": min_size,
        "below_min_size": below,
    }


def problems(db: sqlite3.Connection, outputs: list[str] | None = None) -> list[dict[str, Any]]:
    """Every item a build could not use, in plan order: the planner's status and detail (skipped duplicates
    excepted); else the first failure an output of ``outputs`` (recipe order) would record for it (scan's
    ``results``, :mod:`shardsmith.scan.takes`); else, for an item no output decided, its decode or probe
    failure."""
    rank = {name: i for i, name in enumerate(outputs or [])}
    failed: dict[int, tuple[int, str, str | None]] = {}
    for idx, output, status, detail in db.execute(
            "SELECT r.idx, r.output, r.status, r.detail FROM results r JOIN items i ON i.idx = r.idx "
            "WHERE i.plan_status = 'ok' AND r.status LIKE 'failed:%'"):
        key = rank.get(output, len(rank))
        if idx not in failed or key < failed[idx][0]:
            failed[idx] = (key, status, detail)
    rows = db.execute(
        "SELECT i.idx, i.item_id, i.path, i.plan_status, i.detail, COALESCE(d.status, c.status), "
        "COALESCE(d.detail, c.detail), EXISTS (SELECT 1 FROM results r WHERE r.idx = i.idx) "
        "FROM items i LEFT JOIN decoded d ON d.idx = i.idx LEFT JOIN clips c ON c.idx = i.idx "
        "WHERE i.plan_status NOT IN ('ok', 'skipped:duplicate') OR (i.plan_status = 'ok' AND ("
        "  EXISTS (SELECT 1 FROM results r WHERE r.idx = i.idx AND r.status LIKE 'failed:%') OR "
        "  (COALESCE(d.status, c.status) != 'ok' AND NOT EXISTS (SELECT 1 FROM results r WHERE r.idx = i.idx)))) "
        "ORDER BY i.idx")
    out = []
    for idx, item_id, path, plan_status, plan_detail, media_status, media_detail, decided in rows:
        if plan_status != "ok":
            status, detail = plan_status, plan_detail
        elif idx in failed:
            _, status, detail = failed[idx]
        elif not decided and media_status not in (None, "ok"):
            status, detail = media_status, media_detail
        else:
            continue
        out.append({"id": item_id, "path": path, "status": status, "detail": detail})
    return out


def not_taken(db: sqlite3.Connection) -> dict[str, int]:
    """Planned items, by kind, that every output deciding them skips as a kind it does not take."""
    return dict(db.execute(
        "SELECT i.kind, COUNT(*) FROM items i WHERE i.plan_status = 'ok' "
        "AND EXISTS (SELECT 1 FROM results r WHERE r.idx = i.idx) "
        "AND NOT EXISTS (SELECT 1 FROM results r WHERE r.idx = i.idx "
        "                AND r.status NOT LIKE 'skipped:unsupported_kind_%') "
        "GROUP BY i.kind ORDER BY MIN(i.idx)"))


def problem_counts(probs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in probs:
        out[p["status"]] = out.get(p["status"], 0) + 1
    return dict(sorted(out.items()))


def duplicates(db: sqlite3.Connection, dedup: bool) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}  # first copy -> group, in the order their first extra copy comes
    rows = db.execute("SELECT c.dup_of, c.item_id, f.sha256, f.size_bytes FROM items c "
                      "JOIN items f ON f.item_id = c.dup_of ORDER BY c.idx")
    n = 0
    for first, copy, sha, size in rows:
        n += 1
        groups.setdefault(first, {"sha256": sha, "bytes": size or 0, "items": [first]})["items"].append(copy)
    return {"groups": list(groups.values()), "duplicate_items": n, "dedup": dedup}


def labels(db: sqlite3.Connection) -> tuple[dict[str, int] | None, dict[str, int] | None]:
    """(items per label, usable images per label); both None when no item has a label."""
    every = dict(db.execute(f"SELECT {LABEL} AS l, COUNT(*) FROM items WHERE l IS NOT NULL GROUP BY l ORDER BY l"))
    if not every:
        return None, None
    usable = dict(db.execute(f"SELECT {LABEL} AS l, COUNT(*) FROM usable WHERE l IS NOT NULL GROUP BY l ORDER BY l"))
    return every, usable


def captions(db: sqlite3.Connection) -> dict[str, int]:
    db.create_function("blank", 1, lambda s: s is not None and not s.strip(), deterministic=True)
    with_, empty, without = db.execute("SELECT COUNT(caption), COALESCE(SUM(blank(caption)), 0), "
                                       "COUNT(*) - COUNT(caption) FROM items").fetchone()
    return {"with_caption": with_, "empty": empty, "without": without}
