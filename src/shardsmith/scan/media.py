"""Scan's probe of video clips and audio files, and each clip's bucket under the recipe.

The planner hashes a clip but does not open it (only image headers are read at plan time); a
build probes a clip with :func:`~shardsmith.transform.video.probe_video` in its worker processes
when it makes the sample. Scan does the same probe now, in worker processes
(:class:`~shardsmith.parallel.Workers`, one clip per task), and for a recipe with latent outputs
asks the build's own :class:`~shardsmith.transform.latent_pixels.LatentPixelMaker` which bucket
each clip and each image takes (``video_geometry`` / ``image_geometry``: the decision a build
makes, not a copy of it).

Contract
- :func:`probe_all` writes one ``clips`` row per probed ``video`` / ``audio`` item whose bytes the
  plan read (``sha256`` set), into the dry run's throwaway database. With more such items than
  ``max_probe`` it probes a deterministic sample of ``max_probe`` of them (the smallest
  sha256 of the item id first, as the size estimate samples) and returns how many it left out;
  the histograms then describe the sample and say so.
- A clip's row: probe status (``ok`` or the probe's ``failed:<reason>``), frames, fps, duration,
  displayed size, rotation, its first audio stream's rate / channels / duration; with a maker,
  ``fit`` (``ok``, ``skipped:too_short`` ...), the bucket and the sample ``info`` a build records.
- :func:`fit_images` writes the same ``fit`` facts into ``image_fit`` for every decoded image
  (upright size from scan's decode check), when the recipe has latent outputs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from shardsmith.plan.ledger import Ledger
from shardsmith.records import ItemError, PlannedItem

_SCHEMA = """
CREATE TABLE clips (
    idx INTEGER PRIMARY KEY,  -- items.idx
    kind TEXT NOT NULL,  -- 'video' or 'audio'
    status TEXT NOT NULL,  -- 'ok' or 'failed:<reason>'
    detail TEXT,
    frames INTEGER, fps REAL, duration REAL, width INTEGER, height INTEGER, rotation INTEGER, codec TEXT,
    has_audio INTEGER, audio_rate INTEGER, audio_channels INTEGER, audio_duration REAL,
    fit TEXT,  -- with latent outputs: 'ok' or the maker's 'skipped:<reason>' / 'failed:<reason>'
    fit_detail TEXT,
    bucket TEXT,
    info TEXT  -- JSON: the sample info a build records (bucket, fps, crop, source size / frames / fps)
);
CREATE TABLE image_fit (idx INTEGER PRIMARY KEY, fit TEXT NOT NULL, fit_detail TEXT, bucket TEXT, info TEXT);
"""

_COLS = ("idx", "kind", "status", "detail", "frames", "fps", "duration", "width", "height", "rotation", "codec",
         "has_audio", "audio_rate", "audio_channels", "audio_duration", "fit", "fit_detail", "bucket", "info")

#: clips probed at most; more are sampled (deterministically) for the histograms and the fit table
MAX_PROBE = 2000


@dataclass
class Clip:
    idx: int
    kind: str
    status: str = "ok"
    detail: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def row(self) -> tuple:
        return (self.idx, self.kind, self.status, self.detail, *(self.facts.get(c) for c in _COLS[4:]))


def audio_facts(path: str) -> dict[str, Any] | None:
    """``{audio_rate, audio_channels, audio_duration}`` of the first audio stream (PyAV), None without one."""
    import av

    with av.open(path) as c:
        if not c.streams.audio:
            return None
        s = c.streams.audio[0]
        cc = s.codec_context
        dur = float(s.duration * s.time_base) if s.duration and s.time_base else None
        if dur is None and c.duration:
            dur = c.duration / 1_000_000
        channels = getattr(cc, "channels", None) or (cc.layout.nb_channels if cc.layout else None)
        return {"audio_rate": int(cc.sample_rate or s.rate or 0) or None, "audio_channels": channels,
                "audio_duration": dur}


def fit_info(geom, frames: int | None = None, fps: float | None = None) -> dict[str, Any]:
    """The sample info a latent maker records for this geometry (what the build's json holds)."""
    w, h = geom.source_size
    info = {"bucket": str(geom.bucket), "fps": geom.fps, "crop": geom.resize_crop.as_dict(),
            "source_size": [w, h], "source_frames": frames if frames is not None else 1}
    if fps is not None:
        info["source_fps"] = fps
    return info


class ClipProber:
    """Probe one clip or audio file (and fit a clip to the maker's buckets); picklable for workers."""

    def __init__(self, maker=None):
        self.maker = maker

    @staticmethod
    def is_heavy(item: PlannedItem) -> bool:
        """A clip's probe demuxes and decodes a frame: one clip per task. An audio file's reads its header
        (milliseconds): in chunks, as the build sends audio files (``LatentPixelMaker.is_heavy``)."""
        return item.kind != "audio"

    def __call__(self, item: PlannedItem) -> Clip:
        from shardsmith.transform.video import probe_video

        clip = Clip(item.idx, item.kind)
        try:
            if item.kind == "audio":
                facts = audio_facts(item.path)
                if facts is None:
                    raise ItemError("no_audio_stream", f"{item.item_id} has no audio stream")
                clip.facts.update(facts, duration=facts["audio_duration"])
                return clip
            pr = probe_video(item.path, item.item_id)
        except ItemError as e:
            clip.status, clip.detail = e.status, e.detail
            return clip
        except Exception as e:  # noqa: BLE001 - any decoder crash is this item's problem
            clip.status, clip.detail = "failed:unreadable", f"{item.item_id} cannot be probed: {e}"
            return clip
        clip.facts.update(frames=pr.frames, fps=pr.fps, duration=pr.duration, width=pr.width, height=pr.height,
                          rotation=pr.rotation, codec=pr.codec, has_audio=int(pr.has_audio),
                          audio_rate=pr.audio_rate, audio_channels=pr.audio_channels)
        if pr.has_audio:
            try:
                clip.facts.update((audio_facts(item.path) or {}), audio_rate=pr.audio_rate or None)
            except Exception:  # noqa: BLE001 - the video facts stand without the track's duration
                pass
        if self.maker is not None:
            try:
                geom = self.maker.video_geometry(item, pr)
                clip.facts.update(fit="ok", bucket=str(geom.bucket),
                                  info=json.dumps(fit_info(geom, pr.frames, pr.fps)))
            except ItemError as e:
                clip.facts.update(fit=e.status, fit_detail=e.detail)
        return clip


def _sample_rank(item_id: str) -> bytes:
    import hashlib

    return hashlib.sha256(item_id.encode("utf-8")).digest()[:8]


def probe_all(ledger: Ledger, maker=None, *, workers: int = 1, max_probe: int = MAX_PROBE,
              on_total=None, tick=None) -> tuple[int, int]:
    """Fill ``clips`` (see the module); returns ``(probed, left_out)``. ``on_total(n)`` is told how
    many clips will be probed before the first is; ``tick()`` runs after each."""
    from shardsmith.parallel import Workers

    db = ledger.db
    db.executescript(_SCHEMA)
    where = "kind IN ('video', 'audio') AND sha256 IS NOT NULL"
    total = db.execute(f"SELECT COUNT(*) FROM items WHERE {where}").fetchone()[0]
    if total > max_probe:
        db.create_function("sample_rank", 1, _sample_rank, deterministic=True)
        idxs = sorted(r[0] for r in db.execute(
            f"SELECT idx FROM items WHERE {where} ORDER BY sample_rank(item_id), idx LIMIT ?", (max_probe,)))
    else:
        idxs = [r[0] for r in db.execute(f"SELECT idx FROM items WHERE {where} ORDER BY idx")]
    if on_total is not None:
        on_total(len(idxs))
    if not idxs:
        return 0, 0
    pool = Workers(max(1, min(workers, len(idxs))))
    try:
        items = (next(ledger.items(idx_range=(i, i + 1))) for i in idxs)
        rows = []
        for _, clip in pool.map(ClipProber(maker), items):
            rows.append(clip.row())
            if tick is not None:
                tick()
            if len(rows) >= 256:
                _insert(ledger, rows)
                rows = []
        _insert(ledger, rows)
    finally:
        pool.close()
    return len(idxs), total - len(idxs)


def _insert(ledger: Ledger, rows: list[tuple]) -> None:
    if rows:
        with ledger.transaction():
            ledger.db.executemany(f"INSERT INTO clips ({','.join(_COLS)}) VALUES ({','.join('?' * len(_COLS))})",
                                  rows)


def fit_images(ledger: Ledger, maker) -> None:
    """``image_fit`` rows for every decoded image (the build's image bucket decision)."""
    rows = []
    for idx, w, h in ledger.db.execute("SELECT idx, width, height FROM decoded WHERE status = 'ok' ORDER BY idx"):
        item = next(ledger.items(idx_range=(idx, idx + 1)))
        try:
            geom = maker.image_geometry(item, w, h)
            rows.append((idx, "ok", None, str(geom.bucket), json.dumps(fit_info(geom))))
        except ItemError as e:
            rows.append((idx, e.status, e.detail, None, None))
    with ledger.transaction():
        ledger.db.executemany("INSERT INTO image_fit VALUES (?,?,?,?,?)", rows)


def workers_default() -> int:
    return min(8, os.cpu_count() or 2)
