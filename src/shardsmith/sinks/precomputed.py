"""Sink of the LTX-trainer ``.precomputed/`` tree (layout: :mod:`shardsmith.formats.precomputed`):
``latents/`` and ``conditions/`` records, names mirroring each media path.

A unit of work is a group of items; each ``.pt`` is written atomically, and the unit is
committed to the ledger after all its files are in place (re-running a unit rewrites the
same bytes). An item the ledger records as not written has no file: ``drop_items`` removes the
files an earlier, uncommitted attempt of its unit wrote under its name (a resume where its source
now fails), which the trainer, listing ``latents/``, would read as a sample. ``shardsmith.json``
at the root records the encoders' provenance, buckets and fps so that a later build with a
different encoder, revision or bucket is refused instead of mixed in.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from shardsmith.formats.precomputed import CACHE_EXT, PRECOMPUTED_STAMP, WRITTEN_DIRS
from shardsmith.formats.wds import bucket_frames
from shardsmith.records import SampleResult, UnitFile, Written
from shardsmith.atomic import atomic_write_bytes, atomic_write_json, fsync_dir
from shardsmith.sinks.pt_write import pt_bytes_fast
from shardsmith.sinks.bucketed_wds import crop_share

def pt_bytes(obj: dict[str, Any]) -> bytes:
    """``torch.save`` to bytes (loadable with ``weights_only=True``): the very same bytes, from a
    checked template for records of a structure already seen (:mod:`shardsmith.sinks.pt_write`)."""
    return pt_bytes_fast(obj)


def latent_record(latents: torch.Tensor, fps: float) -> dict[str, Any]:
    """The ``latents/`` dict: ``[C, F', H', W']`` plus its grid and fps (images: F' = 1)."""
    if latents.ndim == 3:
        latents = latents.unsqueeze(1)
    if latents.ndim != 4:
        raise ValueError(f"latents must be [C, F', H', W'], got {tuple(latents.shape)}")
    return {"latents": latents.contiguous(), "num_frames": int(latents.shape[1]), "height": int(latents.shape[2]),
            "width": int(latents.shape[3]), "fps": float(fps)}


def condition_record(emb: torch.Tensor, mask: torch.Tensor, audio_emb: torch.Tensor | None = None) -> dict[str, Any]:
    rec = {"video_prompt_embeds": emb.contiguous(), "prompt_attention_mask": mask.to(torch.int64).contiguous()}
    if audio_emb is not None:
        rec["audio_prompt_embeds"] = audio_emb.contiguous()
    return rec


class PrecomputedSink:
    kind = "precomputed"

    def __init__(self, output, dest: Path):
        self.o, self.dest = output, dest
        self._pending_stamp: Callable[[], dict[str, Any]] | None = None
        self._stamp_lock = threading.Lock()  # (units are written on two threads)

    def unit_full(self, count: int, nbytes: int, next_sample: SampleResult, key: str,
                  next_bytes: int | None = None) -> bool:
        return count >= self.o.unit

    def has_stamp(self) -> bool:
        """Whether the tree already records the encoders it was built with."""
        return (self.dest / PRECOMPUTED_STAMP).exists()

    def check_stamp(self, stamp: dict[str, Any]) -> None:
        """Refuse a tree built with other encoders/buckets; write the stamp for a new tree."""
        path = self.dest / PRECOMPUTED_STAMP
        if path.exists():
            old = json.loads(path.read_text(encoding="utf-8"))
            if old != stamp:
                from shardsmith.recipe import diff_recipes

                diffs = diff_recipes(old, stamp)
                raise ValueError(f"{self.dest} was built with different encoders or geometry; refusing to mix "
                                 "caches:\n  " + "\n  ".join(diffs) + "\nwrite to a new folder (e.g. "
                                 ".precomputed-v2) or remove the old tree first")
            return
        self.dest.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, stamp)

    def stamp_before_first_write(self, stamp: Callable[[], dict[str, Any]]) -> None:
        """A new tree: :meth:`check_stamp` with ``stamp()`` just before the first unit's files are written (the
        stamp names the loaded models: the items decode while they load)."""
        self._pending_stamp = stamp

    def settle_stamp(self) -> None:
        """The deferred :meth:`check_stamp`, once (at the first unit, or at the end of a tree with none)."""
        with self._stamp_lock:
            if self._pending_stamp is not None:
                self.check_stamp(self._pending_stamp())
                self._pending_stamp = None

    def write_unit(self, seq: int, samples: list[tuple[str, SampleResult]]) -> Written:
        """Write every sample's files atomically; the unit's files are grouped by bucket (one
        :class:`~shardsmith.records.UnitFile` per bucket, named ``<bucket>@unit<seq>``)."""
        self.settle_stamp()
        h, total = hashlib.sha256(), 0
        groups: dict[str, list] = {}
        for _key, s in samples:
            hb, nb = hashlib.sha256(), 0
            for rel, data in sorted(s.members.items()):
                atomic_write_bytes(self.dest / rel, data)
                digest = hashlib.sha256(data).digest()
                h.update(rel.encode() + b"\0" + digest)
                hb.update(rel.encode() + b"\0" + digest)
                total += len(data)
                nb += len(data)
            groups.setdefault(s.info.get("bucket", ""), []).append((s, nb, hb.digest()))
        files = []
        for bucket, group in sorted(groups.items()):
            frames = bucket_frames(bucket) if bucket else 1  # (0: an audio duration's bucket)
            gh = hashlib.sha256(b"".join(d for _, _, d in group)).hexdigest()
            files.append(UnitFile(f"{bucket}@unit{seq:05d}", bucket, len(group), sum(n for _, n, _ in group), gh,
                                  frames * len(group),
                                  sum(int(s.info.get("source_frames", frames)) for s, _, _ in group),
                                  sum(crop_share(s.info) for s, _, _ in group)))
        return Written(f"unit{seq:05d}", total, h.hexdigest(), tuple(files))

    def drop_items(self, rels: Iterable[str]) -> int:
        """Remove the files named ``rel`` (each an item's :func:`~shardsmith.formats.precomputed.sample_rel`)
        from every folder shardsmith writes: items the ledger records as not written, whose files an
        earlier, uncommitted attempt of their unit left; how many were removed."""
        gone, dirs = 0, set()
        for rel in rels:
            for sub in WRITTEN_DIRS:
                path = self.dest / sub / rel
                if path.is_file() or path.is_symlink():
                    path.unlink()
                    dirs.add(path.parent)
                    gone += 1
        for d in sorted(dirs):
            fsync_dir(d)
        return gone

    def finalize(self, units: list[dict]) -> dict[str, Any]:
        counts = {sub: sum(1 for p in (self.dest / sub).rglob(f"*{CACHE_EXT}")) if (self.dest / sub).exists() else 0
                  for sub in WRITTEN_DIRS}
        for sub in WRITTEN_DIRS[2:]:  # a tree without audio or references: its manifest block as before them
            if not counts[sub]:
                del counts[sub]
        return {"dir": str(self.dest), "files": counts, "bytes": sum(u["bytes"] for u in units)}
