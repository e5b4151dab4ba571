"""Scan's probe of video clips and audio files, and each clip's bucket under the recipe.

The planner hashes a clip but does not open it (only image headers are read at plan time); a
build probes a clip with :func:`~shardsmith.transform.video.probe_video` in its worker processes
when it makes the sample. Scan does the same probe now, in worker processes
(:class:`~shardsmith.parallel.Workers`, one clip per task), and asks each output that takes clips or
audio files what it would do with the item (:mod:`shardsmith.scan.takes`: the output's own maker's
decision, not a copy of it).

Contract
- :func:`probe_all` writes one ``clips`` row per probed ``video`` / ``audio`` item whose bytes the
  plan read (``sha256`` set), into the dry run's throwaway database. With more such items than
  ``max_probe`` it probes a deterministic sample of ``max_probe`` of them (the smallest
  sha256 of the item id first, as the size estimate samples) and returns how many it left out;
  the histograms then describe the sample and say so.
- A clip's row: probe status (``ok`` or the probe's ``failed:<reason>``), frames, fps, duration,
  displayed size, rotation, its first audio stream's rate / channels / duration. Each probing decider's
  verdict on the item goes into the ledger's ``results`` (and ``fits``: its bucket and sample info), as
  :func:`shardsmith.scan.takes.record` writes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from shardsmith.plan.ledger import Ledger
from shardsmith.records import ItemError, PlannedItem
from shardsmith.scan.takes import FITS_SCHEMA, Decider, Verdict, record

_SCHEMA = """
CREATE TABLE clips (
    idx INTEGER PRIMARY KEY,  -- items.idx
    kind TEXT NOT NULL,  -- 'video' or 'audio'
    status TEXT NOT NULL,  -- 'ok' or 'failed:<reason>'
    detail TEXT,
    frames INTEGER, fps REAL, duration REAL, width INTEGER, height INTEGER, rotation INTEGER, codec TEXT,
    has_audio INTEGER, audio_rate INTEGER, audio_channels INTEGER, audio_duration REAL
);
"""

_COLS = ("idx", "kind", "status", "detail", "frames", "fps", "duration", "width", "height", "rotation", "codec",
         "has_audio", "audio_rate", "audio_channels", "audio_duration")

#: clips probed at most; more are sampled (deterministically) for the histograms and the fit table
MAX_PROBE = 2000


@dataclass
class Clip:
    idx: int
    kind: str
    status: str = "ok"
    detail: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    verdicts: list[tuple[str, Verdict]] = field(default_factory=list)  # (output, its verdict on the item)

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


class ClipProber:
    """Probe one clip or audio file and give each probing decider's verdict on it; picklable for workers."""

    def __init__(self, deciders: list[Decider] | tuple[Decider, ...] = ()):
        self.deciders = list(deciders)

    @staticmethod
    def is_heavy(item: PlannedItem) -> bool:
        """A clip's probe demuxes and decodes a frame: one clip per task. An audio file's reads its header
        (milliseconds): in chunks, as the build sends audio files (``LatentPixelMaker.is_heavy``)."""
        return item.kind != "audio"

    def __call__(self, item: PlannedItem) -> Clip:
        clip = self._probe(item)
        probe = clip.facts.pop("_probe", None)
        decided: dict[tuple, Verdict] = {}  # outputs that decide alike decide once
        for d in self.deciders:
            if not d.takes(item):
                continue
            if d.key not in decided:
                try:
                    decided[d.key] = d.media(item, probe)
                except ItemError as e:
                    decided[d.key] = Verdict(e.status, e.detail)
                except Exception as e:  # noqa: BLE001 - any decoder crash is this item's problem
                    decided[d.key] = Verdict("failed:unreadable", f"{item.item_id} cannot be read: {e}")
            clip.verdicts.append((d.output, decided[d.key]))
        return clip

    def _probe(self, item: PlannedItem) -> Clip:
        """The item's facts; ``facts["_probe"]``: a clip's :class:`~shardsmith.transform.video.VideoProbe`, or
        the :class:`ItemError` its probe raised (what the deciders take)."""
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
            clip.facts["_probe"] = e
            return clip
        except Exception as e:  # noqa: BLE001 - any decoder crash is this item's problem
            clip.status, clip.detail = "failed:unreadable", f"{item.item_id} cannot be probed: {e}"
            clip.facts["_probe"] = ItemError("unreadable", clip.detail)
            return clip
        clip.facts.update(frames=pr.frames, fps=pr.fps, duration=pr.duration, width=pr.width, height=pr.height,
                          rotation=pr.rotation, codec=pr.codec, has_audio=int(pr.has_audio),
                          audio_rate=pr.audio_rate, audio_channels=pr.audio_channels, _probe=pr)
        if pr.has_audio:
            try:
                clip.facts.update((audio_facts(item.path) or {}), audio_rate=pr.audio_rate or None)
            except Exception:  # noqa: BLE001 - the video facts stand without the track's duration
                pass
        return clip


def _sample_rank(item_id: str) -> bytes:
    import hashlib

    return hashlib.sha256(item_id.encode("utf-8")).digest()[:8]


def probe_all(ledger: Ledger, deciders: list[Decider] | tuple[Decider, ...] = (), *, workers: int = 1,
              max_probe: int = MAX_PROBE, on_total=None, tick=None) -> tuple[int, int]:
    """Fill ``clips`` and the probing ``deciders``' results (see the module); returns ``(probed, left_out)``.
    ``on_total(n)`` is told how many clips will be probed before the first is; ``tick()`` runs after each."""
    from shardsmith.parallel import Workers

    db = ledger.db
    db.executescript(_SCHEMA)
    db.executescript(FITS_SCHEMA)
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
        rows, verdicts = [], []
        for _, clip in pool.map(ClipProber([d for d in deciders if d.probes]), items):
            rows.append(clip.row())
            verdicts += [(output, clip.idx, v) for output, v in clip.verdicts]
            if tick is not None:
                tick()
            if len(rows) >= 256:
                _insert(ledger, rows)
                record(ledger, verdicts)
                rows, verdicts = [], []
        _insert(ledger, rows)
        record(ledger, verdicts)
    finally:
        pool.close()
    return len(idxs), total - len(idxs)


def _insert(ledger: Ledger, rows: list[tuple]) -> None:
    if rows:
        with ledger.transaction():
            ledger.db.executemany(f"INSERT INTO clips ({','.join(_COLS)}) VALUES ({','.join('?' * len(_COLS))})",
                                  rows)


def workers_default() -> int:
    return min(8, os.cpu_count() or 2)
