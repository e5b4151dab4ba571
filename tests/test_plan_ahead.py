"""A latent output starts on the plan's committed rows while the plan goes on (plan/ahead.py):
same bytes as planning first, and a build killed before its plan completed resumes cleanly even
when its sources changed in between."""

import io
import json
import re
import os
import shutil
import sqlite3
import time

import pytest
from rich.console import Console

import shardsmith.build as build_mod
import shardsmith.plan.ahead as ahead_mod
import shardsmith.plan.planner as planner
from media_factory import real_photos
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture()
def photos(tmp_path):
    """Real photos with sidecar captions, one exact duplicate and one truncated file."""
    src = tmp_path / "p"
    paths = real_photos(src, 11, seed=21, min_side=40, max_side=90)
    for i, p in enumerate(paths):
        p.with_suffix(".txt").write_text(f"photo number {i}")
    shutil.copy(paths[3], src / "zz_copy_of_3.jpg")
    (src / "zz_truncated.jpg").write_bytes(paths[5].read_bytes()[:300])
    return src


def _recipe(src, holdout=0.25):
    return recipe_from_dict({
        "sources": [{"path": str(src)}], "split": {"holdout": holdout, "seed": 7},
        "geometry": {"buckets": ["32x32x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 2},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2},
                    {"format": "precomputed"}]})


@pytest.fixture()
def slow_plan(monkeypatch, tmp_path):
    """Plan batches of 2 rows; after the sixth item each probe (in the plan process) waits until
    the output has its models and has taken its first rows, then 0.5 s: the plan is still
    running while units are written. The two processes signal through a file."""
    monkeypatch.setattr(planner, "BATCH", 2)
    flag = tmp_path / "output-started"
    real_stage = build_mod._stage

    def stage(ctx):
        st = real_stage(ctx)
        flag.touch()
        return st

    monkeypatch.setattr(build_mod, "_stage", stage)
    real = planner.probe_item
    seen = []

    def slow(item, max_pixels, *rest):
        seen.append(item)
        if len(seen) > 6:
            _wait_for(flag)
            time.sleep(0.5)
        return real(item, max_pixels, *rest)

    monkeypatch.setattr(planner, "probe_item", slow)


def _wait_for_a_unit(ledger, timeout=60):
    """Until the plan-ahead build's ledger records a written unit (at once for any other build)."""
    if not ledger.exists():
        return
    db = sqlite3.connect(ledger, timeout=30)
    deadline = time.monotonic() + timeout
    try:
        while db.execute("SELECT COUNT(*) FROM shards").fetchone()[0] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        db.close()


def _wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.slow
def test_planning_ahead_writes_the_bytes_of_a_plan_first_build(photos, tmp_path, slow_plan, monkeypatch):
    early = []
    commit = Ledger.commit_unit

    def spy(self, **kw):  # was the plan complete when this unit was committed?
        early.append(not self.get_meta("plan_complete"))
        return commit(self, **kw)

    monkeypatch.setattr(Ledger, "commit_unit", spy)
    real = ahead_mod.make_plan

    def waits(recipe, ledger, sources, on_batch, **kw):  # a loaded machine stages slower than the probes' sleeps:
        def on_batch_then_wait(next_idx):  # the plan's end waits (in its process) until a unit is written
            on_batch(next_idx)
            if next_idx >= 12:  # 12 rows: at least one unit is recorded once four are sealed
                _wait_for_a_unit(tmp_path / "ahead" / ".shardsmith" / "ledger.sqlite")
        return real(recipe, ledger, sources, on_batch=on_batch_then_wait, **kw)

    monkeypatch.setattr(ahead_mod, "make_plan", waits)
    m = build(_recipe(photos), tmp_path / "ahead", quiet=True, workers=1)
    assert m["timings"]["plan_ahead"] is True and any(early), "no unit was written while the plan ran"
    assert m["counts"]["inputs"] == 13 and m["counts"]["written"] == 11
    assert m["counts"]["skipped"] == {"duplicate": 1} and sum(m["counts"]["failed"].values()) == 1

    monkeypatch.setattr(build_mod, "PLAN_AHEAD", False)
    early.clear()
    ref = build(_recipe(photos), tmp_path / "first", quiet=True, workers=1)
    assert "plan_ahead" not in ref["timings"] and not any(early)
    assert tree_bytes(tmp_path / "ahead") == tree_bytes(tmp_path / "first")
    assert m["outputs"] == ref["outputs"] and m["splits"] == ref["splits"]


@pytest.mark.slow
def test_a_build_killed_while_planning_ahead_resumes_over_changed_sources(photos, tmp_path, slow_plan, monkeypatch):
    """The plan dies after units were committed ahead of it; then three photos are deleted. The
    resume redoes the plan, removes what was written ahead (and says so) and gives the bytes of
    a fresh build of the smaller folder: no shard of the old plan is left behind."""
    out = tmp_path / "o"
    real = ahead_mod.make_plan

    def dies(recipe, ledger, sources, on_batch, **kw):
        def on_batch_then_die(next_idx):
            on_batch(next_idx)
            if next_idx >= 12:  # 12 rows: at least one unit is recorded once four are sealed
                db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
                deadline = time.monotonic() + 60
                while db.execute("SELECT COUNT(*) FROM shards").fetchone()[0] < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                db.close()
                raise RuntimeError("simulated crash while planning")
        return real(recipe, ledger, sources, on_batch=on_batch_then_die, **kw)

    monkeypatch.setattr(ahead_mod, "make_plan", dies)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build(_recipe(photos, holdout=0), out, quiet=True, workers=1)
    db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
    assert db.execute("SELECT COUNT(*) FROM shards").fetchone()[0] >= 1
    assert db.execute("SELECT COUNT(*) FROM meta WHERE key='plan_complete'").fetchone()[0] == 0
    db.close()
    before = sorted(p.name for p in (out / "lat").glob("*.tar"))
    assert len(before) >= 1

    for p in sorted(photos.glob("*.jpg"))[:3]:
        p.unlink()
    monkeypatch.setattr(ahead_mod, "make_plan", real)
    buf = io.StringIO()
    m = build(_recipe(photos, holdout=0), out, console=Console(file=buf, width=200))
    assert "the plan was unfinished; removed lat/" in buf.getvalue()
    assert m["counts"]["inputs"] == 10 and m["counts"]["written"] == 8
    ref = build(_recipe(photos, holdout=0), tmp_path / "fresh", quiet=True, workers=1)
    assert tree_bytes(out) == tree_bytes(tmp_path / "fresh")
    assert sorted(p.name for p in (out / "lat").glob("*.tar")) == ["00000.tar", "00001.tar", "00002.tar",
                                                                   "00003.tar"]
    assert ref["counts"] == m["counts"]


@pytest.mark.slow  # (a build with models: ~5 s)
def test_a_count_holdout_plans_first(photos, tmp_path):
    """With a holdout of N items the splits are known only once every item is planned."""
    m = build(_recipe(photos, holdout=2), tmp_path / "o", quiet=True, workers=1)
    assert "plan_ahead" not in m["timings"] and m["splits"]["holdout"]["written"] == 2


@pytest.mark.slow
def test_plan_and_output_bars_share_one_display(photos, tmp_path, slow_plan):
    buf = io.StringIO()
    # bars are drawn on a terminal only (issue 16): this console is one, without colours
    console = Console(file=buf, width=200, force_terminal=True, color_system=None)
    m = build(_recipe(photos, holdout=0), tmp_path / "o", console=console, workers=1)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", buf.getvalue())
    assert m["timings"]["plan_ahead"] is True
    rows = {line.split()[0]: line for line in re.split(r"[\r\n]", text) if "━" in line}
    assert {"plan", "latent_wds/train", "precomputed/train"} <= set(rows)
    # the plan's total is the listed items (counted from the listing while it probes)
    assert "13/13" in rows["plan"] and "11/11" in rows["latent_wds/train"]


def test_the_output_commits_units_while_the_plan_commits_rows(tmp_path, monkeypatch):
    """SQLite cannot turn a connection's open read into a write once another connection has
    committed: the rows the output takes must not keep a statement open while it commits a unit.
    Batches of 600 rows (more than one fetch), a unit committed every 100 rows taken."""
    from shardsmith.plan.ahead import PlanAhead
    from shardsmith.records import PlannedItem

    def row(i):
        return PlannedItem(idx=i, item_id=f"i{i}", key=f"k{i}", source=0, path=f"/x/{i}.jpg", relpath=f"{i}.jpg",
                           caption=None, label=None, label_name=None, meta={}, sha256=None, size_bytes=1, kind="image",
                           width=8, height=8, image_format="JPEG", mode="RGB", split="train", plan_status="ok")

    def fake_plan(recipe, ledger, sources, on_item, workers, on_batch):
        for b in range(3):
            with ledger.transaction():
                ledger.add_items([row(i) for i in range(600 * b, 600 * (b + 1))])
            on_batch(600 * (b + 1))
            _wait_for(tmp_path / f"took-{b}", 30)  # the output has started on this batch: commit the next
        ledger.set_meta("plan_complete", True)

    monkeypatch.setattr(ahead_mod, "make_plan", fake_plan)
    led = Ledger(tmp_path / "ledger.sqlite")
    ahead = PlanAhead(None, led.path, []).start()
    seen = []
    try:
        for it in ahead.items(led, split="train", sources=[0]):
            seen.append(it.idx)
            if it.idx % 600 == 1:
                (tmp_path / f"took-{it.idx // 600}").touch()
                time.sleep(0.1)  # the plan process commits its next batch now
            if it.idx % 100 == 0:
                led.commit_unit(output="o", split="train", seq=it.idx // 100, name=f"u{it.idx}", first_pos=it.idx,
                                next_pos=it.idx + 100, count=0, nbytes=0, sha256="", results=[])
        ahead.wait()
    finally:
        ahead.close()
    assert seen == list(range(1800)) and len(led.units("o", "train")) == 18
    led.close()


def test_an_error_in_the_plan_process_reaches_the_build_with_its_traceback(photos, tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise ValueError("the source table has a bad row 17")

    monkeypatch.setattr(ahead_mod, "make_plan", broken)
    with pytest.raises(ValueError, match="bad row 17") as e:
        build(_recipe(photos), tmp_path / "o", quiet=True, workers=1)
    assert any("in the plan process" in n and "broken" in n for n in getattr(e.value, "__notes__", []))


@pytest.mark.slow
def test_the_plan_process_stops_when_the_build_process_is_killed(photos, tmp_path):
    """kill -9 of the build process alone (not its group): the plan process must not plan on into
    the ledger, where the next run's own plan would meet its rows."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(f"""
import time, shardsmith.plan.planner as planner
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
real = planner.probe_item
def slow(item, max_pixels):
    time.sleep(0.3)
    return real(item, max_pixels)
planner.probe_item = slow
planner.BATCH = 4
build(recipe_from_dict({{"sources": [{{"path": {str(photos)!r}}}], "geometry": {{"buckets": ["32x32x1"]}},
      "images": {{"upscale": True}}, "models": {{"vae": {{"family": "sd"}}}},
      "outputs": [{{"format": "latent_wds", "dir": "lat"}}]}}), {str(tmp_path / "o")!r}, quiet=True, workers=1)
""")
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    ledger = tmp_path / "o" / ".shardsmith" / "ledger.sqlite"

    def planned() -> int:
        try:
            db = sqlite3.connect(ledger)
            try:
                return db.execute("SELECT COUNT(*) FROM items").fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error:
            return 0

    try:
        deadline = time.monotonic() + 60
        while planned() < 4 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.01)
        n = planned()  # a batch was just committed: the next one is 4 x 0.3 s away
        assert p.poll() is None and n == 4, "the plan did not start"
        os.kill(p.pid, signal.SIGKILL)  # the build process only: its plan process lives on
        p.wait()
        time.sleep(3)  # an orphan that planned on would have committed its next batch by now
        assert planned() == n, "the plan process went on planning after the build process died"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("outputs", ["latent_wds,precomputed", "precomputed"])
def test_items_decode_while_the_models_load(photos, tmp_path, monkeypatch, outputs):
    """The output does not wait for the models before it starts: the decode workers work on the
    first items while the models load (2 s here), and the models are waited for at the first batch.
    A new ``.precomputed/`` tree too, although its stamp names the loaded models (written before its
    first files)."""
    from shardsmith.encode.stage import EncodeStage
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    log = tmp_path / "decoded.txt"
    decode = LatentPixelMaker.__call__

    def logged(self, item):
        res = decode(self, item)
        with open(log, "a") as f:  # in the worker processes
            f.write(f"{time.time()}\n")
        return res

    monkeypatch.setattr(LatentPixelMaker, "__call__", logged)
    load = EncodeStage.from_recipe.__func__
    started, ready = [], []

    def slow_load(cls, recipe):
        started.append(time.time())
        time.sleep(2.0)
        st = load(cls, recipe)
        ready.append(time.time())
        return st

    monkeypatch.setattr(EncodeStage, "from_recipe", classmethod(slow_load))
    recipe = _recipe(photos, holdout=0)
    recipe.outputs = [o for o in recipe.outputs if o.format in outputs.split(",")]
    m = build(recipe, tmp_path / "o", quiet=True, workers=2)
    assert m["counts"]["written"] == 11
    stamp = json.loads((tmp_path / "o" / ".precomputed" / "shardsmith.json").read_text())
    assert stamp["vae"]["family"] == "sd" and stamp["buckets"] == ["32x32x1"]
    stamps = [float(x) for x in log.read_text().split()]
    early = [t for t in stamps if t < ready[0]]
    assert len(early) >= 4, (len(early), len(stamps))  # several items decoded before the models were ready
    # what the build waited for the models, at its first batch, is less than their load took
    assert m["timings"]["load_models_s"] < ready[0] - started[0]


@pytest.mark.slow
def test_an_output_folder_linked_out_of_the_build_folder_plans_first(photos, tmp_path, monkeypatch):
    """What is written ahead of an unfinished plan is removed on resume, only strictly inside the build folder
    (never through a link), so only an output whose folder lies strictly inside it may start early. ``dir: .`` is
    refused when the recipe is read; what still leads out is a link the user put in the folder of a build that
    stopped while planning (here its latents moved to another disk): the resume plans first, then writes there."""
    out, disk = tmp_path / "o", tmp_path / "other_disk"

    def stops(*a, **k):
        raise RuntimeError("simulated crash while planning")

    monkeypatch.setattr(ahead_mod, "make_plan", stops)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build(_recipe(photos, holdout=0), out, quiet=True, workers=1)
    assert Ledger.peek(out / ".shardsmith" / "ledger.sqlite", "plan_complete") == (None,)
    monkeypatch.undo()
    shutil.rmtree(out / "lat", ignore_errors=True)
    disk.mkdir()
    (out / "lat").symlink_to(disk)
    m = build(_recipe(photos, holdout=0), out, quiet=True, workers=1)
    assert "plan_ahead" not in m["timings"] and m["timings"].get("plan_apart") is True  # planned first
    assert m["counts"]["written"] == 11
    assert sorted(p.name for p in disk.glob("*.tar")) == [f"{i:05d}.tar" for i in range(6)]


@pytest.mark.slow
def test_a_plan_first_build_with_models_plans_apart_with_the_bytes_of_an_in_process_plan(photos, tmp_path, monkeypatch):
    """A plan that must end before the outputs start (here: a holdout of N items) runs in its own process
    while this one loads the models, so the plan's rows do not share the interpreter lock with the
    models' imports (BENCHMARKS.md §7); the files and counts are those of a plan made in-process."""
    m = build(_recipe(photos, holdout=2), tmp_path / "apart", quiet=True, workers=1)
    assert m["timings"].get("plan_apart") is True and "plan_ahead" not in m["timings"]
    monkeypatch.setattr(build_mod, "PLAN_AHEAD", False)  # tests' switch: the plan in the build's process
    ref = build(_recipe(photos, holdout=2), tmp_path / "here", quiet=True, workers=1)
    assert "plan_apart" not in ref["timings"]
    assert m["counts"] == ref["counts"] and m["outputs"] == ref["outputs"] and m["splits"] == ref["splits"]
    assert m["splits"]["holdout"]["written"] == 2
    assert tree_bytes(tmp_path / "apart") == tree_bytes(tmp_path / "here")


@pytest.mark.slow
def test_a_model_that_cannot_load_stops_a_plan_apart_at_once(photos, tmp_path, monkeypatch):
    """The build waits for its plan apart while checking its model load: a load error ends the build in
    seconds, not after the plan (each probe here takes 2 s: 26 s of plan)."""
    import shardsmith.encode.stage as stage_mod

    real_call = planner.Prober.__call__

    def slow_probe(self, item):
        time.sleep(2)
        return real_call(self, item)

    def no_weights(*a, **k):
        raise RuntimeError("the VAE's weights are missing")

    monkeypatch.setattr(planner.Prober, "__call__", slow_probe)  # (the plan process is forked: it has these)
    monkeypatch.setattr(stage_mod, "load_vae", no_weights)
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="weights are missing"):
        build(_recipe(photos, holdout=2), tmp_path / "o", quiet=True, workers=1)
    assert time.perf_counter() - t < 20


@pytest.mark.slow
def test_a_new_precomputed_tree_that_gets_no_item_is_still_stamped(photos, tmp_path):
    """The stamp waits for the first unit's files; a tree whose every item fails gets it at its end, so a
    later build with other encoders is still refused."""
    src = tmp_path / "bad"
    src.mkdir()
    (src / "a.jpg").write_bytes((photos / "zz_truncated.jpg").read_bytes())
    recipe = _recipe(src, holdout=0)
    recipe.outputs = [o for o in recipe.outputs if o.format == "precomputed"]
    m = build(recipe, tmp_path / "o", quiet=True)
    assert m["counts"]["written"] == 0 and m["counts"]["failed"] == {"decode_error": 1}
    stamp = json.loads((tmp_path / "o" / ".precomputed" / "shardsmith.json").read_text())
    assert stamp["vae"]["family"] == "sd" and stamp["text"]["family"] == "minilm"
