"""torch's intra-op threads on a host whose cores belong to the decode workers.

- ``one_intra_op_thread()``: a block in which the calling thread's torch CPU ops run on one thread;
  the caller's setting is back afterwards. Other threads keep theirs (OpenMP's count is per thread;
  with another parallel backend the block does nothing).
- ``pin_intra_op_threads(n)``: run first on a thread that computes (the encoder thread): it keeps
  ``n`` threads even if it starts inside another thread's block. (A new thread takes torch's
  process-wide count at its first op, which such a block lowers for a moment: a CPU encoder
  started then would run on one thread and round differently from run to run.)
"""

from __future__ import annotations

import contextlib

import torch

# the per-thread count below is OpenMP's; with another backend (a process-wide pool) the block would
# change the count of every thread, a CPU encoder's included, so it does nothing there
_OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()


@contextlib.contextmanager
def one_intra_op_thread():
    """torch's intra-op parallelism off in this block, then set back. For host copies made while
    every core is busy with decode workers: torch.stack splits a batch's copy into one parallel
    region per frame, and each region's barrier waits for threads the busy cores do not schedule
    (BENCHMARKS.md §5 has the cost). One thread copies a batch at memory speed, the GIL released once.
    Other threads keep their own setting (OpenMP's thread count is per thread)."""
    n = torch.get_num_threads()
    if n == 1 or not _OPENMP:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def pin_intra_op_threads(n: int) -> None:
    """This thread computes with ``n`` intra-op threads from now on, whatever other threads set."""
    torch.get_num_threads()  # the thread's one-time initialisation from the process-wide count
    torch.set_num_threads(n)  # then its own count, which no other thread's block changes
