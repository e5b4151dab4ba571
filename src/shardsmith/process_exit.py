"""Leaving the process once a command's work is complete on disk, without the interpreter's teardown.

Contract
- ``done()``: called by a command whose outputs are written, closed and recorded (``build`` and ``distill``
  once their manifest is in place); nothing of that process's work is left to a destructor or an atexit hook.
- ``run(app, **kw)``: the console entry (``shardsmith`` and ``python -m shardsmith``) runs the Typer ``app``;
  when it ends with exit code 0 after ``done()``, stdout, stderr and logging are flushed and the process
  leaves with ``os._exit(0)``, skipping the teardown of torch, the models, their thread pools and (on a GPU)
  the CUDA context, which runs after the manifest and delays the shell's prompt (BENCHMARKS.md has the cost).
  Not taken while a child process or a non-daemon thread is alive (their end would be cut short), nor on
  an exception: then Python exits as usual. An app run in-process (tests' ``CliRunner``) never reaches it.
- An error's exit code (its message already printed: a user's mistake found mid-build, exit 2 or 3, or
  Ctrl-C) leaves the same way, with that code, when a daemon thread is still running, say a model still
  loading on the build's preload thread: the interpreter's teardown would stop that thread inside torch
  and the process would abort ("terminate called without an active exception", exit 134) instead of
  ending with its own code. With no such thread, or a child or a non-daemon thread alive, it exits as usual.
  A command that called ``done()`` and then ends with a code (a build complete on disk that holds no sample,
  exit 3) leaves at once with that code too, as after exit 0.
- ``in_command()``: whether this process runs a command through ``run`` (so a failed build need not wait for
  a model still loading: the process leaves at once, as above); False for a library caller.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading

_done = False
_command = False


def done() -> None:
    global _done
    _done = True


def _thread_alive(daemon: bool) -> bool:
    """Whether a thread other than the main one, daemon or not as asked, is still running."""
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and t.daemon == daemon for t in threading.enumerate())


def in_command() -> bool:
    return _command


def _quick_exit_safe() -> bool:
    return not multiprocessing.active_children() and not _thread_alive(daemon=False)


def run(app, **kw) -> None:
    global _command
    _command = True
    code = 0
    try:
        app(**kw)
    except SystemExit as exc:
        if exc.code in (0, None):
            if not _done or not _quick_exit_safe():
                raise
        elif not isinstance(exc.code, int) or not (_done or _thread_alive(daemon=True)) or not _quick_exit_safe():
            raise
        else:
            code = exc.code
    else:
        if not _done or not _quick_exit_safe():
            return
    _leave(code)


def _leave(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code)
