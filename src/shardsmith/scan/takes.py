"""What each output of the recipe would do with each planned item, decided as a build decides it.

A build records, per output and item, one terminal status in its ledger's ``results`` table: the plan's
outcome for an item the plan did not pass, ``skipped:holdout`` for a split the output does not write, else
what the output's sample maker returns. Scan fills the same ``results`` rows of its throwaway ledger (and a
``fits`` table: the bucket and sample info of each item an output cuts to a bucket) without making the
samples: each output's own maker (:meth:`OutputKind.maker <shardsmith.outputs.base.OutputKind.maker>`) is
asked only for the decisions that need no pixels or encoder:

- image outputs (``wds``, ``zip``, ``latent_zip``): an item of another kind is the maker's
  ``skipped:unsupported_kind_<kind>``; a class-conditional ZIP's unlabelled image its ``skipped:no_label``
  (decided before any read); an image that does not decode, the transform's failure (scan's decode check);
  one below ``images.min_size``, the makers' ``skipped:too_small``; else written;
- latent outputs (``latent_wds``, ``precomputed``): an image's and a clip's bucket are the
  :class:`~shardsmith.transform.latent_pixels.LatentPixelMaker`'s ``image_geometry`` / ``video_geometry`` (and,
  where the output writes audio, the audio cutter's verdict on the clip's window or the image); an audio file
  is the maker's whole decision (the file's duration bucket, ``skipped:too_short``, an empty or undecodable
  file's failure: the waveform is decoded, nothing is encoded); a clip that does not probe fails as in a build;
- ``video_wds``: the :class:`~shardsmith.transform.video_samples.VideoSampleMaker`'s kind and caption checks,
  its probe, its bucket (buckets of more than one frame) and its audio member's window (``audio: wav|flac``);
  nothing is re-encoded;
- ``prompt_wds`` and ``kd_wds``: the prompt maker (a caption or ``skipped:no_caption``; opens no file).

Clips and audio files are decided in the probe's worker processes (:mod:`shardsmith.scan.media`) by the
deciders whose :attr:`Decider.probes` is set; the rest here, in plan order and bounded batches. A clip the
probe sampled out (``max_probe``) has no row: it is counted as not probed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import Recipe
from shardsmith.records import WRITTEN, ItemError, PlannedItem, SourceInfo
from shardsmith.split.assign import HOLDOUT

BATCH = 256

FITS_SCHEMA = """
CREATE TABLE IF NOT EXISTS fits (
    output TEXT NOT NULL,
    idx INTEGER NOT NULL,
    bucket TEXT,  -- the bucket a build writes the item into (a geometry bucket, or audio_<ms>ms)
    info TEXT,  -- JSON: the sample info a build records (bucket, fps, crop, source size / frames / fps)
    PRIMARY KEY (output, idx)
);
"""

#: statuses an output gives items it never looks at (not the data's fault)
NOT_TAKEN_PREFIX = "skipped:unsupported_kind_"


@dataclass(frozen=True)
class Verdict:
    status: str  # "written", "skipped:<reason>" or "failed:<reason>"
    detail: str | None = None
    bucket: str | None = None
    info: dict[str, Any] | None = None


def _of(err: ItemError) -> Verdict:
    return Verdict(err.status, err.detail)


def _of_result(res) -> Verdict:
    info = res.info or {}
    bucket = info.get("bucket")
    return Verdict(res.status, res.detail, bucket, info if bucket is not None else None)


def fit_info(geom, frames: int | None = None, fps: float | None = None) -> dict[str, Any]:
    """The sample info a latent maker records for this geometry (what the build's json holds)."""
    w, h = geom.source_size
    info = {"bucket": str(geom.bucket), "fps": geom.fps, "crop": geom.resize_crop.as_dict(),
            "source_size": [w, h], "source_frames": frames if frames is not None else 1}
    if fps is not None:
        info["source_fps"] = fps
    return info


class Decider:
    """One output's decision on each item (picklable: the probe's workers run :meth:`media`)."""

    #: whether video clips and audio files are decided in the probe's workers (:meth:`media`)
    probes = False

    def __init__(self, output: str, fmt: str, sources: list[int], splits: tuple[str, ...] | None, maker):
        self.output, self.format, self.sources, self.splits, self.maker = output, fmt, set(sources), splits, maker

    @property
    def key(self) -> tuple:
        """Deciders with the same key decide every item alike (one decision serves them all)."""
        return (self.output,)

    def takes(self, item: PlannedItem) -> bool:
        """Whether the item reaches this output's maker (planned ``ok``, of its sources and splits)."""
        return item.plan_status == "ok" and item.source in self.sources and \
            (self.splits is None or item.split in self.splits)

    def media(self, item: PlannedItem, probe) -> Verdict:
        """A clip (``probe``: its :class:`~shardsmith.transform.video.VideoProbe`, or the probe's
        :class:`ItemError`) or an audio file (``probe`` None), in a worker process."""
        return self.other(item, None)

    def other(self, item: PlannedItem, decoded: tuple | None) -> Verdict:
        """Any item not decided by :meth:`media`; ``decoded``: an image's ``(status, detail, width, height)``
        from scan's decode check (None for other kinds)."""
        return _of_result(self.maker(item))


class ImageDecider(Decider):
    def __init__(self, output, fmt, sources, splits, maker, rules):
        super().__init__(output, fmt, sources, splits, maker)
        self.rules = rules

    def other(self, item, decoded):
        from shardsmith.transform.samples import _check_min_size, _not_image

        try:
            if item.kind != "image":
                raise _not_image(item)
            if getattr(self.maker, "labelled", False) and item.label is None:
                self.maker.picture(item)  # the ZIP's label check comes before any read: skipped:no_label
            if decoded is None:
                return Verdict(WRITTEN)  # (not decoded: nothing known against it)
            status, detail, w, h = decoded
            if status != "ok":
                return Verdict(status, detail)
            _check_min_size(item, (w, h), self.rules)
        except ItemError as e:
            return _of(e)
        return Verdict(WRITTEN)


class LatentDecider(Decider):
    probes = True

    @property
    def key(self) -> tuple:
        return ("latent", self.maker.audio is not None, tuple(sorted(self.sources)), self.splits)

    def media(self, item, probe):
        m = self.maker
        if item.kind != "video":
            return _of_result(m(item))  # an audio file: the maker's own sample, decoded but not encoded
        try:
            if isinstance(probe, ItemError):
                raise probe
            geom = m.video_geometry(item, probe)
            detail = None
            if m.audio is not None:
                from shardsmith.transform.latent_pixels import no_audio

                _, audio = m.audio.for_clip(item, geom, probe.fps)
                detail = no_audio({"audio": audio})
        except ItemError as e:
            return _of(e)
        return Verdict(WRITTEN, detail, str(geom.bucket), fit_info(geom, probe.frames, probe.fps))

    def other(self, item, decoded):
        m = self.maker
        if item.kind != "image":
            return _of_result(m(item))  # (another kind: the maker's skip, no file opened)
        try:
            if not m.image_buckets:
                m.image_geometry(item, 0, 0)  # skipped:no_image_bucket, before any read
            if decoded is None:
                return Verdict(WRITTEN)
            status, detail, w, h = decoded
            if status != "ok":
                return Verdict(status, detail)
            geom = m.image_geometry(item, w, h)
            info = fit_info(geom)
            detail = None
            if m.audio is not None:
                from shardsmith.transform.latent_pixels import no_audio

                info["audio"] = m.audio.for_image(item)[1]
                detail = no_audio(info)
                del info["audio"]
        except ItemError as e:
            return _of(e)
        return Verdict(WRITTEN, detail, str(geom.bucket), info)


class VideoDecider(Decider):
    probes = True

    def media(self, item, probe):
        m = self.maker
        if item.kind != "video":
            return _of_result(m(item))  # skipped:unsupported_kind_<kind>, before any read
        try:
            m._caption(item)  # skipped:no_caption comes before the clip is opened
            if isinstance(probe, ItemError):
                raise probe
            geom = m.pixels.video_geometry(item, probe)
            if m.o.audio != "none" and probe.has_audio:
                m._sound(item, probe, geom)  # its audio member's window decodes (not kept)
        except ItemError as e:
            return _of(e)
        return Verdict(WRITTEN, None, str(geom.bucket), fit_info(geom, probe.frames, probe.fps))


def deciders(recipe: Recipe, ledger: Ledger, infos: list[SourceInfo]) -> list[Decider]:
    """One decider per output of ``recipe``, in recipe order, each around the output's own maker."""
    from shardsmith.outputs.base import OutputContext
    from shardsmith.outputs.latent import LatentKind
    from shardsmith.outputs.prompt_wds import PromptSampleMaker
    from shardsmith.outputs.registry import kind_of
    from shardsmith.outputs.video_wds import VideoWdsKind
    from shardsmith.outputs.wds import WdsKind
    from shardsmith.outputs.zip import ZipKind

    ctx = OutputContext(recipe, None, ledger, infos, None)
    out: list[Decider] = []
    for o in recipe.outputs:
        kind = kind_of(o)
        args = (o.name, o.format, recipe.source_ids(o), kind.splits(o, recipe))
        if isinstance(kind, (WdsKind, ZipKind)):
            out.append(ImageDecider(*args, kind.maker(o, ctx) if isinstance(kind, ZipKind) else None, recipe.images))
        elif isinstance(kind, LatentKind):
            out.append(LatentDecider(*args, kind.maker(o, ctx)))
        elif isinstance(kind, VideoWdsKind):
            out.append(VideoDecider(*args, kind.maker(o, ctx)))
        else:  # prompt_wds, kd_wds: an item's caption (kd_wds's teacher input is distill's to check)
            out.append(Decider(*args, PromptSampleMaker(o, infos)))
    return out


def record(ledger: Ledger, rows: list[tuple[str, int, Verdict]]) -> None:
    """Write ``(output, idx, verdict)`` rows into the throwaway ledger's ``results`` and ``fits``."""
    if not rows:
        return
    with ledger.transaction():
        ledger.db.executemany("INSERT OR REPLACE INTO results VALUES (?,?,?,?,NULL)",
                              [(o, idx, v.status, v.detail) for o, idx, v in rows])
        ledger.db.executemany("INSERT OR REPLACE INTO fits VALUES (?,?,?,?)",
                              [(o, idx, v.bucket, json.dumps(v.info) if v.info is not None else None)
                               for o, idx, v in rows if v.bucket is not None])


def holdout_skip(output: str, fmt: str, split: str) -> Verdict:
    """The build's status for an item of a split output ``output`` does not write."""
    return Verdict(f"skipped:{HOLDOUT}", f"output {output!r} ({fmt}) writes the train split only; "
                                         f"{split} items are never used")


def decide_rest(ledger: Ledger, ds: list[Decider]) -> None:
    """Give every planned item of each output's sources its terminal status in that output, as a build
    records it: the plan's outcome, ``skipped:holdout``, else the decider's verdict; the clips and audio
    files the probe decided keep theirs (those it sampled out get none)."""
    db = ledger.db
    db.executescript(FITS_SCHEMA)
    for d in ds:
        srcs = sorted(d.sources)
        if not srcs:
            continue
        # the plan's outcomes, as the build records them first (they replace any probe verdict)
        record(ledger, [(d.output, idx, Verdict(st, det)) for idx, st, det in ledger.plan_outcomes(srcs)])
    total = ledger.count_items()
    for lo in range(0, total, BATCH):
        items = [it for it in ledger.items(idx_range=(lo, lo + BATCH)) if it.plan_status == "ok"]
        if not items:
            continue
        decoded = {r[0]: r[1:] for r in db.execute(
            "SELECT idx, status, detail, width, height FROM decoded WHERE idx >= ? AND idx < ?", (lo, lo + BATCH))}
        rows: list[tuple[str, int, Verdict]] = []
        for d in ds:
            have = {r[0] for r in db.execute("SELECT idx FROM results WHERE output = ? AND idx >= ? AND idx < ?",
                                             (d.output, lo, lo + BATCH))}
            for it in items:
                if it.idx in have or it.source not in d.sources:
                    continue
                if d.splits is not None and it.split not in d.splits:
                    rows.append((d.output, it.idx, holdout_skip(d.output, d.format, it.split)))
                elif d.probes and it.kind in ("video", "audio"):
                    continue  # sampled out of the probe: not known
                else:
                    rows.append((d.output, it.idx, d.other(it, decoded.get(it.idx))))
        record(ledger, rows)


def output_counts(ledger: Ledger, d: Decider) -> dict[str, Any]:
    """The manifest's counts block of output ``d`` (``inputs == written + skipped + failed``) as a build of
    the recipe would record it, from scan's results (items the probe sampled out are not in it)."""
    from shardsmith.report import tally

    total, splits = tally(ledger.status_rows(d.output))
    return {"format": d.format, "counts": total, "splits": {k: {x: v[x] for x in ("inputs", "written")}
                                                            for k, v in splits.items()}}
