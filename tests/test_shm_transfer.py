"""Worker results' large arrays come back through shared memory, not the pool's one pipe
(``shardsmith.shm_transfer``; BENCHMARKS.md §7: the pipe held the audio build's decode workers back)."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from shardsmith import shm_transfer
from shardsmith.parallel import Workers
from shardsmith.records import SampleResult
from shardsmith.shm_transfer import PREFIX, ResultFolder, pack, unpack

pytestmark = pytest.mark.skipif(not shm_transfer.ROOT.is_dir(), reason="needs /dev/shm")


def _result(i: int) -> SampleResult:
    rng = np.random.default_rng(i)
    return SampleResult(idx=i, status="written", detail=f"s/{i}",
                        pixels=rng.integers(0, 255, (3, 64, 96, 3), dtype=np.uint8),
                        audio=rng.standard_normal((2, 128000)).astype(np.float32),
                        info={"small": np.arange(4)})


def _same(a: SampleResult, b: SampleResult) -> None:
    assert (a.idx, a.detail, a.status) == (b.idx, b.detail, b.status)
    for x, y in ((a.pixels, b.pixels), (a.audio, b.audio), (a.info["small"], b.info["small"])):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


@pytest.fixture
def folder():
    f = ResultFolder.create()
    if f is None:
        pytest.skip("/dev/shm has too little free space")
    yield f
    f.close()


def test_large_arrays_leave_the_pickle_and_come_back_equal_and_writable(folder):
    res = [_result(0), _result(1)]
    p = pack(res, str(folder.path))
    assert len(p.data) < 8 * 1024  # two 1 MB waveforms and two 55 kB images: none of it in the pipe's bytes
    assert p.path is not None and os.path.getsize(p.path) == p.size >= 2 * 2 * 128000 * 4
    back = unpack(p)
    assert not os.path.exists(p.path) and list(folder.path.iterdir()) == []  # unlinked once mapped
    for a, b in zip(res, back):
        _same(a, b)
    back[0].audio[0, 0] = 7.0  # writable, as an unpickled array
    assert back[0].audio[0, 0] == 7.0


def test_small_results_and_no_folder_travel_in_the_pickle(folder):
    assert pack([1, "a", np.arange(10)], str(folder.path)).path is None
    p = pack([_result(2)], None)
    assert p.path is None and len(p.data) > 1_000_000
    _same(unpack(p)[0], _result(2))


def test_a_full_tmpfs_falls_back_to_the_pipe_and_leaves_no_file(folder, monkeypatch):
    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_transfer.os, "pwrite", full)
    p = pack([_result(3)], str(folder.path))
    assert p.path is None and list(folder.path.iterdir()) == []
    _same(unpack(p)[0], _result(3))


def _big(i: int) -> np.ndarray:
    return np.full((2, 100_000), i, np.float32)


def test_workers_map_returns_every_result_in_order_and_cleans_up():
    w = Workers(2, chunk=3)
    try:
        assert w.results is not None
        got = list(w.map(_big, range(20)))
        assert [i for i, _ in got] == list(range(20))
        assert all(a.shape == (2, 100_000) and a.dtype == np.float32 and (a == i).all() for i, a in got)
        assert list(w.results.path.iterdir()) == []
        path = w.results.path
    finally:
        w.close()
    assert not path.exists()


def test_chunks_are_unpacked_ahead_on_a_thread_of_their_own(monkeypatch):
    """Mapping a chunk's file is kernel work: it runs on the pool's unpacking thread, in order and ahead of
    the caller, whose thread (the build's busiest) only takes the results."""
    import threading

    import shardsmith.parallel as parallel

    seen: list[tuple[str, int]] = []

    def recording(p):
        out = unpack(p)
        seen.append((threading.current_thread().name, int(out[0][0, 0])))
        return out

    monkeypatch.setattr(parallel, "unpack", recording)
    w = Workers(2, chunk=3)
    try:
        got = list(w.map(_big, range(12)))
    finally:
        w.close()
    assert [i for i, _ in got] == list(range(12)) and all((a == i).all() for i, a in got)
    assert [first for _, first in seen] == [0, 3, 6, 9]  # one call per chunk, in submission order
    assert {name.split("_")[0] for name, _ in seen} == {"shardsmith-unpack"}


def test_folders_of_killed_builds_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_transfer, "MIN_FREE", 0)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f"{PREFIX}{dead}-abc"
    stale.mkdir()
    (stale / "1-1").write_bytes(b"x" * 100)
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "someone-elses"
    other.mkdir()
    f = ResultFolder.create(tmp_path)
    assert f is not None and f.path.parent == tmp_path and f.path.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert not stale.exists() and live.exists() and other.exists()
    f.close()
    assert not f.path.exists()


def test_a_small_tmpfs_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_transfer, "MIN_FREE", 1 << 62)
    assert ResultFolder.create(tmp_path) is None
    assert ResultFolder.create(tmp_path / "missing") is None


def test_a_packed_result_is_small_to_pickle(folder):
    p = pack([_result(4)], str(folder.path))
    assert len(pickle.dumps(p)) < 4096
    unpack(p)
