"""Multi-bucket WebDataset sink: one WebDataset folder per bucket, so that every batch a loader
draws from one folder has one shape.

Layout (names from :mod:`shardsmith.formats.wds`)::

    <dest>/buckets.json              {bucket: {dir, samples, shards, latent_shape}}
    <dest>/<WxHxF>/NNNNN.tar         the shards of that bucket
    <dest>/<WxHxF>/shard_count.json

Contract
- A unit (``samples_per_shard`` planned items) writes one shard per bucket present in it, named
  after the unit (``<bucket>/<seq>.tar``): shard numbers within a bucket folder may skip (FastGen
  lists ``*.tar``; every count file lists what exists). Each file is written atomically; the unit's
  :class:`~shardsmith.records.Written` lists them, and its sha256 hashes their names and hashes.
  The unit's shard in a bucket folder it writes nothing to (``drop_unit``: in every bucket folder,
  for a unit that writes no sample) is removed: what an earlier, uncommitted attempt of the unit
  left there (a resume whose items of that bucket now fail) is not the build's. ``drop_units_after``
  does :meth:`WdsSink.drop_units_after` in every bucket folder (units cut by bytes: the shards past the
  last committed unit that an earlier, uncommitted attempt left).
- A unit closes on ``samples_per_shard`` or ``max_shard_bytes`` over all its buckets together, so
  no bucket's shard passes the byte budget.
- ``finalize(files, latent_shapes)`` writes every bucket's ``shard_count.json`` and ``buckets.json``
  from the ledger's record of the files; it returns the output's manifest block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsmith.atomic import atomic_write_json
from shardsmith.formats.wds import BUCKETS_INDEX_FILE, SHARD_COUNT_FILE, bucket_folder, bucket_frames, is_bucket_folder
from shardsmith.records import SampleResult, UnitFile, Written
from shardsmith.sinks.wds import WdsSink


def crop_share(info: dict[str, Any]) -> float:
    """The share of the (resized) source area that the crop keeps (1.0 when nothing is cut)."""
    c = info.get("crop") or {}
    area = c.get("resize_w", 0) * c.get("resize_h", 0)
    return (c.get("crop_w", 0) * c.get("crop_h", 0)) / area if area else 1.0


class BucketedWdsSink:
    kind = "wds_buckets"

    def __init__(self, output, dest: Path):
        self.o, self.dest = output, dest
        self._inner = WdsSink(output, dest)  # unit_full: the budget over all buckets of the unit

    def unit_full(self, count: int, nbytes: int, next_sample: SampleResult, key: str,
                  next_bytes: int | None = None) -> bool:
        return self._inner.unit_full(count, nbytes, next_sample, key, next_bytes)

    def write_unit(self, seq: int, samples: list[tuple[str, SampleResult]]) -> Written:
        by_bucket: dict[str, list[tuple[str, SampleResult]]] = {}
        for key, s in samples:
            by_bucket.setdefault(s.info["bucket"], []).append((key, s))
        files, h, total = [], hashlib.sha256(), 0
        for bucket in sorted(by_bucket):
            group = by_bucket[bucket]
            folder = bucket_folder(bucket)
            name, size, sha = WdsSink(self.o, self.dest / folder).write_unit(seq, group)
            rel = f"{folder}/{name}"
            frames = bucket_frames(bucket)  # (0: an audio duration's bucket)
            files.append(UnitFile(rel, bucket, len(group), size, sha, frames * len(group),
                                  sum(int(s.info.get("source_frames", frames)) for _, s in group),
                                  sum(crop_share(s.info) for _, s in group)))
            h.update(rel.encode() + b"\0" + bytes.fromhex(sha))
            total += size
        self._drop_unit_in(seq, {bucket_folder(b) for b in by_bucket})
        return Written(f"unit{seq:05d}", total, h.hexdigest(), tuple(files))

    def drop_unit(self, seq: int) -> None:
        """Unit ``seq`` writes no sample: remove its shard from every bucket folder."""
        self._drop_unit_in(seq, set())

    def drop_units_after(self, seq: int, planned: Callable[[list[str]], bool]) -> list[str]:
        """:meth:`WdsSink.drop_units_after` in every bucket folder; the names removed, ``<bucket>/NNNNN.tar``."""
        gone = []
        for d in sorted(self.dest.iterdir()) if self.dest.is_dir() else []:
            if is_bucket_folder(d.name) and d.is_dir() and not d.is_symlink():
                gone += [f"{d.name}/{n}" for n in WdsSink(self.o, d).drop_units_after(seq, planned)]
        return gone

    def _drop_unit_in(self, seq: int, written: set[str]) -> None:
        """Remove unit ``seq``'s shard from the bucket folders other than ``written``."""
        if self.dest.is_dir():
            for d in self.dest.iterdir():
                if d.name not in written and is_bucket_folder(d.name) and d.is_dir() and not d.is_symlink():
                    WdsSink(self.o, d).drop_unit(seq)

    def finalize(self, files: list[dict[str, Any]], latent_shapes: dict[str, list[int]]) -> dict[str, Any]:
        """``files``: the ledger's ``unit_files`` of this output's split; ``latent_shapes``: per bucket."""
        index = bucket_summary(files, latent_shapes)
        shards = []
        for bucket, entry in index.items():
            mine = [f for f in files if f["bucket"] == bucket and f["count"] > 0]
            folder = bucket_folder(bucket)
            entry["dir"], entry["shards"] = folder, len(mine)
            (self.dest / folder).mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.dest / folder / SHARD_COUNT_FILE,
                              {f["name"].split("/", 1)[1]: f["count"] for f in mine})
            shards += [{"name": f["name"], "count": f["count"], "bytes": f["bytes"], "sha256": f["sha256"]}
                       for f in mine]
        self.dest.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.dest / BUCKETS_INDEX_FILE, index)
        return {"dir": str(self.dest), "buckets": index, "shards": shards}


def bucket_summary(files: list[dict[str, Any]], latent_shapes: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """Per bucket (sorted): samples, latent shape, frames used of those available, and the mean
    share of the source area the crop kept; from the ledger's ``unit_files`` of one split."""
    out: dict[str, dict[str, Any]] = {}
    for bucket in sorted({f["bucket"] for f in files if f["count"] > 0}):
        mine = [f for f in files if f["bucket"] == bucket]
        n = sum(f["count"] for f in mine)
        out[bucket] = {"samples": n, "latent_shape": latent_shapes.get(bucket),
                       "frames_used": sum(f["frames_used"] for f in mine),
                       "frames_available": sum(f["frames_available"] for f in mine),
                       "mean_area_kept": round(sum(f["area_kept"] for f in mine) / n, 4)}
    return out
