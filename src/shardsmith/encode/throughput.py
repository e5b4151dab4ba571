"""What an encode stage reports of its own speed, from the batches it booked.

Contract (a mixin of :class:`~shardsmith.encode.stage.EncodeStage`, which sets the attributes used:
``batches``, ``timeline``, ``audio_batches``, ``audio_timeline``, ``created``)
- ``batches`` holds a :class:`BatchRecord` per encoded batch, ``timeline`` a :class:`LaunchRecord`
  per batch launched ahead on a GPU (the rows :func:`~shardsmith.encode.idle.gpu_idle` reads).
- ``steady_state()``: None before three batches; else the throughput between the first and the
  last batch, the median encode time of the largest batches, the first launched batch's times
  and the device's idle time (:func:`~shardsmith.encode.idle.gpu_idle`), all counted from
  ``created``, which ``mark_start(at)`` sets to when the build started encoding. Read by the
  manifest only: no output byte depends on it.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from shardsmith.encode.idle import gpu_idle


class BatchRecord(NamedTuple):
    """One encoded batch, as the stage books it."""

    done_at: float  # perf_counter when its latents were done (a launched batch: its end event, mapped)
    items: int
    encode_s: float  # the VAE's seconds
    rows: int  # rows on the device: the items and their padding


class LaunchRecord(NamedTuple):
    """A batch launched ahead on a GPU, on the host clock (``perf_counter``)."""

    staged_at: float  # the main thread had its pixels stacked
    launch_begin: float  # the encoder thread began queueing its work
    launch_end: float  # ... and had queued it
    gpu_start: float  # the device ran it, from its first kernel
    gpu_end: float  # to the end of its last, text encoder included


class Throughput:
    def mark_start(self, at: float | None = None) -> None:
        """The build started encoding at ``at`` (``perf_counter()``; default now):
        ``steady_state``'s times count from there."""
        self.created = time.perf_counter() if at is None else at

    def steady_state(self) -> dict[str, Any] | None:
        """Throughput between the first and the last encoded batch (model load, planning and the
        first batch's autotuning left out), and the median encode time of the largest batches
        (units smaller than a batch, e.g. shards bounded by bytes, make every batch partial)."""
        return _steady(self.batches, self.timeline, self.created)

    def audio_steady_state(self) -> dict[str, Any] | None:
        """The same account for the audio encoder's batches (``audio_batches``, ``audio_timeline``):
        its ``gpu_idle`` cause ``pixels`` is then a batch whose waveforms were not stacked yet."""
        return _steady(self.audio_batches, self.audio_timeline, self.created)


def _steady(batches: list[BatchRecord], timeline: list[LaunchRecord], created: float) -> dict[str, Any] | None:
    """``steady_state``'s figures of one encoder's batches; None before three batches."""
    if len(batches) < 3:
        return None
    largest = max(b.items for b in batches)
    full = [b for b in batches if b.items == largest]
    t_first, t_last = batches[0].done_at, batches[-1].done_at
    items = sum(b.items for b in batches[1:])
    times = sorted(b.encode_s for b in full)
    return {"items_per_s": round(items / (t_last - t_first), 1) if t_last > t_first else None,
            "first_batch_done_s": round(t_first - created, 3),  # after the outputs started (mark_start)
            "last_batch_done_s": round(t_last - created, 3),
            "median_batch_encode_s": round(times[len(times) // 2], 4), "batches": len(batches),
            "first_batch": _first_batch(timeline, created), "gpu_idle": gpu_idle(timeline),
            "median_batch_gpu_s": _median_gpu_s(timeline)}


def _median_gpu_s(timeline: list[LaunchRecord]) -> float | None:
    """Median device time of a launched batch, the text encoder's part included (the encode time
    above is the VAE's alone)."""
    spans = sorted(r.gpu_end - r.gpu_start for r in timeline)
    return round(spans[len(spans) // 2], 4) if spans else None


def _first_batch(timeline: list[LaunchRecord], created: float) -> dict[str, float] | None:
    """When the first launched batch was staged, queued and started on the device, counted like
    ``first_batch_done_s`` from the start of the outputs (pixels late, or models late?). A batch
    run synchronously right after a compile is not a launched one."""
    if not timeline:
        return None
    staged, begin, end, start, _ = min(timeline, key=lambda r: r.gpu_start)
    return {k: round(v - created, 3) for k, v in
            (("staged_s", staged), ("launch_begun_s", begin), ("queued_s", end), ("gpu_start_s", start))}
