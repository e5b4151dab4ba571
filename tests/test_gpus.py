"""``--gpus N`` (issue 21): one worker process per GPU claims the units of an output's split; the files
are the very bytes of a one-process build, and a worker that dies mid-run has its unit written by the
build. On this CPU machine the workers run the same code on CPU "devices" (``SHARDSMITH_WORKER_DEVICES``,
the test hook of :mod:`shardsmith.distribute.gpus`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from media_factory import real_photos
from test_build import tree_bytes
from test_cli_mistakes import assert_message, invoke

PY = sys.executable


def _recipe(tmp: Path) -> Path:
    photos = real_photos(tmp / "photos", 20, seed=4, min_side=64, max_side=120)
    for i, p in enumerate(photos):
        p.with_suffix(".txt").write_text(f"a photo, number {i % 7}")  # repeated captions: encoded once each
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"path": "photos"}], "split": {"holdout": 3, "seed": 2},
        "geometry": {"buckets": ["64x64x1", "64x48x1"]},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu",
                   "batch_size": 4},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 3},
                    {"format": "prompt_wds", "dir": "prompts", "samples_per_shard": 4}]}))
    return path


def _ahead_recipe(tmp: Path) -> Path:
    """24 captioned photos, no count holdout (the plan runs ahead of the output), units of 3."""
    photos = real_photos(tmp / "photos", 24, seed=7, min_side=64, max_side=120)
    for i, p in enumerate(photos):
        p.with_suffix(".txt").write_text(f"a photo, number {i % 5}")
    recipe = tmp / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": "photos"}], "geometry": {"buckets": ["64x64x1"]},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu",
                   "batch_size": 4},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 3}]}))
    return recipe


def _build(recipe: Path, out: Path, *extra, env=None) -> subprocess.CompletedProcess:
    """One build; every one of them computes with one intra-op thread, as each worker of two does on this
    2-core machine: MKL splits a matrix product by its thread count, and on some CPUs the last bits follow."""
    return subprocess.run([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--workers", "2",
                           "--no-report", *extra], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpus")
    recipe = _recipe(tmp)
    r = _build(recipe, tmp / "one")
    assert r.returncode == 0, r.stderr
    return recipe, tree_bytes(tmp / "one")


@pytest.mark.slow
def test_two_workers_write_the_bytes_of_one_process_for_latent_and_text_outputs(reference, tmp_path):
    recipe, want = reference
    r = _build(recipe, tmp_path / "two", "--gpus", "2", env={"SHARDSMITH_WORKER_DEVICES": "cpu,cpu"})
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "two") == want
    m = json.loads((tmp_path / "two" / "manifest.json").read_text())
    # models.compile as the workers decided it at their first batch (kept in the ledger), not as worker 0 loaded
    assert m["models"]["compile"] == {"setting": "auto", "compiled": False, "reason": "auto: stays eager off the GPU"}
    for name in ("latent_wds", "prompt_wds"):
        d = m["outputs"][name]["distribute"]["train"]
        assert d["gpus"] == 2 and d["died"] == [] and [w["exit_code"] for w in d["workers"]] == [0, 0]
        per = 3 if name == "latent_wds" else 4
        assert sum(w["units"] for w in d["workers"]) == -(-17 // per)  # 20 photos, 3 held out: every unit once
        # (which worker takes how many units is a race: the first one free takes the next, and on 2 cores one
        # worker may finish loading first and take all six; that each worker claims units is the next test's)


@pytest.mark.slow
def test_a_worker_that_dies_mid_run_has_its_unit_written_and_the_bytes_are_the_same(reference, tmp_path):
    recipe, want = reference
    # each worker dies as it claims its first unit (the first worker free takes units as soon as it is
    # free, so which worker claims a second unit is a race; every worker claims a first one)
    r = _build(recipe, tmp_path / "two", "--gpus", "2",
               env={"SHARDSMITH_WORKER_DEVICES": "cpu,cpu", "SHARDSMITH_WORKER_EXIT": "0:0,1:0"})
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "two") == want
    d = json.loads((tmp_path / "two" / "manifest.json").read_text())["outputs"]["latent_wds"]["distribute"]["train"]
    assert d["died"] == [0, 1] and [w["exit_code"] for w in d["workers"]] == [1, 1]
    said = " ".join(r.stderr.split())  # (the console wraps long lines)
    assert said.count("stopped (exit code 1); this process writes what it left") >= 2  # said, for each


def test_more_gpus_than_the_machine_has_is_one_message_before_anything_runs(tmp_path):
    os.environ.pop("SHARDSMITH_WORKER_DEVICES", None)
    (tmp_path / "photos").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": "photos"}], "geometry": {"buckets": ["64x64x1"]},
                                      "models": {"vae": {"family": "sd", "config": "tiny"}},
                                      "outputs": [{"format": "latent_wds"}]}))
    code, output = invoke("build", recipe, "--out", tmp_path / "out", "--gpus", "2")
    assert_message(code, output, "--gpus", "torch sees 0 CUDA device")
    assert not (tmp_path / "out").exists()
    code, output = invoke("build", recipe, "--out", tmp_path / "out", "--gpus", "two")
    assert_message(code, output, "--gpus 'two'")


def _kill_and_resume(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    """``--gpus 2`` killed with -9 once 2 shards are written (its workers must go with it, nothing writes
    afterwards), then the same command."""
    import signal
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "SHARDSMITH_WORKER_DEVICES": "cpu,cpu"}
    p = subprocess.Popen([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--workers", "2",
                          "--no-report", "-q", "--gpus", "2"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline and len(list(out.rglob("*.tar"))) < 2:
        time.sleep(0.05)
    assert p.poll() is None, "the build ended before it could be killed"

    def spawned(parents: set[str]) -> list[str]:  # this build's spawned workers (not another test's)
        rows = [ln.split(None, 2) for ln in subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True,
                                                             text=True).stdout.splitlines()[1:]]
        return [r[0] for r in rows if len(r) == 3 and r[1] in parents and "multiprocessing.spawn" in r[2]]

    workers = spawned({str(p.pid)})
    assert workers, "the build's GPU workers were not found"
    os.kill(p.pid, signal.SIGKILL)  # the build's process only: its workers must go with it
    p.wait()
    # A worker that runs ends at once (PR_SET_PDEATHSIG); one still starting (a spawned interpreter importing
    # the CLI's modules, seconds on a loaded machine: the build writes units itself meanwhile) ends as soon as
    # its first line runs (exit_with_parent). Neither has opened the ledger or a shard before that.
    deadline = time.monotonic() + 20
    while (left := [w for w in workers if os.path.exists(f"/proc/{w}")]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"workers {left} of the killed build still run"
    before = {f: f.stat().st_mtime_ns for f in out.rglob("*.tar")}
    time.sleep(1.0)
    assert before == {f: f.stat().st_mtime_ns for f in out.rglob("*.tar")}  # nothing writes there any more
    return _build(recipe, out, "--gpus", "2", env={"SHARDSMITH_WORKER_DEVICES": "cpu,cpu"})


@pytest.mark.slow
def test_kill_9_of_the_build_takes_its_workers_and_the_resume_gives_the_same_bytes(reference, tmp_path):
    recipe, want = reference
    r = _kill_and_resume(recipe, tmp_path / "two")
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "two") == want


@pytest.mark.slow
def test_kill_9_while_the_workers_follow_a_plan_running_ahead_resumes_to_the_same_bytes(tmp_path):
    recipe = _ahead_recipe(tmp_path)
    assert _build(recipe, tmp_path / "one").returncode == 0
    r = _kill_and_resume(recipe, tmp_path / "two")
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "two") == tree_bytes(tmp_path / "one")


@pytest.mark.slow
def test_the_ray_engine_writes_the_same_bytes_on_a_local_cluster_even_when_an_actor_is_lost(reference, tmp_path):
    pytest.importorskip("ray")
    recipe, want = reference
    hook = {"SHARDSMITH_WORKER_DEVICES": "cpu,cpu"}
    r = _build(recipe, tmp_path / "ray", "--gpus", "2", "--engine", "ray", env=hook)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "ray") == want
    d = json.loads((tmp_path / "ray" / "manifest.json").read_text())["outputs"]["latent_wds"]["distribute"]["train"]
    assert d["engine"] == "ray" and d["failed_units"] == [] and sum(w["units"] for w in d["workers"]) == 6
    # models.compile as the driver kept it for the actors, which do not write the ledger; a resume follows it
    from shardsmith.encode.compile_record import LEDGER_KEY
    from shardsmith.plan.ledger import Ledger

    kept, = Ledger.peek(tmp_path / "ray" / ".shardsmith" / "ledger.sqlite", LEDGER_KEY)
    assert kept["compiled"] is False and kept["reason"].startswith("auto: eager on the Ray engine"), kept
    # actor 1 is lost as it is given its first unit (every actor gets one at the start)
    r = _build(recipe, tmp_path / "lost", "--gpus", "2", "--engine", "ray", env={**hook, "SHARDSMITH_WORKER_EXIT": "1:0"})
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "lost") == want  # the lost actor's unit was written by the build
    d = json.loads((tmp_path / "lost" / "manifest.json").read_text())["outputs"]["latent_wds"]["distribute"]["train"]
    assert [f["actor"] for f in d["failed_units"]] == [1]


class _GrowingPlan:
    """A ledger whose plan grows by ``step`` eligible items per look, complete at ``total``."""

    def __init__(self, total: int, step: int):
        self.total, self.step, self.n, self.looks = total, step, 0, 0

    def get_meta(self, key):
        assert key == "plan_complete"
        self.looks += 1
        self.n = min(self.total, self.n + self.step)
        return self.n == self.total if self.looks > 1 else False

    def eligible(self, split, sources):
        return self.n


def test_workers_ahead_of_the_plan_take_each_unit_once_final_and_end_with_the_complete_plans_units():
    from shardsmith.distribute.gpus import final_units
    from shardsmith.units.plan import plan_units

    for total, step, per in ((17, 2, 3), (12, 5, 4), (1, 1, 8), (0, 0, 3)):
        led = _GrowingPlan(total, step)
        got = []
        for job in final_units(led, "o", "train", [0], per, poll_s=0):
            assert job.next_pos <= led.n  # never before its rows are in the ledger
            assert job.size == per or led.n == led.total  # a short unit only once the plan is complete
            got.append(job)
        assert got == plan_units("o", "train", total, per)


@pytest.mark.slow
def test_workers_start_on_a_plan_still_running_and_write_the_bytes_of_one_process(tmp_path):
    """No count holdout: the plan runs ahead in its own process and the workers take its final units."""
    recipe = _ahead_recipe(tmp_path)
    assert _build(recipe, tmp_path / "one").returncode == 0
    # two decode processes per worker: a worker's own pool has child processes
    r = _build(recipe, tmp_path / "two", "--gpus", "2", "--workers", "4", env={"SHARDSMITH_WORKER_DEVICES": "cpu,cpu"})
    assert r.returncode == 0, r.stderr
    assert "stopped" not in r.stderr
    assert tree_bytes(tmp_path / "two") == tree_bytes(tmp_path / "one")
    m = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert m["timings"]["plan_ahead"] is True
    d = m["outputs"]["latent_wds"]["distribute"]["train"]
    assert d["died"] == [] and sum(w["units"] for w in d["workers"]) == 8  # 24 photos in units of 3
    assert all(w["load_s"] > 0 and w["exit_code"] == 0 for w in d["workers"])  # (the first loaded may take all)
    # the negative prompt's embedding, encoded on a worker (the same bytes: the trees are equal)
    assert m["outputs"]["latent_wds"]["files"]["train"]["neg_prompt_emb"] == "neg_prompt_emb.npy"


@pytest.mark.slow
def test_distill_on_two_workers_writes_the_bytes_of_one_process(tmp_path):
    """kd_wds: the teacher's trajectories, its preview and index, written by the GPU workers (the build's own
    process holds no model: the index is made from worker 0's description)."""
    from test_distill_build import _distill, _recipe

    recipe = _recipe(tmp_path)
    one = _distill(recipe, tmp_path / "one")
    assert one.returncode == 0, one.stderr
    two = subprocess.run([PY, "-m", "shardsmith", "distill", str(recipe), "--out", str(tmp_path / "two"), "--workers",
                          "2", "--gpus", "2"], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "SHARDSMITH_WORKER_DEVICES": "cpu,cpu"})
    assert two.returncode == 0, two.stderr
    assert tree_bytes(tmp_path / "two") == tree_bytes(tmp_path / "one")
    d = json.loads((tmp_path / "two" / "manifest.json").read_text())["outputs"]["kd_wds"]["distribute"]["train"]
    assert d["died"] == [] and sum(w["units"] for w in d["workers"]) > 0
