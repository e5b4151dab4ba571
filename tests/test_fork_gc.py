"""A forked worker or plan process never collects garbage it inherited (``parallel.fork_safe_gc``): a PyAV
audio resampler left in a reference cycle by the parent (an earlier in-process build, a test) made a forked
plan process hang forever when its collector freed the resampler's libav thread pool (found in CI)."""

from __future__ import annotations

import concurrent.futures as cf
import gc

import av
import numpy as np

from shardsmith.parallel import Workers


def _garbage_resampler() -> None:
    r = av.AudioResampler(format="fltp", layout="stereo", rate=16000)
    frame = av.AudioFrame.from_ndarray(np.zeros((2, 4800), np.float32), format="fltp", layout="stereo")
    frame.sample_rate = 48000
    r.resample(frame)  # its filter graph (and libav's thread pool) exists now
    cycle = {"resampler": r}
    cycle["self"] = cycle  # freed only by the collector


def _collect(_):
    gc.collect()
    return "collected"


def test_a_worker_collecting_after_the_fork_does_not_hang_on_inherited_libav_garbage():
    enabled = gc.isenabled()
    gc.disable()  # the cycle must still be there when the workers fork
    try:
        _garbage_resampler()
        pool = Workers(2)
        try:
            assert pool.pool.submit(_collect, 0).result(timeout=30) == "collected"
        except cf.TimeoutError:
            raise AssertionError("the forked worker hung collecting the parent's resampler") from None
        finally:
            if pool.pool is not None:
                for p in pool.pool._processes.values():  # a hung worker would keep close() waiting
                    p.kill()
            pool.close()
    finally:
        if enabled:
            gc.enable()
    assert gc.get_freeze_count() == 0  # the parent unfrozen again
