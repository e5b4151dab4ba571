"""Bounded, ordered parallel map over worker processes.

``Workers.map(maker, items)`` yields ``(item, result)`` in input order while keeping at most
``window`` chunks of ``chunk`` items in flight (one task per chunk: the per-task overhead of a
process pool is paid once per chunk), so host memory stays bounded whatever the dataset
size. ``workers <= 1`` runs inline. The maker (a picklable callable) travels with each chunk. Results
come back packed (:mod:`~shardsmith.shm_transfer`): their large arrays through shared memory, the rest
through the pool's pipe; they are unpacked (mapped) in order on a thread of their own, ahead of the
caller, whose thread then only takes them.

Workers never outlive the process that started them (:func:`exit_with_parent`): killed with
``kill -9``, a build leaves no worker holding its ledger or its files open.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from shardsmith.shm_transfer import Packed, ResultFolder, pack, unpack

PR_SET_PDEATHSIG = 1
ORPHAN_POLL_S = 0.25  # how often a worker's watcher looks for its parent


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(ORPHAN_POLL_S)
        if os.getppid() != parent:  # reparented: the parent is gone
            os._exit(1)


def exit_with_parent(parent: int, pdeathsig: bool = True) -> None:
    """Make this (forked) process end as soon as process ``parent`` is gone, however it died.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (the kernel signals the child when the thread
    that forked it ends, so only ask for it when that thread is the parent's main thread,
    ``pdeathsig``); everywhere: a daemon thread that polls ``os.getppid()`` every
    :data:`ORPHAN_POLL_S` seconds, which also covers a parent that died before the ``prctl``."""
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watcher below still ends the process
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="shardsmith-orphan-watch", daemon=True).start()


def _noop() -> None:
    return None


def _run_many(maker: Any, items: list[Any], folder: str | None = None) -> Packed:
    """A worker's chunk: its results packed, their large arrays in shared memory (``folder``)."""
    return pack([maker(it) for it in items], folder)


def _unpacked(fut: Any) -> list[Any]:
    """A chunk's results, unpacked (the unpacking thread, in submission order)."""
    return unpack(fut.result())


def _widen_pipe(conn: Any, nbytes: int) -> bool:
    """Ask Linux for a ``nbytes`` pipe buffer behind ``conn`` (False where that is refused)."""
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), nbytes)
        return True
    except (ImportError, OSError, AttributeError, ValueError):
        return False


@contextlib.contextmanager
def fork_safe_gc():
    """Around a fork: this process's garbage collected first, then what is left frozen until the block ends,
    so that a forked child never collects an object it inherited. A PyAV filter graph (an audio resampler's)
    left in a reference cycle frees its libav thread pool when collected; in a child, whose copy of that pool
    has no threads, the same free blocks forever (a plan process hung so in CI)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Workers:
    """A process pool (or inline runner) applying sample makers to items in order."""

    # The pool's results come back through one pipe (64 KiB by default): a chunk of decoded
    # images (~1.6 MB) then takes ~25 reads, each releasing and re-taking the GIL the encoder
    # and writer threads also want. A 1 MiB pipe (Linux's unprivileged maximum) takes 2.
    RESULT_PIPE_BYTES = 1 << 20

    def __init__(self, workers: int, chunk: int = 8):
        self.n, self.chunk = workers, chunk
        self.pool = None
        self.results: ResultFolder | None = None  # where results' large arrays travel (None: the pipe)
        self._unpacker: ThreadPoolExecutor | None = None
        if workers > 1:
            # one thread unpacks the chunks in submission order (mapping a chunk's file and entering its pages is
            # kernel work the caller's thread would otherwise wait for between taking results)
            self._unpacker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardsmith-unpack")
            self.results = ResultFolder.create()
            # forked from this thread (the executor starts every worker at its first submit, below)
            main = threading.current_thread() is threading.main_thread()
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"),
                                            initializer=exit_with_parent, initargs=(os.getpid(), main))
            queue = getattr(self.pool, "_result_queue", None)  # private: skipped if a Python lacks it
            self.wide_pipe = bool(queue is not None and self.RESULT_PIPE_BYTES and
                                  _widen_pipe(queue._reader, self.RESULT_PIPE_BYTES))
            # start every worker now (the executor forks lazily), before the caller loads models
            with fork_safe_gc():
                for f in [self.pool.submit(_noop) for _ in range(workers * 2)]:
                    f.result()

    def map(self, maker: Any, items: Iterable[Any], window: int | None = None,
            chunk_size: int | None = None) -> Iterator[tuple[Any, Any]]:
        """Apply the picklable callable ``maker`` to every item (it travels with each chunk).

        Items go to the workers in chunks of ``chunk`` (one round trip for several cheap
        items), except those for which ``maker.is_heavy(item)`` is true (a video clip takes
        seconds to decode): each travels alone, so the first result arrives after one item, not
        after a chunk of them, and every worker gets work. ``chunk_size`` overrides the pool's ``chunk``
        for this call (larger for items that take microseconds, such as header probes)."""
        if self.pool is None:
            for it in items:
                yield it, maker(it)
            return
        window = window or self.n * 4  # chunks in flight
        q: deque = deque()

        folder = str(self.results.path) if self.results is not None else None

        def drain_one():
            chunk, fut = q.popleft()
            yield from zip(chunk, fut.result())

        def launch(chunk_: list[Any]) -> tuple[list[Any], Any]:  # the chunk, and the future of its unpacked results
            return chunk_, self._unpacker.submit(_unpacked, self.pool.submit(_run_many, maker, chunk_, folder))

        def submit(chunk_: list[Any], limit: int):
            q.append(launch(chunk_))
            if len(q) >= limit:
                yield from drain_one()

        heavy = getattr(maker, "is_heavy", None)
        size = chunk_size or self.chunk
        chunk: list[Any] = []
        for it in items:
            if heavy is not None and heavy(it):
                if chunk:
                    yield from submit(chunk, window)
                    chunk = []
                yield from submit([it], min(window, 2 * self.n))  # a decoded clip is large: fewer in flight
                continue
            chunk.append(it)
            if len(chunk) >= size:
                yield from submit(chunk, window)
                chunk = []
        if chunk:
            q.append(launch(chunk))
        while q:
            yield from drain_one()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)  # (the unpacking thread's waits then end too)
        if self._unpacker is not None:
            self._unpacker.shutdown(cancel_futures=True)
        if self.results is not None:
            self.results.close()
