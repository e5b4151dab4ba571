"""What a build writes under an item's name is that item's: ``.precomputed/`` files of two items that
mirror to one path (``x.jpg`` and ``x.png``, two table rows of one clip) get unique names decided from
the plan (the same on a resume), paired across every folder; a source name that is no folder name is
refused; a partner file (reference, edit source, mask, camera) is read as the plan hashed it, so one
changed since the plan fails its item as ``<role>_changed_since_plan`` and one gone as
``<role>_vanished`` instead of writing another file's latents or a traceback; camera rows float32
cannot hold and audio masks decoded from NaN samples fail their item instead of being written as inf,
0 or an all-zero mask."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from media_factory import source_photo
from shardsmith import build as build_mod
from shardsmith import formats
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import ItemError, MediaRef, PlannedItem
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.geometry import decide
from shardsmith.transform.partners import ConditionCutter, PartnerCutter
from test_build import tree_bytes
from test_cli_mistakes import assert_message, invoke
from video_factory import pan_video

FPS = 24


def _photo(name: str, size: int = 64) -> Image.Image:
    return source_photo(name).convert("RGB").resize((size, size))


def _pt_names(tree: Path, folder: str) -> list[str]:
    return formats.precomputed.cache_files(tree, folder) if (tree / folder).is_dir() else []


def _digest_name(stem: str, item_id: str) -> str:
    """``<stem>_<8 hex>.pt``: the digest :func:`shardsmith.formats.unique_key` gives ``item_id``."""
    return f"{stem}{formats.unique_key('', item_id)}.pt"


# ------------------------------------------------------------------ .precomputed/ names are unique


def _same_stem_folder(src: Path) -> None:
    src.mkdir()
    _photo("astronaut").save(src / "x.jpg", quality=95)
    _photo("rocket").save(src / "x.png")
    _photo("coffee").save(src / "y.jpg", quality=95)


def _same_stem_recipe(src: Path, unit: int = 1):
    return recipe_from_dict({"sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x1"]},
                             "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 2},
                             "outputs": [{"format": "precomputed", "unit": unit}]})


@pytest.mark.slow
def test_media_of_one_stem_get_their_own_precomputed_files_decided_by_the_plan(tmp_path, monkeypatch):
    """x.jpg and x.png both mirror to x.pt: the item planned first keeps it, the other is x_<8 hex>.pt in every
    folder; a build stopped after its first unit resumes to the very bytes of an uninterrupted one."""
    src = tmp_path / "src"
    _same_stem_folder(src)
    m = build(_same_stem_recipe(src), tmp_path / "ref", quiet=True)
    assert m["counts"]["written"] == 3 and m["counts"]["inputs"] == 3
    tree = tmp_path / "ref" / ".precomputed"
    want = sorted(["x.pt", _digest_name("x", "src/x.png"), "y.pt"])
    assert _pt_names(tree, "latents") == _pt_names(tree, "conditions") == want
    jpg = torch.load(tree / "latents" / "x.pt", weights_only=True)["latents"]
    png = torch.load(tree / "latents" / want[1], weights_only=True)["latents"]
    assert not torch.equal(jpg, png)  # two pictures, two latents (was: one overwrote the other)
    assert m["outputs"]["precomputed"]["files"]["train"]["files"] == {"latents": 3, "conditions": 3}
    from shardsmith.verify.runner import verify

    rep = verify(tree)
    assert rep["ok"], rep["checks"]

    # stopped after the first unit: the resume writes the rest under the names the plan gave
    commit, calls = Ledger.commit_unit, []

    def stops(self, **kw):
        commit(self, **kw)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(Ledger, "commit_unit", stops)
    with pytest.raises(KeyboardInterrupt):
        build(_same_stem_recipe(src), tmp_path / "resumed", quiet=True)
    assert not (tmp_path / "resumed" / "manifest.json").exists() and len(calls) == 1  # unfinished
    monkeypatch.setattr(Ledger, "commit_unit", commit)
    build(_same_stem_recipe(src), tmp_path / "resumed", quiet=True)
    assert tree_bytes(tmp_path / "resumed") == tree_bytes(tmp_path / "ref")


@pytest.mark.slow
def test_table_rows_sharing_a_target_keep_every_partner_in_the_precomputed_tree(tmp_path):
    """Two rows of one target with two edit sources (``split.dedup: false``): two samples, each with its own
    latents, conditions and reference latents, under one name per row (was: written 2, one file kept)."""
    src = tmp_path / "src"
    src.mkdir()
    photo = _photo("astronaut", 96)
    photo.save(src / "after.png")
    _photo("chelsea", 96).save(src / "s0.png")
    _photo("coffee", 48).save(src / "s1.png")
    (src / "rows.csv").write_text("target,before,instruction\nafter.png,s0.png,from a cat\n"
                                  "./after.png,s1.png,from a coffee cup\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "target", "source": "before",
                                                                  "caption": "instruction"}}],
           "mode": "image-edit", "split": {"dedup": False}, "geometry": {"buckets": ["64x64x1"]},
           "images": {"upscale": True}, "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}},
           "outputs": [{"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 2
    tree = tmp_path / "out" / ".precomputed"
    want = sorted(["after.pt", _digest_name("after", "rows/after.png#row1")])  # ./after.png: a repeated row
    for folder in ("latents", "conditions", "reference_latents"):
        assert _pt_names(tree, folder) == want, folder
    refs = [torch.load(tree / "reference_latents" / n, weights_only=True)["latents"] for n in want]
    assert not torch.equal(refs[0], refs[1])  # each row's own source
    caps = [torch.load(tree / "conditions" / n, weights_only=True)["video_prompt_embeds"] for n in want]
    assert not torch.equal(caps[0], caps[1])  # and its own instruction


def test_sample_names_follow_the_plans_keys():
    """The name rule alone: the planner's key for the normalised path keeps the mirrored name; a key the
    planner made unique, or one a differently spelt path of the same file got, takes the item id's digest."""
    rel = formats.precomputed.sample_rel
    assert rel("clips/a.mp4", None, key="clips_a", item_id="s/clips/a.mp4", key_source=None) == "clips/a.pt"
    assert rel("./clips/a.mp4", None, key="clips_a", item_id="s/./clips/a.mp4", key_source=None) == "clips/a.pt"
    moved = formats.unique_key("clips_a", "s/clips/a.mov")
    assert rel("clips/a.mov", None, key=moved, item_id="s/clips/a.mov", key_source=None) == \
        _digest_name("clips/a", "s/clips/a.mov")
    # several sources: keys carry the source's name; a tree fed by several sources, folders of them
    assert rel("a.mp4", "s", key="s_a", item_id="s/a.mp4", key_source="s") == "s/a.pt"
    assert rel("a.mp4", None, key="s_a", item_id="s/a.mp4", key_source="s") == "a.pt"
    # a//b.mp4 and a/b.mp4 are one file but two keys (a__b, a_b): only the normal spelling keeps b.pt
    assert rel("a//b.mp4", None, key="a__b", item_id="s/a//b.mp4", key_source=None) == \
        _digest_name("a/b", "s/a//b.mp4")
    assert rel("a/b.mp4", None, key="a_b", item_id="s/a/b.mp4", key_source=None) == "a/b.pt"


@pytest.mark.parametrize("name", [".", "..", "", " ", "a/b", "a/../b"])
def test_a_source_name_that_is_no_folder_name_is_refused(tmp_path, name):
    (tmp_path / "src").mkdir()
    _photo("coffee").save(tmp_path / "src" / "p.jpg")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({"sources": [{"path": "src", "name": name}],
                                  "geometry": {"buckets": ["64x64x1"]}, "outputs": [{"format": "wds"}]}))
    code, out = invoke("build", recipe, "--out", tmp_path / "out")
    assert_message(code, out, "sources[0].name", "not a plain folder name")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ partners read as planned


def _planned(path: Path, role: str, kind: str) -> MediaRef:
    return MediaRef(str(path), path.name, kind, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())


def _item(target: Path, kind: str, **partners: MediaRef) -> PlannedItem:
    media = {"target": _planned(target, "target", kind), **partners}
    return PlannedItem(0, "s/t", "t", 0, str(target), target.name, "c", None, None, {}, None, None, kind, None,
                       None, None, None, "train", "ok", media=media)


def test_a_reference_clip_changed_or_gone_since_the_plan_fails_its_item(tmp_path):
    target = pan_video(tmp_path / "t.mp4", frames=12, fps=FPS, size=(64, 64), photo="coffee")
    ref = pan_video(tmp_path / "r.mp4", frames=12, fps=FPS, size=(64, 64), photo="coffee")
    item = _item(target, "video", reference=_planned(ref, "reference", "video"))
    geom = decide(64, 64, parse_buckets(["64x64x9"])[0], frame_indices=list(range(9)), fps=FPS)
    px = np.zeros((9, 64, 64, 3), np.uint8)
    cut = PartnerCutter(("reference",))
    assert cut.cut(item, geom, px)["reference"].shape == (9, 64, 64, 3)  # as planned
    pan_video(ref, frames=12, fps=FPS, size=(64, 64), photo="rocket")  # another clip under its name
    with pytest.raises(ItemError) as e:
        cut.cut(item, geom, px)
    assert e.value.reason == "reference_changed_since_plan" and "s/t: its reference r.mp4" in e.value.detail
    ref.unlink()
    with pytest.raises(ItemError) as e:
        cut.cut(item, geom, px)
    assert e.value.reason == "reference_vanished"


def test_an_edit_source_image_changed_or_gone_since_the_plan_fails_its_item(tmp_path):
    target, source = tmp_path / "t.png", tmp_path / "s.png"
    _photo("astronaut").save(target)
    _photo("chelsea").save(source)
    item = _item(target, "image", source=_planned(source, "source", "image"))
    geom = decide(64, 64, parse_buckets(["64x64x1"])[0], fps=1.0)
    px = np.zeros((1, 64, 64, 3), np.uint8)
    cut = PartnerCutter(("source",))
    got = cut.cut(item, geom, px)["source"]
    assert np.array_equal(got[0], np.asarray(Image.open(source)))
    _photo("coffee").save(source)
    with pytest.raises(ItemError) as e:
        cut.cut(item, geom, px)
    assert e.value.reason == "source_changed_since_plan"
    source.unlink()
    with pytest.raises(ItemError) as e:  # was: FileNotFoundError out of the worker, on every resume
        cut.cut(item, geom, px)
    assert e.value.reason == "source_vanished" and "s.png" in e.value.detail


def _camera_json(path: Path, frames: int, fx: float = 80.0, tx: float = 0.1) -> Path:
    track = []
    for k in range(frames):
        ext = np.eye(4)
        ext[0, 3] = tx * k
        track.append({"extrinsic": ext.tolist()})
    path.write_text(json.dumps({"width": 64, "height": 64, "intrinsic": [fx, 80.0, 32.0, 32.0], "frames": track}))
    return path


def test_masks_and_cameras_changed_or_gone_since_the_plan_fail_their_item(tmp_path):
    target = tmp_path / "t.png"
    _photo("astronaut").save(target)
    mask = tmp_path / "m.png"
    m = np.zeros((64, 64), np.uint8)
    m[:32] = 255
    Image.fromarray(m).save(mask)
    cam = _camera_json(tmp_path / "cam.json", 1)
    geom = decide(64, 64, parse_buckets(["64x64x1"])[0], fps=1.0)
    for role, path, changed in (("mask", mask, lambda: Image.fromarray(255 - m).save(mask)),
                                ("camera", cam, lambda: _camera_json(cam, 1, fx=90.0))):
        item = _item(target, "image", **{role: _planned(path, role, "image" if role == "mask" else "other")})
        cutter = ConditionCutter((role,), spatial=8, temporal=1)
        assert cutter.cut(item, geom, 1)[role].shape[0] == 1  # as planned
        changed()
        with pytest.raises(ItemError) as e:
            cutter.cut(item, geom, 1)
        assert e.value.reason == f"{role}_changed_since_plan", role
        path.unlink()
        with pytest.raises(ItemError) as e:
            cutter.cut(item, geom, 1)
        assert e.value.reason == f"{role}_vanished", role


@pytest.mark.slow
def _copy_over_after_plan(monkeypatch, source: Path, dest: Path) -> None:
    """The next build plans in this process, then ``dest`` is replaced by a copy of ``source`` (as a resume
    of a build killed after its plan would find it)."""
    real = build_mod.make_plan

    def plan_then_replace(*a, **kw):
        n = real(*a, **kw)
        shutil.copyfile(source, dest)
        return n

    monkeypatch.setattr(build_mod, "PLAN_AHEAD", False)  # the plan in this process, then the hook
    monkeypatch.setattr(build_mod, "make_plan", plan_then_replace)


def test_a_reference_replaced_between_plan_and_write_fails_as_changed_never_another_clips_latents(
        tmp_path, monkeypatch):
    """The tester's repro: v2v-ic into latent_wds, r1.mp4 replaced by a copy of r0.mp4 once the plan is made
    (the resume of a build killed after its plan sees the same): c1 fails as reference_changed_since_plan
    (was: written 2, c1's ref_latent.pth the latents of c0's reference)."""
    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,caption"]
    for i, photo in enumerate(("astronaut", "coffee")):
        pan_video(src / f"c{i}.mp4", frames=12, fps=FPS, size=(64, 64), photo=photo)
        pan_video(src / f"r{i}.mp4", frames=12, fps=FPS, size=(64, 64), photo=("chelsea", "rocket")[i])
        rows.append(f"c{i}.mp4,r{i}.mp4,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "clip", "reference": "ref",
                                                                  "caption": "caption"}}],
           "mode": "v2v-ic", "geometry": {"buckets": ["64x64x9"]}, "models": {"vae": {"family": "ltx2"}},
           "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1}]}
    _copy_over_after_plan(monkeypatch, src / "r0.mp4", src / "r1.mp4")
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 1 and m["counts"]["failed"] == {"reference_changed_since_plan": 1}
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        assert {n.split(".", 1)[0] for n in tf.getnames()} == {"c0"}
    assert not (tmp_path / "out" / "lat" / "00001.tar").exists()


# ------------------------------------------------------------------ values float32 cannot hold, NaN masks


@pytest.mark.parametrize("fx, tx, what", [(80.0, 1e300, "e03"), (1e40, 0.1, "fx"), (3e38, 0.1, "fx"),
                                          (1e-300, 0.1, "fx")])
def test_camera_values_float32_cannot_hold_fail_the_item(tmp_path, fx, tx, what):
    from shardsmith.transform.camera import camera_for, load_camera

    track = load_camera(_camera_json(tmp_path / "cam.json", 3, fx=fx, tx=tx), "s/t")  # finite in float64: loads
    # 64x64 -> 128x128 bucket: the resize doubles fx (3e38 -> 6e38, past float32's 3.4e38)
    geom = decide(64, 64, parse_buckets(["128x128x3"])[0], frame_indices=[0, 1, 2], fps=FPS)
    with pytest.raises(ItemError) as e:
        camera_for(track, geom, 3, "s/t")
    assert e.value.reason == "camera_bad_shape" and what in e.value.detail and "float32" in e.value.detail
    ok = camera_for(load_camera(_camera_json(tmp_path / "ok.json", 3), "s/t"), geom, 3, "s/t")
    assert ok.dtype == np.float32 and np.isfinite(ok).all() and (ok[:, 16:18] > 0).all()


def _float_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> Path:
    """A mono IEEE-float (format 3) WAV of ``samples``, written byte by byte as a recorder writes one."""
    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
                     + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
    return path


def test_an_audio_mask_recording_with_nan_samples_fails_instead_of_masking_nothing(tmp_path):
    from shardsmith.transform.masks import load_audio_mask

    t = np.arange(16000) / 16000
    loud = (0.9 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    got = load_audio_mask(_float_wav(tmp_path / "ok.wav", loud), "s/t", 26, rate=16000, duration=1.0)
    assert got.shape == (26,) and got.sum() > 20  # a loud recording masks (almost) every step
    nan = loud.copy()
    nan[4000:12000] = np.nan
    with pytest.raises(ItemError) as e:
        load_audio_mask(_float_wav(tmp_path / "nan.wav", nan), "s/t", 26, rate=16000, duration=1.0)
    assert e.value.reason == "mask_bad_values" and "NaN" in e.value.detail


@pytest.mark.slow
def test_decode_finds_the_source_of_every_uniquely_named_precomputed_file(tmp_path):
    """decode matched a ``.precomputed/`` file to its ledger item by the mirrored path alone, so ``x_<8 hex>.pt``
    had no source (no PSNR in its row): it now names items as the sink does (``formats.precomputed.sample_rel``)."""
    from shardsmith.verify.decode import decode

    src = tmp_path / "src"
    _same_stem_folder(src)
    build(_same_stem_recipe(src), tmp_path / "b", quiet=True)
    decode(tmp_path / "b", tmp_path / "dec", device="cpu")
    rows = json.loads((tmp_path / "dec" / "decode_report.json").read_text())["rows"]
    assert sorted(r["path"] for r in rows) == sorted(["x.pt", _digest_name("x", "src/x.png"), "y.pt"])
    assert all("psnr_db" in r for r in rows), rows


def test_a_camera_json_nested_too_deep_is_an_unreadable_camera(tmp_path):
    """json.load of ``[[[...]]]`` 100,000 deep raised RecursionError out of the worker pool, ending the build."""
    from shardsmith.records import ItemError
    from shardsmith.transform.camera import load_camera

    deep = tmp_path / "cam.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ItemError) as e:
        load_camera(str(deep), "clip0")
    assert e.value.reason == "camera_unreadable" and "nested too deeply" in str(e.value)


@pytest.mark.slow
def test_an_audio_partner_replaced_between_plan_and_write_fails_as_changed(tmp_path, monkeypatch):
    """A clip's ``columns: {audio: ...}`` file was decoded from its path unchecked: replaced by another clip's
    recording after the plan, it gave that recording's audio latents under this clip."""
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    for i, photo in enumerate(("astronaut", "coffee")):
        pan_video(src / f"c{i}.mp4", frames=30, fps=FPS, size=(64, 64), photo=photo)
        audio_file(src / f"a{i}.wav", kind=("speech", "tone")[i], duration=1.5, rate=16000, layout="mono")
    (src / "rows.csv").write_text("video,voice,caption\nc0.mp4,a0.wav,first\nc1.mp4,a1.wav,second\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "video", "audio": "voice",
                                                                   "caption": "caption"}}],
           "geometry": {"buckets": ["64x64x9"]},
           "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"},
                      "device": "cpu"},
           "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1}]}
    _copy_over_after_plan(monkeypatch, src / "a0.wav", src / "a1.wav")
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 1 and m["counts"]["failed"] == {"audio_changed_since_plan": 1}, m["counts"]


@pytest.mark.slow
def test_an_audio_reference_replaced_between_plan_and_write_fails_as_changed(tmp_path, monkeypatch):
    """a2a-ic: an audio reference file was decoded from its path unchecked (no pixels read it as a clip's are)."""
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        audio_file(src / f"t{i}.wav", kind="speech", duration=2.2 + 0.1 * i, rate=16000, layout="mono")
        audio_file(src / f"r{i}.flac", kind=("tone", "speech")[i], duration=2.4, rate=44100, layout="stereo")
    (src / "rows.csv").write_text("audio,ref,caption\nt0.wav,r0.flac,one\nt1.wav,r1.flac,two\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "audio", "reference": "ref",
                                                                   "caption": "caption"}}],
           "mode": "a2a-ic", "audio": {"durations": [2.0]},
           "models": {"text": {"family": "ltx2"}, "audio_vae": {"family": "ltx2_audio"}},
           "outputs": [{"format": "precomputed"}]}
    _copy_over_after_plan(monkeypatch, src / "r0.flac", src / "r1.flac")
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 1 and m["counts"]["failed"] == {"reference_changed_since_plan": 1}, m["counts"]
