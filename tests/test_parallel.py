"""The worker pool: results in input order; heavy items (video clips) travel alone, so the first
result comes after one item and every worker gets work."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from shardsmith.parallel import Workers


@dataclass(frozen=True)
class Item:
    n: int
    kind: str


class SlowClips:
    """Images are instant; a 'video' takes 0.4 s (sleeping: no CPU needed)."""

    @staticmethod
    def is_heavy(item: Item) -> bool:
        return item.kind == "video"

    def __call__(self, item: Item):
        if item.kind == "video":
            time.sleep(0.4)
        return item.n, os.getpid(), time.monotonic()


class SlowClipsUnmarked(SlowClips):
    is_heavy = None  # the maker does not say: every item is chunked


def _run(maker, items, workers=4):
    pool = Workers(workers)
    try:
        t0 = time.monotonic()
        out = [(it, res) for it, res in pool.map(maker, items)]
        return t0, out
    finally:
        pool.close()


def test_heavy_items_travel_alone_and_results_keep_input_order():
    items = [Item(i, "video" if i % 3 else "image") for i in range(12)]  # 8 clips, 4 images
    t0, out = _run(SlowClips(), items)
    assert [it.n for it, _ in out] == list(range(12)) and [r[0] for _, r in out] == list(range(12))
    clip_done = sorted(r[2] - t0 for it, r in out if it.kind == "video")
    # 8 clips of 0.4 s on 4 workers: two rounds (~0.8 s); chunked 8 at a time they would run
    # serially in one worker (3.2 s) and the first would arrive only with the last
    assert clip_done[0] < 1.0 and clip_done[-1] < 2.4
    assert len({r[1] for it, r in out if it.kind == "video"}) >= 3  # spread over the workers
    t0, out = _run(SlowClipsUnmarked(), items)
    assert [it.n for it, _ in out] == list(range(12))
    assert len({r[1] for it, r in out if it.kind == "video"}) <= 2  # chunks of 8: one or two workers


def big_result(n: int) -> bytes:
    return bytes([n % 256]) * 300_000  # a decoded image's worth: more than a default 64 KiB pipe


def test_results_pipe_is_widened_and_large_results_arrive_intact():
    w = Workers(2, chunk=4)
    try:
        import fcntl

        size = fcntl.fcntl(w.pool._result_queue._reader.fileno(), getattr(fcntl, "F_GETPIPE_SZ", 1032))
        assert w.wide_pipe is True and size == Workers.RESULT_PIPE_BYTES
        got = list(w.map(big_result, range(40)))
        assert [n for n, _ in got] == list(range(40))
        assert all(r == bytes([n % 256]) * 300_000 for n, r in got)
    finally:
        w.close()


def test_plan_probed_in_worker_processes_equals_the_thread_plan(tmp_path):
    """Probing on the build's worker processes gives the very rows the thread pool gives:
    order, keys, hashes, statuses (zero-byte, not an image, duplicate) and splits."""
    from media_factory import real_photos

    from shardsmith.plan.ledger import Ledger
    from shardsmith.plan.planner import make_plan
    from shardsmith.recipe import recipe_from_dict
    from shardsmith.sources.base import open_sources

    src = tmp_path / "src"
    files = real_photos(src, 12, seed=3, min_side=64, max_side=96)
    (src / "copy of photo.jpg").write_bytes(files[0].read_bytes())  # a duplicate
    (src / "empty.jpg").write_bytes(b"")
    (src / "notes.jpg").write_bytes(b"not a jpeg at all")
    recipe = recipe_from_dict({"sources": [{"path": str(src)}], "split": {"holdout": 0.25},
                               "outputs": [{"format": "wds", "dir": "w"}]})
    rows = {}
    w = Workers(2, chunk=3)
    try:
        for mode, workers in (("threads", None), ("processes", w)):
            led = Ledger(tmp_path / f"{mode}.sqlite")
            n = make_plan(recipe, led, open_sources(recipe), workers=workers)
            rows[mode] = led.db.execute("SELECT * FROM items ORDER BY idx").fetchall()
            led.close()
            assert n == 15
    finally:
        w.close()
    assert rows["threads"] == rows["processes"]
    statuses = [v for row in rows["threads"] for v in row
                if isinstance(v, str) and v.startswith(("failed:", "skipped:"))]
    assert "skipped:duplicate" in statuses and sum(s.startswith("failed:") for s in statuses) == 2
