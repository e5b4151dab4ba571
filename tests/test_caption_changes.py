"""Captions are sources too: a sidecar ``.txt`` edited, a caption cell of a CSV / JSONL table edited, or a prompt
dataset's ``txt`` edited since the plan is a changed item, warned of exactly as changed media are. Before, a re-run
said "already holds this build, complete; nothing to do" without a word (only media bytes were compared), and a
distill resumed after its prompts were edited sampled the planned prompt beside the edited source. Now the warning
names the item, and a resumed distill fails the edited item as ``changed_since_plan``, as it fails a changed
medium."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.source_changes import source_changes
from shardsmith.sources import open_sources
from test_build import tree_bytes
from test_cli_mistakes import invoke

WARNING = "the sources changed since this build was planned"


def _wds(source, **extra) -> dict:
    return {"sources": [source], "split": {"holdout": 0},
            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2}], **extra}


def _rerun(recipe: dict, out: Path, capfd) -> str:
    capfd.readouterr()
    build(recipe_from_dict(recipe), out, quiet=True, workers=1)
    return capfd.readouterr().err


def _changes(recipe: dict, out: Path):
    return source_changes(out / ".shardsmith" / "ledger.sqlite", open_sources(recipe_from_dict(recipe)), since=0.0)


def test_an_edited_sidecar_caption_is_a_changed_item(tmp_path, capfd):
    real_photos(tmp_path / "s", 3, seed=1, min_side=40, max_side=64)
    for i, p in enumerate(sorted((tmp_path / "s").glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"cap {i}\n")
    recipe, out = _wds({"path": str(tmp_path / "s")}, lora_trigger="TRIG"), tmp_path / "out"
    build(recipe_from_dict(recipe), out, quiet=True, workers=1)
    assert WARNING not in _rerun(recipe, out, capfd)  # unchanged (the plan stored the captions with the trigger)
    before = tree_bytes(out)
    (tmp_path / "s" / "photo_00001.txt").write_text("a NEW caption\n")
    err = _rerun(recipe, out, capfd)
    assert WARNING in err and "1 changed (s/photo_00001.jpg)" in err and "--overwrite" in err, err
    assert tree_bytes(out) == before  # the build is kept as it was
    ch = _changes(recipe, out)
    assert ch.counts == {"added": 0, "gone": 0, "changed": 1} and ch.changed == ["s/photo_00001.jpg"]


@pytest.mark.parametrize("table", ["meta.csv", "meta.jsonl"])
def test_an_edited_caption_cell_of_a_table_is_a_changed_item(tmp_path, capfd, table):
    real_photos(tmp_path / "t", 4, seed=2, min_side=40, max_side=64)
    names = sorted(p.name for p in (tmp_path / "t").glob("*.jpg"))
    path = tmp_path / "t" / table
    if table.endswith(".csv"):
        path.write_text("file,text\n" + "".join(f"{n},caption {i}\n" for i, n in enumerate(names)))
    else:
        path.write_text("".join(json.dumps({"file": n, "text": f"caption {i}"}) + "\n" for i, n in enumerate(names)))
    recipe = _wds({"path": str(path), "columns": {"media": "file", "caption": "text"}})
    out = tmp_path / "out"
    build(recipe_from_dict(recipe), out, quiet=True, workers=1)
    assert WARNING not in _rerun(recipe, out, capfd)
    path.write_text(path.read_text().replace("caption 2", "an EDITED caption"))
    err = _rerun(recipe, out, capfd)
    assert WARNING in err and "1 changed (" in err and names[2] in err, err
    assert _changes(recipe, out).counts["changed"] == 1


@pytest.mark.slow
def test_a_distill_resumed_after_a_prompt_was_edited_warns_and_fails_that_prompt_as_changed(tmp_path):
    import test_distill_negative_resume as nr

    source = nr._prompt_wds(tmp_path / "pw", negative=-0.5)
    recipe, out = nr._recipe(tmp_path, source), tmp_path / "out"
    nr.STOP["armed"] = True
    try:
        code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "-q", "--no-report")
    finally:
        nr.STOP["armed"] = False
    assert code != 0 and nr.committed(out), output
    last = source / f"{nr.N // nr.PER_SHARD - 1:05d}.tar"  # the shard of the prompt not yet sampled: edit it
    with tarfile.open(last) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    time.sleep(0.01)
    with tarfile.open(last, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, data in members:
            if m.name == f"{nr.N - 1:06d}.txt":
                data = data.replace(b"prompt", b"PROMPT")  # (same length: the other members stay where planned)
            tar.addfile(m, io.BytesIO(data))
    code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "--no-report")
    assert WARNING in output and f"1 changed (pw/{last.name}/{nr.N - 1:06d})" in output, output
    said = " ".join(output.split())
    assert "an edited prompt fails as changed_since_plan" in said and "caption is written as it was planned" not in said
    led = Ledger(out / ".shardsmith" / "ledger.sqlite")
    try:
        rows = {item_id: (status, detail) for _, item_id, status, detail in led.status_rows("kd_wds", written=False)}
    finally:
        led.close()
    status, detail = rows[f"pw/{last.name}/{nr.N - 1:06d}"]
    assert status == "failed:changed_since_plan" and "changed after it was planned" in detail
    assert "--overwrite" in detail
    assert len(rows) == 1  # every other prompt was written


def test_a_build_resumed_after_a_caption_edit_writes_the_planned_caption_and_says_so(tmp_path, capfd, disk_full_at):
    """The plan holds the captions, so a resumed build writes the planned one (it does not fail the item as a
    changed file does) and its warning says exactly that."""
    src = tmp_path / "s"
    real_photos(src, 4, seed=3, min_side=40, max_side=70)
    for i, p in enumerate(sorted(src.glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"planned caption {i}")
    recipe = _wds({"path": str(src)})
    disk_full_at(1)  # the second shard fails: the build stops after the first
    with pytest.raises(OSError):
        build(recipe_from_dict(recipe), tmp_path / "o", quiet=True, workers=1)
    disk_full_at(None)
    last = sorted(src.glob("*.txt"))[-1]
    last.write_text("edited after the plan")
    said = _rerun(recipe, tmp_path / "o", capfd)
    assert WARNING in said and "an edited caption is written as it was planned" in said, said
    texts = {}
    for shard in sorted((tmp_path / "o" / "wds").glob("*.tar")):
        with tarfile.open(shard) as tf:
            texts.update({m.name: tf.extractfile(m).read().decode() for m in tf.getmembers() if m.name.endswith(".txt")})
    assert "edited after the plan" not in texts.values() and "planned caption 3" in texts.values(), texts
