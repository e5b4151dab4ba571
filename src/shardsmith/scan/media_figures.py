"""The scan report's video, audio and bucket-fit figures, as SQL over the ``clips`` table.

Contract: :func:`videos` / :func:`audio` return the histograms (every bin, zeros included) and
min/median/max of the probed clips (``sampled`` says how many clips the probe left out, see
:mod:`shardsmith.scan.media`); :func:`bucket_fit` returns, per bucket, the items a build writes into it
with one output of the recipe and, per reason, the items it skips (``too_short`` ...), for the items
the plan passed (:mod:`shardsmith.scan.takes` decided them).
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from shardsmith.scan.histograms import SHORT_SIDE_BINS, Bins, binned, stats

FRAMES_BINS: Bins = (("<9", 9), ("9-16", 17), ("17-32", 33), ("33-64", 65), ("65-128", 129), ("129-256", 257),
                     ("257-512", 513), (">512", math.inf))
DURATION_BINS: Bins = (("<1s", 1), ("1-2s", 2), ("2-5s", 5), ("5-10s", 10), ("10-30s", 30), ("30-60s", 60),
                       ("1-5min", 300), (">=5min", math.inf))
#: resolutions listed one by one; the rest are summed as "other"
TOP_RESOLUTIONS = 12
#: item ids listed per bucket / reason in the report (all are in --json up to this many)
MAX_IDS = 50


def _categorical(db: sqlite3.Connection, expr: str, where: str, top: int | None = None) -> dict[str, int]:
    rows = db.execute(f"SELECT {expr} AS v, COUNT(*) AS n FROM clips WHERE {where} AND {expr} IS NOT NULL "
                      "GROUP BY v ORDER BY n DESC, v").fetchall()
    out = {_fmt(v): n for v, n in (rows[:top] if top else rows)}
    if top and len(rows) > top:
        out["other"] = sum(n for _, n in rows[top:])
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def videos(db: sqlite3.Connection, left_out: int) -> dict[str, Any]:
    ok = "kind = 'video' AND status = 'ok'"
    n = db.execute(f"SELECT COUNT(*) FROM clips WHERE {ok}").fetchone()[0]
    failed = db.execute("SELECT COUNT(*) FROM clips WHERE kind = 'video' AND status != 'ok'").fetchone()[0]
    out: dict[str, Any] = {"count": n, "unreadable": failed, "sampled_out": left_out}
    if not n:
        return out
    out.update(
        frames=binned(db, "clips", ok, "frames", FRAMES_BINS),
        fps=_categorical(db, "ROUND(fps, 2)", ok),
        duration=binned(db, "clips", ok, "duration", DURATION_BINS),
        resolution=_categorical(db, "width || 'x' || height", ok, TOP_RESOLUTIONS),
        short_side=binned(db, "clips", ok, "MIN(width, height)", SHORT_SIDE_BINS),
        frames_stats=stats(db, "clips", ok, "frames"),
        fps_stats=stats(db, "clips", ok, "fps"),
        duration_stats={k: None if v is None else round(v, 3)
                        for k, v in stats(db, "clips", ok, "duration").items()},
        with_audio=db.execute(f"SELECT COUNT(*) FROM clips WHERE {ok} AND has_audio").fetchone()[0],
        rotated=db.execute(f"SELECT COUNT(*) FROM clips WHERE {ok} AND rotation != 0").fetchone()[0],
    )
    return out


def audio(db: sqlite3.Connection) -> dict[str, Any]:
    """Audio files and the audio tracks of clips, together (``files`` / ``tracks`` say how many of each)."""
    ok = "status = 'ok' AND audio_rate IS NOT NULL"
    n = db.execute(f"SELECT COUNT(*) FROM clips WHERE {ok}").fetchone()[0]
    out: dict[str, Any] = {
        "count": n,
        "files": db.execute(f"SELECT COUNT(*) FROM clips WHERE {ok} AND kind = 'audio'").fetchone()[0],
        "tracks": db.execute(f"SELECT COUNT(*) FROM clips WHERE {ok} AND kind = 'video'").fetchone()[0],
        "unreadable": db.execute("SELECT COUNT(*) FROM clips WHERE kind = 'audio' AND status != 'ok'").fetchone()[0],
    }
    if n:
        out.update(sample_rate=_categorical(db, "audio_rate", ok), channels=_categorical(db, "audio_channels", ok),
                   duration=binned(db, "clips", f"{ok} AND audio_duration IS NOT NULL", "audio_duration",
                                   DURATION_BINS),
                   duration_stats={k: None if v is None else round(v, 3) for k, v in
                                    stats(db, "clips", f"{ok} AND audio_duration IS NOT NULL",
                                          "audio_duration").items()})
    return out


def fit_rows(db: sqlite3.Connection, output: str):
    """``(idx, item_id, split, kind, status, detail, bucket, info)`` of the plan's ``ok`` items that scan decided
    for ``output`` (:mod:`shardsmith.scan.takes`), in plan order; ``bucket`` / ``info`` where it cuts the item
    to a bucket."""
    return db.execute(
        "SELECT i.idx, i.item_id, i.split, i.kind, r.status, r.detail, f.bucket, f.info FROM results r "
        "JOIN items i ON i.idx = r.idx LEFT JOIN fits f ON f.output = r.output AND f.idx = r.idx "
        "WHERE r.output = ? AND i.plan_status = 'ok' ORDER BY i.idx", (output,)).fetchall()


#: statuses the bucket table leaves out: an item the output never looks at, or a split it does not write
_NOT_FITTED = ("skipped:unsupported_kind_", "skipped:holdout")

_KIND_COLUMN = {"video": "videos", "image": "images", "audio": "audio"}


def bucket_fit(db: sqlite3.Connection, output: str, buckets: list[str]) -> dict[str, Any]:
    """``{"output": name, "buckets": {bucket: {count, videos, images, audio, items}}, "skipped": {status:
    {count, items, detail}}}``: the items ``output`` writes into each bucket and, per reason, those it skips
    (``too_short`` ...). Failures are problems (the report's ``problems``), not rows here."""
    def empty() -> dict[str, Any]:
        return {"count": 0, "videos": 0, "images": 0, "audio": 0, "items": []}

    per: dict[str, dict[str, Any]] = {b: empty() for b in buckets}
    skipped: dict[str, dict[str, Any]] = {}
    for _, item_id, _, kind, status, detail, bucket, _ in fit_rows(db, output):
        if status == "written":
            b = per.setdefault(bucket or "-", empty())
            b["count"] += 1
            b[_KIND_COLUMN.get(kind, "images")] += 1
            if len(b["items"]) < MAX_IDS:
                b["items"].append(item_id)
        elif status.startswith("skipped:") and not status.startswith(_NOT_FITTED):
            s = skipped.setdefault(status, {"count": 0, "items": [], "detail": detail})
            s["count"] += 1
            if len(s["items"]) < MAX_IDS:
                s["items"].append(item_id)
    return {"output": output, "buckets": per, "skipped": skipped}
