"""Leaving the process once a command's work is complete on disk, without the interpreter's teardown.

Contract
- ``done()``: called by a command whose outputs are written, closed and recorded (``build`` and ``distill``
  once their manifest is in place); nothing of that process's work is left to a destructor or an atexit hook.
- ``run(app, **kw)``: the console entry (``shardsmith`` and ``python -m shardsmith``) runs the Typer ``app``;
  when it ends with exit code 0 after ``done()``, stdout, stderr and logging are flushed and the process
  leaves with ``os._exit(0)``, skipping the teardown of torch, the models, their thread pools and (on a GPU)
  the CUDA context, which runs after the manifest and delays the shell's prompt (BENCHMARKS.md has the cost).
  Not taken while a child process or a non-daemon thread is alive (their end would be cut short), nor on
  any other exit code or exception: then Python exits as usual. An app run in-process (tests' ``CliRunner``)
  never reaches it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading

_done = False


def done() -> None:
    global _done
    _done = True


def _quick_exit_safe() -> bool:
    if multiprocessing.active_children():
        return False
    main = threading.main_thread()
    return not any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def run(app, **kw) -> None:
    try:
        app(**kw)
    except SystemExit as exc:
        if exc.code not in (0, None) or not _done or not _quick_exit_safe():
            raise
    else:
        if not _done or not _quick_exit_safe():
            return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(0)
