"""Why the GPU waited between batches: each idle gap of a launched run, attributed to the host step
that came late.

- In: per batch ``(staged_at, launch_begin, launch_end, gpu_start, gpu_end)``, host clock seconds
  (``time.perf_counter``; the GPU's times mapped onto it through a reference event). ``staged_at``:
  the main thread had the batch's pixels stacked and handed it to the encoder thread (an audio batch on
  a GPU: its waveforms stacked on the finisher's staging thread);
  ``launch_begin``/``launch_end``: the encoder thread queued its work on the device; ``gpu_*``: the
  device ran it (from the batch's first kernel to the end of its last, text encoder included).
- Out: ``gpu_idle(timeline)`` gives the span from the first batch's start to the last one's end, the
  idle seconds inside it and their share, and the idle seconds by cause, judged per gap against the
  moment the device ran dry (the previous batch's end):
  ``pixels``: the batch was not staged yet (decode workers behind, the main thread busy elsewhere, or an
  audio batch still being stacked on the finisher's staging thread);
  ``launch``: staged in time, queued on the device after it ran dry (the encoder thread late: behind
  an earlier launch, or waiting for the GIL); ``device``: queued in time, started later anyway (its
  host-to-device copy, or timing noise). None with fewer than two batches.
Pure arithmetic: no torch, no clock.
"""

from __future__ import annotations

from itertools import pairwise

CAUSES = ("pixels", "launch", "device")


def gpu_idle(timeline: list[tuple[float, float, float, float, float]]) -> dict | None:
    rows = sorted(timeline, key=lambda r: r[3])
    if len(rows) < 2:
        return None
    by = dict.fromkeys(CAUSES, 0.0)
    gaps = 0
    for prev, cur in pairwise(rows):
        dry = prev[4]
        gap = cur[3] - dry
        if gap <= 0:
            continue
        gaps += 1
        cause = "pixels" if cur[0] >= dry else "launch" if cur[2] >= dry else "device"
        by[cause] += gap
    span = max(r[4] for r in rows) - rows[0][3]
    idle = sum(by.values())
    return {"span_s": round(span, 4), "idle_s": round(idle, 4),
            "idle_frac": round(idle / span, 4) if span > 0 else None, "gaps": gaps,
            "by_cause_s": {k: round(v, 4) for k, v in by.items()}}
