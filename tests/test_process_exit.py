"""``shardsmith build`` leaves once its manifest is written, without the interpreter's teardown of torch and
the models (``shardsmith.process_exit``): the output and the "done" line are all there, exit code 0; an error
exits as usual, unless a daemon thread (a model still loading) runs, whose teardown inside torch would abort the
process: then it leaves at once with the error's code; a process with a child or a non-daemon thread still
running exits as usual."""

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


# a build's model still loading on its daemon preload thread (torch working outside the interpreter lock)
# when a mistake found mid-build ends the process: here a recipe that does not exist
LOADING = ("import atexit, threading, runpy, torch\n"
           "def load():\n"
           "    while True:\n"
           "        torch.nn.init.kaiming_uniform_(torch.empty(1024, 1024)); torch.randn(512, 512).matmul(torch.randn(512, 512))\n"
           "threading.Thread(target=load, name='shardsmith-model-preload', daemon=True).start()\n"
           "atexit.register(print, 'TEARDOWN', flush=True)\n"
           "runpy.run_module('shardsmith', run_name='__main__')\n")


@pytest.mark.slow
def test_an_error_while_a_model_still_loads_ends_with_its_own_code_not_an_abort(tmp_path):
    """The interpreter's teardown stops a daemon thread wherever it is; inside torch that aborts the process
    ('terminate called without an active exception', exit 134) after the error's message. An error's exit
    code leaves without that teardown while such a thread runs (three runs: the abort was every run before)."""
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", LOADING, "build", str(tmp_path / "none.yaml"), "--out",
                            str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        assert "error:" in r.stderr and "terminate called" not in r.stderr and "Traceback" not in r.stderr
        assert "TEARDOWN" not in r.stdout


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
