"""Hunt 3: damaged or degenerate inputs end in one clear message and the right exit code, never a traceback
and never a silent success: JSON nested too deeply to parse, a build that writes nothing, a full disk taken for
a damaged ledger, an audio-only precomputed build refused by decode, verify hints for masks shardsmith writes,
a 1-frame clip beside a 1-frame bucket."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

import shardsmith
from tests.test_cli_mistakes import assert_message, invoke

DEEP = "[" * 100_000 + "]" * 100_000  # nested past Python's JSON parser: RecursionError from json.loads


def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (64, 64), (40 * i, 90, 10)).save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def wds_build(tmp_path_factory) -> Path:
    """A finished ``--to wds`` build of three small images (``out/wds/00000.tar``)."""
    base = tmp_path_factory.mktemp("hunt3")
    code, out = invoke("build", "--source", _images(base / "imgs"), "--to", "wds", "--out", base / "out")
    assert code == 0, out
    return base / "out"


@pytest.fixture
def build_copy(wds_build, tmp_path) -> Path:
    dest = tmp_path / "b"
    shutil.copytree(wds_build, dest)
    return dest


# -- 1: JSON nested too deeply ----------------------------------------------------------------------------------

def test_loads_json_turns_too_deep_a_nesting_into_bad_json(tmp_path):
    from shardsmith.atomic import JSONNestingError, loads_json, read_json

    with pytest.raises(json.JSONDecodeError) as got:
        loads_json(DEEP)
    assert isinstance(got.value, JSONNestingError) and isinstance(got.value, ValueError)
    assert "nested too deeply" in str(got.value) and "line 1 column" not in str(got.value)
    (tmp_path / "d.json").write_text(DEEP)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json(tmp_path / "d.json")
    assert loads_json(b'{"a": [[1]]}') == {"a": [[1]]}


@pytest.mark.parametrize("name", ["deep.json", "deep.jsonl"])
def test_a_too_deeply_nested_table_is_refused_naming_it(tmp_path, name):
    table = tmp_path / name
    table.write_text(DEEP + "\n")
    for args in (["build", "--source", table, "--to", "wds", "--out", tmp_path / "o"], ["scan", table]):
        code, out = invoke(*args)
        assert_message(code, out, name, "nested too deeply")
    assert not (tmp_path / "o").exists()


def test_a_jsonl_row_nested_too_deeply_is_that_rows_failure(tmp_path):
    _images(tmp_path, 1)
    table = tmp_path / "t.jsonl"
    table.write_text(json.dumps({"media": "0.png"}) + "\n" + DEEP + "\n"
                     + '{"media": "0.png", "x": ' + "[" * 500 + "]" * 500 + "}\n")
    code, out = invoke("build", "--source", table, "--to", "wds", "--out", tmp_path / "o")
    assert "Traceback" not in out, out
    assert "failed:bad_row x2" in out, out
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["counts"]["written"] == 1 and m["counts"]["failed"] == {"bad_row": 2}
    assert "nested too deeply" in m["counts"]["examples"]["failed:bad_row"]["detail"]  # row 1, the first
    from shardsmith.plan.ledger import Ledger

    led = Ledger(tmp_path / "o" / ".shardsmith" / "ledger.sqlite")
    details = [d for _, _, _, d in led.status_rows("wds", written=False) if d]
    led.close()
    assert any("more than 100 levels deep" in d for d in details), details
    assert code == 0, out  # a build that wrote samples and failed others: done, the failures accounted


def test_a_too_deeply_nested_manifest_is_one_message(build_copy, tmp_path):
    (build_copy / "manifest.json").write_text(DEEP)
    rep = shardsmith.verify(build_copy / "wds", world=1, workers=1).report
    check = next(c for c in rep["checks"] if c["name"] == "manifest")
    assert not check["ok"] and "manifest.json" in check["detail"] and "nested too deeply" in check["detail"]
    code, out = invoke("verify", build_copy / "wds", "--world", 1, "--workers", 1)
    assert code == 1 and "Traceback" not in out and "nested too deeply" in out, out
    code, out = invoke("report", build_copy)
    assert_message(code, out, "manifest.json", "nested too deeply", "restore it from a copy")
    code, out = invoke("build", "--source", build_copy.parent.parent / "imgs", "--to", "wds", "--out", build_copy)
    assert code != 0 and "Traceback" not in out, out  # (another recipe's folder, or this one's damaged manifest)
    code, out = invoke("decode", build_copy, "--out", tmp_path / "dec")
    assert_message(code, out, "manifest.json", "nested too deeply", "restore it from a copy")


def test_resuming_a_finished_build_with_a_damaged_manifest_is_one_message(tmp_path):
    src = _images(tmp_path / "imgs", 2)
    args = ("build", "--source", src, "--to", "wds", "--out", tmp_path / "o")
    code, out = invoke(*args)
    assert code == 0, out
    for text in (DEEP, "{"):
        (tmp_path / "o" / "manifest.json").write_text(text)
        code, out = invoke(*args)
        assert_message(code, out, "manifest.json", "restore manifest.json from a copy", "--overwrite")
        assert "nothing to do" not in out, out


def test_a_too_deeply_nested_shard_count_is_one_message(build_copy):
    wds = build_copy / "wds"
    (wds / "shard_count.json").write_text(DEEP)
    code, out = invoke("verify", wds, "--world", 1, "--workers", 1)
    assert_message(code, out, "shard_count.json", "nested too deeply", "shardsmith repair")
    code, out = invoke("inspect", wds)
    assert code == 1 and "Traceback" not in out, out
    assert "shard_count.json is not valid JSON" in out and "nested too deeply" in out, out


# -- 2: a build that writes nothing ends non-zero ---------------------------------------------------------------

def _all_bad(folder: Path) -> Path:
    """Two inputs that both fail: a .jpg that is no image, a PNG cut after 100 bytes."""
    import numpy as np

    folder.mkdir(parents=True)
    (folder / "a.jpg").write_text("x\n")
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "full.png")
    (folder / "b.png").write_bytes((folder / "full.png").read_bytes()[:100])
    (folder / "full.png").unlink()
    return folder


def test_a_build_that_writes_no_sample_exits_3_naming_the_reasons(tmp_path):
    args = ("build", "--source", _all_bad(tmp_path / "allbad"), "--to", "wds", "--out", tmp_path / "o")
    for _ in range(2):  # the run that failed them all, then the same command on the finished build
        code, out = invoke(*args)
        assert code == 3, out
        assert "Traceback" not in out and "done:" not in out, out
        assert "error: no sample was written to" in out and "all 2 inputs failed or were skipped" in out, out
        assert "failed:not_an_image 1" in out and "failed:truncated 1" in out and "--overwrite" in out, out
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())  # the accounting is still written
    assert m["counts"]["written"] == 0 and m["counts"]["failed"] == {"not_an_image": 1, "truncated": 1}


def test_one_sample_that_fails_exits_3(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    import numpy as np

    noise = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "full.png")
    (src / "b.png").write_bytes((tmp_path / "full.png").read_bytes()[:2000])  # probes, fails to decode
    code, out = invoke("build", "--source", src, "--to", "wds", "--out", tmp_path / "o", "--one-sample")
    assert code == 3 and "its one input failed or was skipped (failed:truncated 1" in out, out


def test_a_resume_that_finds_everything_written_exits_0(tmp_path):
    from shardsmith.plan.ledger import Ledger

    src = _images(tmp_path / "imgs", 2)
    args = ("build", "--source", src, "--to", "wds", "--out", tmp_path / "o")
    code, out = invoke(*args)
    assert code == 0, out
    # as killed after its last unit and before its manifest: the resume writes nothing new
    (tmp_path / "o" / "manifest.json").unlink()
    led = Ledger(tmp_path / "o" / ".shardsmith" / "ledger.sqlite")
    led.set_meta("complete", False)
    led.close()
    code, out = invoke(*args)
    assert code == 0 and "done:" in out and "2 of 2 inputs written" in out, out


def test_a_build_where_one_output_wrote_samples_exits_0(tmp_path):
    """The totals count an item written only where every output taking it wrote it: a second output that skips
    everything (max_aspect 1.0 over pictures that are not square) left them at 0, and the build exited 3."""
    import yaml

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (48 + 8 * i, 32), (40 * i, 90, 200)).save(src / f"p{i}.png")
    recipe = {"sources": [{"path": str(src)}],
              "outputs": [{"format": "wds", "name": "all"},
                          {"format": "wds", "name": "squares", "dir": "sq", "image": {"max_aspect": 1.0}}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    code, out = invoke("build", tmp_path / "r.yaml", "--out", tmp_path / "o")
    assert code == 0 and "no sample was written" not in out, out
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["outputs"]["all"]["splits"]["train"]["written"] == 3 and m["counts"]["written"] == 0


def test_nothing_written_judges_the_totals():
    from shardsmith.manifest import nothing_written

    assert nothing_written({"counts": {"inputs": 3, "written": 1}}, "o") is None
    assert nothing_written({"counts": {"inputs": 0, "written": 0}}, "o") is None
    msg = nothing_written({"counts": {"inputs": 4, "written": 0, "skipped": {"too_small": 3},
                                      "failed": {"truncated": 1},
                                      "examples": {"skipped:too_small": {"detail": "x is 8x8; set upscale"}}}}, "o")
    assert "skipped:too_small 3, failed:truncated 1; e.g. x is 8x8; set upscale" in msg


# -- 3: a full disk is not a damaged ledger ---------------------------------------------------------------------

@pytest.mark.parametrize("exc", [sqlite3.OperationalError("disk I/O error"),
                                 sqlite3.OperationalError("database or disk is full"),
                                 OSError(errno.ENOSPC, "No space left on device")])
def test_a_full_disk_says_free_space_not_damaged(build_copy, monkeypatch, capsys, exc):
    from shardsmith.build import report_after_build
    from shardsmith.plan.ledger import Ledger
    from shardsmith.report_html import ReportError, write_report

    def full(cls, path, *keys):
        raise exc

    monkeypatch.setattr(Ledger, "peek", classmethod(full))
    with pytest.raises(ReportError) as got:
        write_report(build_copy, previews=False)
    assert "Free space on" in str(got.value) and "run again" in str(got.value), got.value
    assert "damaged;" not in str(got.value) and "rebuild into a new --out" not in str(got.value)
    (build_copy / "report.html").unlink()
    assert report_after_build(build_copy) is None  # the build's last line says the same
    err = capsys.readouterr().err
    assert "Free space on" in err and "rebuild" not in err, err
    rep = shardsmith.verify(build_copy / "wds", world=1, workers=1).report
    check = next(c for c in rep["checks"] if c["name"] == "ledger")
    assert not check["ok"] and "Free space on" in check["detail"] and "damaged." not in check["detail"]


def test_a_ledger_that_is_not_a_database_is_still_damaged(build_copy):
    from shardsmith.report_html import ReportError, write_report
    from shardsmith.verify.owning_build import no_room_to_read

    (build_copy / ".shardsmith" / "ledger.sqlite").write_text("junk\n")
    with pytest.raises(ReportError, match="the ledger is damaged"):
        write_report(build_copy, previews=False)
    for exc in (sqlite3.DatabaseError("file is not a database"),
                sqlite3.DatabaseError("database disk image is malformed")):
        assert no_room_to_read(build_copy / "x", exc) is None


@pytest.mark.slow
def test_report_on_a_really_full_disk(wds_build, tmp_path):
    """A build copied onto a 3 MiB tmpfs that is then filled: report says to free space, then works."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    py = sys.executable
    script = (f"mount -t tmpfs -o size=3m tmpfs {mnt} && cp -r {wds_build} {mnt}/b && rm -f {mnt}/b/report.html && "
              f"(dd if=/dev/zero of={mnt}/fill bs=64k 2>/dev/null; true) && "
              f"{py} -m shardsmith report {mnt}/b; echo rc=$?; rm {mnt}/fill; {py} -m shardsmith report {mnt}/b; "
              "echo rc=$?")
    r = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True)
    if "mount:" in r.stderr and "rc=" not in r.stdout:
        pytest.skip(f"no tmpfs mount here: {r.stderr.strip()[:200]}")
    assert "Traceback" not in r.stderr, r.stderr
    assert f"Free space on {mnt}" in r.stderr and "damaged" not in r.stderr.replace("not the ledger damaged", "")
    assert r.stdout.count("rc=") == 2 and "rc=2" in r.stdout and r.stdout.rstrip().endswith("rc=0"), r.stdout


# -- 4: decode of an audio-only precomputed build ---------------------------------------------------------------

def test_a_precomputed_block_recording_no_latents_needs_no_latents_folder(tmp_path):
    from shardsmith.verify.decode import DecodeError, _check_present, _has_pictures

    (tmp_path / ".precomputed" / "audio_latents").mkdir(parents=True)
    block = {"format": "precomputed",
             "files": {"train": {"dir": ".precomputed", "files": {"latents": 0, "conditions": 1, "audio_latents": 1}}}}
    assert _has_pictures(block, "train", vae=True) is False
    _check_present(tmp_path, "precomputed", block, "train", pictures=False)
    block["files"]["train"]["files"]["latents"] = 2  # recorded: its folder must be there
    assert _has_pictures(block, "train", vae=True) is True
    with pytest.raises(DecodeError, match="latents .recorded in the manifest. is missing"):
        _check_present(tmp_path, "precomputed", block, "train", pictures=True)


@pytest.mark.slow
def test_decode_of_an_audio_only_precomputed_build_with_a_vae_writes_wavs(tmp_path):
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict
    from shardsmith.verify.decode import decode
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    audio_file(src / "voice.wav", kind="speech", duration=1.3, rate=22050, layout="mono")
    (src / "voice.txt").write_text("a voice", encoding="utf-8")
    rec = {"sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x9"]},
           "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}},
           "audio": {"durations": "1.0"}, "outputs": [{"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["outputs"]["precomputed"]["files"]["train"]["files"]["latents"] == 0
    rep = decode(tmp_path / "out", tmp_path / "dec", device="cpu")
    assert rep["samples"] == 0 and rep["audio"]["wavs"] == 1 and (tmp_path / "dec" / "voice.wav").is_file()


# -- 5: verify's fix for a folder shardsmith writes --------------------------------------------------------------

def test_verify_names_the_recipe_setting_that_writes_each_folder(tmp_path):
    from shardsmith.formats import precomputed as layout
    from shardsmith.verify.precomputed_audio import _fix
    from tests.test_verify_precomputed_audio import make_tree

    for d in layout.WRITTEN_DIRS:
        assert "does not write" not in _fix(d) and "process_dataset" not in _fix(d), (d, _fix(d))
    assert "mode: video-inpaint" in _fix(layout.VIDEO_MASKS) and "columns.mask" in _fix(layout.VIDEO_MASKS)
    assert "mode: audio-inpaint" in _fix(layout.AUDIO_MASKS)
    assert "mode: v2v-ic" in _fix(layout.REFERENCE_LATENTS) and "columns.reference" in _fix(layout.REFERENCE_LATENTS)
    tree = make_tree(tmp_path / "v", audio=False, audio_embeds=False)
    rep = shardsmith.verify(tree, mode="video-inpaint", world=1, workers=1).report
    detail = next(c for c in rep["checks"] if c["name"] == "folders:video-inpaint")["detail"]
    assert "video_masks/ is missing" in detail and "mode: video-inpaint" in detail, detail
    assert "does not write" not in detail and "process_dataset" not in detail, detail


# -- 6: a 1-frame clip and a 1-frame bucket ---------------------------------------------------------------------

def _geometry(buckets: str, frames: int, target_fps=None):
    from shardsmith.recipe import ImageRules
    from shardsmith.transform.buckets import parse_buckets
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    maker = LatentPixelMaker(parse_buckets(buckets), ImageRules(), target_fps)
    pr = SimpleNamespace(width=96, height=64, frames=frames, fps=24.0)
    return maker.video_geometry(SimpleNamespace(item_id="v/clip.mp4"), pr)


def test_a_one_frame_clip_takes_the_one_frame_bucket():
    from shardsmith.records import ItemError

    geom = _geometry("64x64x9;64x64x1", 1)
    assert str(geom.bucket) == "64x64x1" and list(geom.frame_indices) == [0]
    assert str(_geometry("64x64x9;64x64x1", 2, target_fps=12.0).bucket) == "64x64x1"  # 1 frame at 12 fps
    assert str(_geometry("64x64x9;64x64x1", 12).bucket) == "64x64x9"  # a clip still prefers a clip bucket
    with pytest.raises(ItemError) as got:  # a clip of 5 frames is not cut to a still
        _geometry("64x64x9;64x64x1", 5)
    detail = got.value.detail
    assert got.value.status == "skipped:too_short" and "smallest bucket's" not in detail, detail
    assert "fewer than the 9 of the shortest clip bucket" in detail and "64x64x1 would keep 1 of its 5" in detail
    with pytest.raises(ItemError, match="fewer than the smallest bucket's 9; add a shorter bucket"):
        _geometry("64x64x9", 1)  # no 1-frame bucket: the old words are right


@pytest.mark.slow
def test_scan_fits_a_one_frame_clip_into_the_one_frame_bucket(tmp_path):
    from video_factory import pan_video

    src = tmp_path / "v"
    src.mkdir()
    pan_video(src / "one.mp4", frames=1, fps=24, size=(96, 64))
    pan_video(src / "twelve.mp4", frames=12, fps=24, size=(96, 64))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"sources: [{{path: {src}}}]\ngeometry: {{buckets: [64x64x9, 64x64x1]}}\n"
                      "models: {vae: {family: ltx}, text: {family: minilm}}\noutputs: [{format: precomputed}]\n")
    code, out = invoke("scan", "--recipe", recipe)
    assert code == 0 and "too_short" not in out, out
    assert "2 item(s) fit" in out, out
