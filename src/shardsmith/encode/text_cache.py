"""Text embeddings kept on disk by caption, and a text encoder that answers from them (``models.offload:
text-first``: the real encoder is freed before the VAE loads).

Contract
- :class:`TextCache(folder, identity)`: ``folder`` (the build's ``.shardsmith/text_cache``) holds
  ``index.sqlite`` (caption hash -> chunk, row) and ``chunk-NNNNNN.safetensors`` files (``emb [n, L, D]``,
  ``mask [n, L]``, and ``pooled`` / ``audio_emb`` when the encoder makes them), each written atomically
  before its rows are committed: a chunk without rows (a crash between the two) is written again under the
  same name. ``identity`` (the text encoder's model identity) is kept; a cache of another encoder is emptied.
- ``missing(captions)``: those without an entry. ``put(captions, te)``: a batch of
  :class:`~shardsmith.encode.text.TextEmbeddings`, buffered up to :data:`CHUNK_BYTES` of host memory, then
  written; ``flush()`` writes what is buffered. ``get(captions)``: their embeddings as one
  :class:`~shardsmith.encode.text.TextEmbeddings`, bit for bit what was put; a caption never put is a
  :class:`TextCacheMiss`. Safe to call from several threads.
- :class:`CachedText`: ``spec``, ``provenance`` and ``encode(prompts, device=, non_blocking=)`` of the encoder
  the cache was filled by, answered from the cache (``model`` is None: there are no weights).
- :func:`remove_cache(root, stage)`: at the end of a complete build, the folder goes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from shardsmith.atomic import atomic_write_bytes
from shardsmith.encode.text import TextEmbeddings

TEXT_CACHE_DIR = ".shardsmith/text_cache"
CHUNK_BYTES = 64 << 20  # embeddings buffered before a chunk is written
OPEN_CHUNKS = 8  # chunk files kept open for reading
_FIELDS = ("emb", "mask", "pooled", "audio_emb")


class TextCacheMiss(RuntimeError):
    """A caption the text pass did not encode (a shardsmith bug: the pass reads the same plan)."""


def caption_key(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8", "surrogatepass")).hexdigest()


class TextCache:
    def __init__(self, folder: str | Path, identity: dict[str, Any]):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.folder / "index.sqlite"), check_same_thread=False, isolation_level=None)
        self._db.execute("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, chunk INTEGER, row INTEGER)")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        ident = json.dumps(identity, sort_keys=True, default=str)
        row = self._db.execute("SELECT value FROM meta WHERE key='identity'").fetchone()
        if row is not None and row[0] != ident:  # filled by another encoder: start again
            self._db.execute("DELETE FROM entries")
            for p in self.folder.glob("chunk-*.safetensors"):
                p.unlink()
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (ident,))
        self._buf: list[tuple[list[str], dict[str, torch.Tensor]]] = []
        self._buf_bytes = 0
        self._open: OrderedDict[int, Any] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def missing(self, captions: list[str]) -> list[str]:
        """The distinct captions of ``captions`` without an entry, in first-seen order."""
        keys = {caption_key(c): c for c in dict.fromkeys(captions)}
        have: set[str] = set()
        with self._lock:
            items = list(keys)
            for i in range(0, len(items), 500):
                part = items[i:i + 500]
                have.update(r[0] for r in self._db.execute(
                    f"SELECT key FROM entries WHERE key IN ({','.join('?' * len(part))})", part))
        return [c for k, c in keys.items() if k not in have]

    def put(self, captions: list[str], te: TextEmbeddings) -> None:
        tensors = {f: getattr(te, f).detach().to("cpu").contiguous() for f in _FIELDS if getattr(te, f) is not None}
        self._buf.append((list(captions), tensors))
        self._buf_bytes += sum(t.nbytes for t in tensors.values())
        if self._buf_bytes >= CHUNK_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the buffered embeddings as one chunk, then commit its rows."""
        if not self._buf:
            return
        from safetensors.torch import save

        captions = [c for cs, _ in self._buf for c in cs]
        tensors = {f: torch.cat([t[f] for _, t in self._buf]) for f in self._buf[0][1]}
        self._buf, self._buf_bytes = [], 0
        with self._lock:
            chunk = self._db.execute("SELECT COALESCE(MAX(chunk), -1) + 1 FROM entries").fetchone()[0]
        atomic_write_bytes(self._path(chunk), save(tensors))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT INTO entries VALUES (?, ?, ?)",
                                 [(caption_key(c), chunk, i) for i, c in enumerate(captions)])
            self._db.execute("COMMIT")

    def _path(self, chunk: int) -> Path:
        return self.folder / f"chunk-{chunk:06d}.safetensors"

    def _handle(self, chunk: int):
        from safetensors import safe_open

        h = self._open.pop(chunk, None)
        if h is None:
            h = safe_open(str(self._path(chunk)), framework="pt")
            if len(self._open) >= OPEN_CHUNKS:
                self._open.popitem(last=False)
        self._open[chunk] = h
        return h

    def get(self, captions: list[str]) -> TextEmbeddings:
        rows: dict[str, list[torch.Tensor]] = {}
        with self._lock:
            for c in captions:
                hit = self._db.execute("SELECT chunk, row FROM entries WHERE key=?", (caption_key(c),)).fetchone()
                if hit is None:
                    raise TextCacheMiss(f"the text pass (models.offload: text-first) did not encode the caption "
                                        f"{c[:80]!r}; this is a shardsmith bug, please report it "
                                        "(set models.offload: off to build without the pass)")
                h = self._handle(hit[0])
                for f in h.keys():
                    rows.setdefault(f, []).append(h.get_slice(f)[hit[1]:hit[1] + 1])
        out = {f: torch.cat(v) for f, v in rows.items()}
        return TextEmbeddings(emb=out["emb"], mask=out["mask"], pooled=out.get("pooled"), truncated=None,
                              audio_emb=out.get("audio_emb"))

    def close(self) -> None:
        with self._lock:
            self._open.clear()
            self._db.close()


class CachedText:
    """The text encoder's interface answered from a :class:`TextCache` (see the module)."""

    model = None  # no weights on any device

    def __init__(self, spec, provenance, cache: TextCache):
        self.spec, self.provenance, self.cache = spec, provenance, cache

    def encode(self, prompts: list[str], *, device: str | torch.device | None = None,
               non_blocking: bool = False) -> TextEmbeddings:
        if isinstance(prompts, str):
            raise TypeError("encode() takes a list of prompts, not a single string")
        return self.cache.get([str(p) for p in prompts])  # host tensors: what device="cpu" asks for

    __call__ = encode


def remove_cache(root: Path, stage=None) -> None:
    """The build is complete: close ``stage``'s cache (if it answers from one) and remove the folder."""
    import shutil

    cache = getattr(getattr(stage, "text_encoder", None), "cache", None)
    if isinstance(cache, TextCache):
        cache.close()
    shutil.rmtree(Path(root) / TEXT_CACHE_DIR, ignore_errors=True)
