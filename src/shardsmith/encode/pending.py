"""A batch the encode stage has started on the device, and the way its results come back.

Contract
- :class:`PendingBatch` is made by :meth:`EncodeStage.launch <shardsmith.encode.stage.EncodeStage.launch>`
  only. ``done()`` polls without waiting; ``result()`` / ``result_batch()`` wait, have the stage
  book the batch (``EncodeStage._complete``) once, and give the same outputs however often called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from shardsmith.encode.stage import EncodeStage


class PendingBatch:
    """A batch started by :meth:`EncodeStage.launch`. ``done()`` polls without waiting;
    ``result()`` waits (the GIL is released while it does), books the batch's device time and
    returns ``(latents, texts)``: per item a ``[C, (F'), H', W']`` host tensor and, when captions
    were given, ``(emb [L, D], mask [L])``; each item owns its memory (no view of the batch).
    ``result_batch()`` gives the latents as one ``[n, ...]`` tensor instead."""

    def __init__(self, stage: EncodeStage, n: int, captions: list[str] | None, rows: int):
        self.stage, self.n, self.captions = stage, n, captions
        self.rows = rows  # rows on the device: the n items and their padding
        self.latents: list[torch.Tensor] | None = None  # set at once by the synchronous paths
        self.z_host = self.start = self.vae_end = self.done_event = self.text_emb = None
        self.host_times: tuple[float, float, float] | None = None  # staged, launch begun, launch queued
        self.known: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.audio = None  # the batch's LaunchedAudio (None: no audio), set by the finisher
        self.partners: dict | None = None  # {partner name: latent per item}, set by the finisher
        self.audio_reference = None  # the references' LaunchedAudio, set by the finisher
        self.todo: list[str] = []
        self.failed: dict | None = None  # {row: ItemError}: images no decoder could read (set by the finisher)
        self.text_only = False  # EncodeStage.launch_text: captions alone, no latents
        self._out = None

    def done(self) -> bool:
        return self._out is not None or self.done_event is None or self.done_event.query()

    def _resolve(self):
        if self._out is None:
            if self.done_event is not None:
                self.done_event.synchronize()
            self._out = self.stage._complete(self)
        return self._out

    def result(self) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]] | None]:
        z, texts = self._resolve()
        if isinstance(z, torch.Tensor):  # one tensor per item, each with its own memory
            z = [t.clone() for t in z.unbind(0)]
            self._out = (z, texts)
        return z, texts

    def result_batch(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Like :meth:`result`, but the latents as one host tensor ``[n, C, (F'), H', W']`` (no tensor
        per item: each is a torch call that gives up the GIL, which costs milliseconds a batch when
        the encoder thread wants it back)."""
        z, texts = self._resolve()
        return (z if z is None or isinstance(z, torch.Tensor) else torch.stack(z)), texts
