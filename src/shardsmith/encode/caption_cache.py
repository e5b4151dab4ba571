"""Captions to text embeddings with a bounded cache, so a caption repeated across a build is
encoded once.

Contract (a mixin of :class:`~shardsmith.encode.stage.EncodeStage`, which sets the attributes used:
``text_encoder``, ``batch_size``, ``seconds``, ``_text_cache``)
- ``text(captions)``: ``(emb [L, D], mask [L])`` per caption, in order (``(emb, mask, audio_emb
  [L, D_a])`` for an encoder that also makes audio features, LTX-2's); each distinct caption not
  cached is encoded once, in chunks of ``text_rows()`` (``batch_size``), each padded to it, as the stage's
  launched batches and the text pass are: an embedding does not depend on its chunk-mates.
- ``text_entry(te, j)``: caption ``j`` of a batch of :class:`~shardsmith.encode.text.TextEmbeddings`
  as that tuple, each tensor with its own memory.
- Past ``TEXT_CACHE_BYTES`` (or 4096 entries) the cache keeps only the captions of the current
  call or batch, so host memory stays bounded on runs of unique captions.
"""

from __future__ import annotations

import time

import torch

from shardsmith.encode.text_memory import encode_halving


def text_entry(te, j: int) -> tuple[torch.Tensor, ...]:
    """``(emb, mask)`` of caption ``j`` of a batch, plus its audio embedding when the encoder makes one."""
    audio = getattr(te, "audio_emb", None)
    if audio is None:
        return te.emb[j].clone(), te.mask[j].clone()
    return te.emb[j].clone(), te.mask[j].clone(), audio[j].clone()


class CaptionCache:
    TEXT_CACHE_BYTES = 512 << 20  # a T5-XXL embedding at 512 tokens is 4 MiB: ~128 of them

    def _prune_text_cache(self, keep: list[str]) -> None:
        """Bounded host memory on long runs with unique captions: past ``TEXT_CACHE_BYTES`` (or
        4096 entries) only the captions of the current batch stay."""
        nbytes = sum(sum(t.nbytes for t in entry) for entry in self._text_cache.values())
        if nbytes > self.TEXT_CACHE_BYTES or len(self._text_cache) > 4096:
            k = set(keep)
            self._text_cache = {c: v for c, v in self._text_cache.items() if c in k}

    def text_rows(self) -> int:
        """Rows of every text batch, on any device: ``batch_size`` (short ones padded with ``""``). One
        shape makes a caption's embedding independent of its batch-mates and of which captions the cache
        already held, so a resumed build gives the same bytes: on a CPU too, where MKL rounds a GEMM by
        its shape (MiniLM's embeddings differ in the last bits between batches of 1-2 and 3+ rows on an
        AVX-512 Xeon)."""
        return max(1, self.batch_size)

    def text(self, captions: list[str]) -> list[tuple[torch.Tensor, ...]]:
        if self.text_encoder is None:
            raise RuntimeError("no text encoder configured (models.text)")
        t0 = time.perf_counter()
        todo = sorted({c for c in captions if c not in self._text_cache})
        rows = self.text_rows()
        for i in range(0, len(todo), rows):
            chunk = todo[i:i + rows]
            # one device->host copy per chunk; out of memory: the chunk in halves (encode/text_memory.py)
            te = encode_halving(self.text_encoder, chunk, device="cpu", counter=getattr(self, "_text_oom", None),
                                rows=rows)
            for j, c in enumerate(chunk):
                self._text_cache[c] = text_entry(te, j)
        self._prune_text_cache(captions)
        self.seconds["text"] += time.perf_counter() - t0
        return [self._text_cache[c] for c in captions]
