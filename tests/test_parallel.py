"""The worker pool: results in input order; heavy items (video clips) travel alone, so the first
result comes after one item and every worker gets work."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

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


@pytest.mark.slow
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


def test_plan_rows_do_not_depend_on_where_batches_end(tmp_path, monkeypatch):
    """Key collisions (``a.jpg`` / ``a.png``), duplicates whose first copy sits in an earlier batch
    and sidecar captions come out the same whether the plan writes its rows 3 at a time or all at once."""
    from media_factory import real_photos

    from shardsmith.plan import planner
    from shardsmith.plan.ledger import Ledger
    from shardsmith.recipe import recipe_from_dict
    from shardsmith.sources.base import open_sources

    src = tmp_path / "src"
    files = real_photos(src, 8, seed=4, min_side=64, max_side=96)
    (src / f"{files[0].stem}.png").write_bytes(files[1].read_bytes())  # same key base as files[0]
    (src / "zz copy.jpg").write_bytes(files[0].read_bytes())  # a duplicate, rows after its first copy
    (src / f"{files[2].stem}.txt").write_text("a sidecar caption", encoding="utf-8")
    (src / "zz copy.txt").mkdir()  # a folder named like a sidecar is not a caption
    recipe = recipe_from_dict({"sources": [{"path": str(src)}], "split": {"holdout": 0.3},
                               "outputs": [{"format": "wds", "dir": "w"}]})
    rows = {}
    w = Workers(2, chunk=2)
    try:
        for batch in (3, 256):
            monkeypatch.setattr(planner, "BATCH", batch)
            led = Ledger(tmp_path / f"b{batch}.sqlite")
            assert planner.make_plan(recipe, led, open_sources(recipe), workers=w) == 10
            rows[batch] = led.db.execute("SELECT idx, item_id, key, split, plan_status, dup_of, caption "
                                         "FROM items ORDER BY idx").fetchall()
            led.close()
    finally:
        w.close()
    assert rows[3] == rows[256]
    by_id = {r[1].split("/", 1)[1]: r for r in rows[3]}
    keys = [r[2] for r in rows[3]]
    assert len(set(keys)) == 10
    assert by_id[files[0].name][2] == files[0].stem  # one source: no source-name prefix
    assert by_id[f"{files[0].stem}.png"][2].startswith(f"{files[0].stem}_")  # + 8 hex of sha1(item_id)
    dup = by_id["zz copy.jpg"]
    assert dup[4] == "skipped:duplicate" and dup[5] == f"src/{files[0].name}"
    assert dup[3] == by_id[files[0].name][3]  # a duplicate shares its first copy's split
    assert by_id[files[2].name][6] == "a sidecar caption" and dup[6] is None


def test_the_plan_commits_without_fsync_and_restores_full_sync_even_on_error(tmp_path):
    from shardsmith.plan.ledger import Ledger

    led = Ledger(tmp_path / "l.sqlite")
    sync = lambda: led.db.execute("PRAGMA synchronous").fetchone()[0]  # noqa: E731 - 1 NORMAL, 2 FULL
    assert sync() == 2
    with pytest.raises(KeyError):
        with led.relaxed_sync():
            assert sync() == 1
            raise KeyError("a failed probe batch")
    assert sync() == 2  # plan_complete and everything after it are written with full sync
    led.close()


def test_keys_carry_the_source_name_only_when_the_recipe_has_several_sources(tmp_path):
    """One source: a sample's key is its path without the suffix (what img2dataset and the LTX
    scripts give); several sources: ``<source>_<path>``, so two sources' ``a.jpg`` never collide."""
    from media_factory import real_photos

    from shardsmith.plan import planner
    from shardsmith.plan.ledger import Ledger
    from shardsmith.recipe import recipe_from_dict
    from shardsmith.sources.base import open_sources

    for d in ("one", "two"):
        real_photos(tmp_path / d, 2, seed=4 if d == "one" else 9, min_side=64, max_side=96)
    single = recipe_from_dict({"sources": [{"path": str(tmp_path / "one")}], "outputs": [{"format": "wds"}]})
    both = recipe_from_dict({"sources": [{"path": str(tmp_path / "one")}, {"path": str(tmp_path / "two")}],
                             "outputs": [{"format": "wds"}]})
    keys = {}
    for name, recipe in (("single", single), ("both", both)):
        led = Ledger(tmp_path / f"{name}.sqlite")
        planner.make_plan(recipe, led, open_sources(recipe))
        keys[name] = [r[0] for r in led.db.execute("SELECT key FROM items ORDER BY idx")]
        led.close()
    assert keys["single"] == ["photo_00000", "photo_00001"]
    assert keys["both"] == ["one_photo_00000", "one_photo_00001", "two_photo_00000", "two_photo_00001"]
