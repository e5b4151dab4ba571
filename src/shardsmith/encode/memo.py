"""Encoder results kept by item while a build has several outputs that need the same encoders, so
that each item is encoded once whatever the number of outputs (the second output's batches read
what the first one's computed; its workers still decode the item for its geometry facts).

Contract
- ``put(items, z, texts, geometries, audio=None)``: after a batch is encoded, each item's latent
  (``z[i]``, as the encoder gave it, before any output's dtype), text ``(emb, mask[, audio_emb])``
  and audio latent (``audio[i]``, when it has one) go to
  ``<folder>/<idx>.pt`` with the item's key, content hash and geometry (the pixels' bucket and
  crop, a string; outputs cut an item differently, e.g. a ``latent_zip`` and bucketed outputs),
  written atomically; an item already kept is not written again. Each record names its batch-mates.
- ``get(item, geometry)``: ``(latent, text or None, audio latent or None)`` kept for this very item (same plan position,
  key, content hash and geometry) whose batch-mates are all kept too, or None. Values read back are bit
  for bit those put. A batch is thus served whole or not at all: a build killed between two of a
  batch's writes encodes that batch again with the same mates, not its unkept items in a smaller batch
  (on a CPU a latent's last bits depend on its batch's size), so the resumed build is byte-identical.
- The folder is the build's (``.shardsmith/encoded``): it survives a crash, so a resumed build
  does not encode again what it kept; a redone plan removes it (positions change), and so does
  the end of the build (``remove()``).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import torch

from shardsmith.atomic import atomic_write_bytes
from shardsmith.records import PlannedItem


class EncodedMemo:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.hits = 0  # items served from the memo (not encoded again)
        self._whole: set[tuple[int, ...]] = set()  # batches whose every record was seen on disk

    def _path(self, idx: int) -> Path:
        return self.folder / f"{idx // 1000:06d}" / f"{idx}.pt"

    @staticmethod
    def _identity(item: PlannedItem, geometry: str) -> str:
        return f"{item.key}\0{item.sha256 or ''}\0{item.caption or ''}\0{geometry}"

    def put(self, items: list[PlannedItem], z: torch.Tensor, texts, geometries: list[str], audio=None) -> None:
        mates = [item.idx for item in items]
        for i, item in enumerate(items):
            path = self._path(item.idx)
            if path.exists():
                continue
            rec = {"latent": z[i].clone(), "item": self._identity(item, geometries[i]), "batch": mates}
            if texts is not None:
                rec["text_emb"], rec["text_mask"] = texts[i][0].clone(), texts[i][1].clone()
                if len(texts[i]) > 2:
                    rec["text_audio_emb"] = texts[i][2].clone()
            if audio is not None and audio[i] is not None:
                rec["audio_latent"] = audio[i].clone()
            buf = io.BytesIO()
            torch.save(rec, buf)
            atomic_write_bytes(path, buf.getvalue())

    def get(self, item: PlannedItem, geometry: str) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None] | None:
        path = self._path(item.idx)
        if not path.exists():
            return None
        rec = torch.load(path, map_location="cpu", weights_only=True)
        if rec.get("item") != self._identity(item, geometry):
            return None  # kept for another item (a plan redone over changed sources) or geometry: encoded again
        mates = tuple(rec.get("batch", ()))
        if mates not in self._whole:  # (checked once a batch, not once an item: records are never removed singly)
            if not all(self._path(idx).exists() for idx in mates):
                return None  # a batch-mate was never kept (a kill between the batch's writes): the batch again, whole
            self._whole.add(mates)
        self.hits += 1
        text = (rec["text_emb"], rec["text_mask"]) if "text_emb" in rec else None
        if text is not None and "text_audio_emb" in rec:
            text = (*text, rec["text_audio_emb"])
        return rec["latent"], text, rec.get("audio_latent")

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self._whole.clear()
