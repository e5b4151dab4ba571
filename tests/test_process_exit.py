"""``shardsmith build`` leaves once its manifest is written, without the interpreter's teardown of torch and
the models (``shardsmith.process_exit``): the output and the "done" line are all there, exit code 0; an error
exits as usual, and so does a process with a child or a non-daemon thread still running."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time

import pytest

from shardsmith import process_exit

# the console entry, with an atexit hook that only the interpreter's normal teardown runs
ENTRY = ("import atexit, runpy; atexit.register(print, 'TEARDOWN', flush=True); "
         "runpy.run_module('shardsmith', run_name='__main__')")


@pytest.mark.slow
def test_a_complete_build_leaves_without_the_teardown_with_its_output_and_done_line(example_recipe, tmp_path):
    out = tmp_path / "qs"
    r = subprocess.run([sys.executable, "-c", ENTRY, "build", str(example_recipe), "--out", str(out), "--no-report"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"done: {out} (206 of 206 inputs written" in r.stdout  # flushed before leaving
    assert "TEARDOWN" not in r.stdout
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 206


@pytest.mark.slow
def test_a_failed_build_exits_as_usual(tmp_path):
    r = subprocess.run([sys.executable, "-c", ENTRY, "build", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout.strip().splitlines()[-1] == "TEARDOWN"


def test_no_quick_exit_while_a_non_daemon_thread_or_a_child_process_runs():
    """(The safe case, nothing left running, is the first test's, in a process of its own: a test runner's
    own threads make this one's baseline unsafe.)"""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not process_exit._quick_exit_safe()
    finally:
        stop.set()
        t.join()
    p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(5,))
    p.start()
    try:
        assert not process_exit._quick_exit_safe()
    finally:
        p.terminate()
        p.join()
