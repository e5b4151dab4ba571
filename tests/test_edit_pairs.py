"""Image-editing pairs in the raw ``wds`` output (issue 18): an item with a ``source`` partner gets a
``src.<ext>`` member beside its target, the source through exactly the target's resize and crop, in
one sample under one key. Real photos (``media_factory``), real tables, the real build, loader and CLI."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image, ImageDraw, ImageOps

from media_factory import real_photos, source_photo
from shardsmith import formats
from shardsmith.build import build
from shardsmith.formats.wds import SRC_JPG, source_member
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import ImageEncoding, ImageRules, WdsOutput, recipe_from_dict
from shardsmith.records import PlannedItem
from shardsmith.transform.image import decode_image, encode_image
from shardsmith.transform.pairs import apply_geometry, wds_geometry
from shardsmith.transform.samples import WdsSampleMaker

PY = sys.executable
W, H = 480, 320  # the targets' size; the half-resolution source is 240x160 (the same aspect ratio)
RECT = (150, 90, 270, 200)  # the edit drawn into the "rect" target, in its own pixels
COLUMNS = {"media": "target", "source": "before", "caption": "instruction"}


def _photo() -> Image.Image:
    return source_photo("coffee").resize((W, H), Image.Resampling.LANCZOS)


def _edit_table(root: Path, extra_rows: list[str] = ()) -> Path:
    """Two pairs from one real photo: ``invert`` (target: the photo's colours flipped; source: the
    photo, same size) and ``rect`` (target: the photo with a filled rectangle at :data:`RECT`;
    source: the photo at half resolution). A CSV target,before,instruction lists them."""
    root.mkdir(parents=True, exist_ok=True)
    p = _photo()
    p.save(root / "full.jpg", quality=92)
    p.resize((W // 2, H // 2), Image.Resampling.LANCZOS).save(root / "half.jpg", quality=92)
    ImageOps.invert(p).save(root / "invert.jpg", quality=92)
    rect = p.copy()
    ImageDraw.Draw(rect).rectangle((RECT[0], RECT[1], RECT[2] - 1, RECT[3] - 1), fill=(20, 40, 230))
    rect.save(root / "rect.jpg", quality=92)
    rows = ["target,before,instruction", "invert.jpg,full.jpg,invert the colours",
            "rect.jpg,half.jpg,paint a blue box on the cup", *extra_rows]
    (root / "edits.csv").write_text("\n".join(rows) + "\n")
    return root / "edits.csv"


def _recipe(table: Path, image: dict, **more) -> dict:
    return {"sources": [{"path": str(table), "columns": COLUMNS}],
            "outputs": [{"format": "wds", "dir": "wds", "image": image}], **more}


def _samples(folder: Path) -> dict[str, dict[str, bytes]]:
    """``{key: {suffix: bytes}}`` of every shard of ``folder``, by webdataset's first-dot rule."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                key, suffix = m.name.split(".", 1)
                out.setdefault(key, {})[suffix] = tf.extractfile(m).read()
    return out


def _px(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


def _decoded(path: Path) -> Image.Image:
    return decode_image(path.read_bytes(), name=path.name, max_pixels=10**9).image


def _statuses(out: Path) -> dict[str, tuple[str, str | None]]:
    led = Ledger(out / formats.LEDGER_FILE)
    try:
        return {item_id: (status, detail) for _, item_id, status, detail in led.status_rows("wds")}
    finally:
        led.close()


# ------------------------------------------------------------------ the decision

@pytest.mark.parametrize("image", [{"max_side": 200}, {"max_side": 200, "upscale": True}, {},
                                   {"size": 96, "resize_mode": "center_crop"},
                                   {"size": 96, "resize_mode": "keep_ratio"},
                                   {"size": 96, "resize_mode": "border"},
                                   {"size": 400, "resize_mode": "border"},
                                   {"size": 400, "resize_mode": "border", "upscale": True}])
def test_wds_geometry_is_the_targets_own_picture(image):
    """The pure decision the source is cut with gives, applied to the target, the target's very
    pixels (the maker's own resize / crop / pad), for every sizing the wds output has."""
    upscale = image.pop("upscale", False)
    rules = ImageRules(upscale=upscale, background=(10, 200, 30))
    maker = WdsSampleMaker(WdsOutput(format="wds", image=ImageEncoding(**image)), rules, [])
    item = PlannedItem(0, "s/x", "x", 0, "", "x", None, None, None, {}, None, None, "image", None, None, None, None,
                       "train", "ok")
    photo = source_photo("chelsea")
    for size in ((451, 300), (300, 451), (150, 100), (96, 320), (97, 97), (403, 96)):
        img = photo.resize(size, Image.Resampling.BILINEAR)
        geom = wds_geometry(*size, maker.o.image, upscale)
        try:
            want = maker._geometry(item, img)
        except Exception as e:  # too small for this sizing: the decision refuses it too
            assert getattr(e, "reason", None) == "too_small" and geom is None, (size, e)
            continue
        got = apply_geometry(img, geom, rules.background)
        assert got.size == want.size == geom.out_size, (size, image)
        assert np.array_equal(np.asarray(got), np.asarray(want)), (size, image)
        assert (got is img) == (want is img)  # "unchanged" means the same thing (passthrough reads it)


# ------------------------------------------------------------------ the build

# (image settings, member format, the 480x320 target's resize and crop, written out by hand)
CASES = [
    ({"max_side": 256, "format": "jpg"}, "jpg", (256, 171), (0, 0, 256, 171)),
    ({"size": 128, "resize_mode": "center_crop", "format": "png"}, "png", (192, 128), (32, 0, 160, 128)),
]


@pytest.mark.parametrize("image, fmt, resize, crop", CASES, ids=["jpg-max_side", "png-center_crop"])
def test_a_pair_is_one_sample_and_its_source_takes_the_targets_geometry(tmp_path, image, fmt, resize, crop):
    table = _edit_table(tmp_path / "src")
    m = build(recipe_from_dict(_recipe(table, image, split={"holdout": 0})), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 2 and m["counts"]["failed"] == {}
    samples = _samples(tmp_path / "out" / "wds")
    assert sorted(samples) == ["invert", "rect"]  # one key per pair
    src_member = source_member(fmt)
    assert src_member == f"src.{fmt}" and source_member("jpg") == SRC_JPG
    out_w, out_h = crop[2] - crop[0], crop[3] - crop[1]
    for key, source_file in (("invert", "full.jpg"), ("rect", "half.jpg")):
        s = samples[key]
        assert set(s) == {fmt, src_member, "txt", "json"}
        tgt, src = _px(s[fmt]), _px(s[src_member])
        assert tgt.shape == src.shape == (out_h, out_w, 3)
        # the source member is the source file through the target's resize and crop (done here by hand),
        # at the output's format and quality: the same bytes
        want = _decoded(tmp_path / "src" / source_file).resize(resize, Image.Resampling.LANCZOS).crop(crop)
        assert s[src_member] == encode_image(want, fmt, 95)
        meta = json.loads(s["json"])
        facts = meta["partners"]["source"]
        assert facts["member"] == src_member and facts["path"] == source_file
        assert facts["sha256"] == hashlib.sha256((tmp_path / "src" / source_file).read_bytes()).hexdigest()
        assert facts["resize"] == list(resize) and facts["crop"] == list(crop) and facts["size"] == [out_w, out_h]
        assert meta["size"] == [out_w, out_h] and meta["source"] == "edits" and meta["passthrough"] is False
        sw = 240 if source_file == "half.jpg" else W
        assert facts["original_size"] == [sw, sw * 2 // 3]
        sx, sy = sw / resize[0], sw * 2 / 3 / resize[1]  # the crop box in the source's own pixels
        assert facts["source_box"] == pytest.approx([crop[0] * sx, crop[1] * sy, crop[2] * sx, crop[3] * sy],
                                                    abs=0.01)
    assert samples["invert"]["txt"] == b"invert the colours"
    assert samples["rect"]["txt"] == b"paint a blue box on the cup"

    # the same-size source: equal to the maker's own transform of the source file as a target
    maker = WdsSampleMaker(WdsOutput(format="wds", image=ImageEncoding(**image)), ImageRules(), [])
    item = PlannedItem(0, "s/x", "x", 0, "", "x", None, None, None, {}, None, None, "image", None, None, None, None,
                       "train", "ok")
    own = maker._geometry(item, _decoded(tmp_path / "src" / "full.jpg"))
    assert samples["invert"][src_member] == encode_image(own, fmt, 95)

    # alignment: the inverted target and its source sum to white pixel by pixel, and not one pixel aside
    t, s = _px(samples["invert"][fmt]), _px(samples["invert"][src_member])
    aligned = np.abs(t + s - 255).mean()
    aside = np.abs(t[:, 3:] + s[:, :-3] - 255).mean()
    assert aligned < 6 and aside > 2 * aligned, (aligned, aside)
    # the rectangle drawn at RECT in the 480x320 target lands where the target's geometry puts RECT,
    # and the half-size source holds the photo there: where the two members differ is that box
    t, s = _px(samples["rect"][fmt]), _px(samples["rect"][src_member])
    differ = np.abs(t - s).max(axis=2) > 60
    ys, xs = np.nonzero(differ)
    sx, sy = resize[0] / W, resize[1] / H
    want_box = (RECT[0] * sx - crop[0], RECT[1] * sy - crop[1], RECT[2] * sx - crop[0], RECT[3] * sy - crop[1])
    got_box = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    assert np.allclose(got_box, want_box, atol=2), (got_box, want_box)
    x0, y0, x1, y1 = (round(v) for v in want_box)
    outside = np.ones(differ.shape, bool)
    outside[max(y0 - 3, 0):y1 + 3, max(x0 - 3, 0):x1 + 3] = False
    assert np.abs(t - s)[outside].mean() < 6  # elsewhere the edit is the source itself


def test_a_source_that_cannot_line_up_or_be_read_fails_the_item_naming_it(tmp_path):
    root = tmp_path / "src"
    _edit_table(root, ["wide_t.jpg,wide.jpg,widen", "lost_t.jpg,gone.jpg,lost source",
                       "trunc_t.jpg,trunc.jpg,truncated source"])
    p = _photo()
    p.crop((0, 40, W, 280)).save(root / "wide.jpg", quality=92)  # 480x240: another aspect ratio
    for name, edit in (("wide_t", ImageOps.mirror), ("lost_t", ImageOps.flip), ("trunc_t", ImageOps.grayscale)):
        edit(p).convert("RGB").save(root / f"{name}.jpg", quality=92)  # distinct targets (no dedup)
    (root / "trunc.jpg").write_bytes((root / "full.jpg").read_bytes()[:5000])  # a header, half a picture
    out = tmp_path / "out"
    m = build(recipe_from_dict(_recipe(root / "edits.csv", {"max_side": 256}, split={"holdout": 0})), out, quiet=True)
    assert m["counts"]["written"] == 2
    assert m["counts"]["failed"] == {"source_geometry_mismatch": 1, "missing_source": 1, "source_truncated": 1}
    st = _statuses(out)
    status, detail = st["edits/wide_t.jpg"]
    assert status == "failed:source_geometry_mismatch" and "480x240" in detail and "480x320" in detail
    # the planner's verdict (the file is not there), before any output reads it
    led = Ledger(out / formats.LEDGER_FILE)
    lost = [it for it in led.items() if it.item_id == "edits/lost_t.jpg"][0]
    led.close()
    assert lost.plan_status == "failed:missing_source" and "gone.jpg" in lost.detail
    status, detail = st["edits/trunc_t.jpg"]
    assert status == "failed:source_truncated" and "trunc.jpg" in detail and "source" in detail
    assert sorted(_samples(out / "wds")) == ["invert", "rect"]


def test_passthrough_keeps_a_pairs_bytes_only_when_both_members_can_keep_theirs(tmp_path):
    """Rule: the pair is written from the original files only when the target AND the source could be
    (the output's format, pixels untouched by decode and geometry); otherwise both are encoded."""
    root = tmp_path / "src"
    _edit_table(root, ["png_t.png,full.jpg,a target of another format"])
    ImageOps.grayscale(_photo()).convert("RGB").save(root / "png_t.png")
    m = build(recipe_from_dict(_recipe(root / "edits.csv", {"format": "jpg", "passthrough": True},
                                       split={"holdout": 0})), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 3
    s = _samples(tmp_path / "out" / "wds")
    raw = {n: (root / n).read_bytes() for n in ("invert.jpg", "full.jpg", "rect.jpg", "half.jpg", "png_t.png")}
    # both could: both keep their bytes
    assert s["invert"]["jpg"] == raw["invert.jpg"] and s["invert"][SRC_JPG] == raw["full.jpg"]
    meta = json.loads(s["invert"]["json"])
    assert meta["passthrough"] is True and meta["partners"]["source"]["passthrough"] is True
    # the target could, its half-size source must be enlarged: both are encoded
    assert s["rect"]["jpg"] == encode_image(_decoded(root / "rect.jpg"), "jpg", 95) != raw["rect.jpg"]
    assert s["rect"][SRC_JPG] == encode_image(_decoded(root / "half.jpg").resize((W, H), Image.Resampling.LANCZOS),
                                              "jpg", 95)
    meta = json.loads(s["rect"]["json"])
    assert meta["passthrough"] is False and meta["partners"]["source"]["passthrough"] is False
    # the source could, its target (a PNG, the output jpg) cannot: both are encoded
    assert s["png_t"][SRC_JPG] == encode_image(_decoded(root / "full.jpg"), "jpg", 95) != raw["full.jpg"]
    assert s["png_t"]["jpg"] == encode_image(_decoded(root / "png_t.png"), "jpg", 95)


def test_items_without_a_source_are_written_as_before(tmp_path):
    """A folder source beside the edit table: its samples are the bytes a build without the table writes."""
    real_photos(tmp_path / "photos", 3, seed=7, min_side=120, max_side=300)
    table = _edit_table(tmp_path / "edits")
    image = {"max_side": 128}
    alone = build(recipe_from_dict({"sources": [{"path": str(tmp_path / "photos")}], "split": {"holdout": 0},
                                    "outputs": [{"format": "wds", "dir": "wds", "image": image}]}),
                  tmp_path / "alone", quiet=True)
    both = build(recipe_from_dict({"sources": [{"path": str(tmp_path / "photos")},
                                               {"path": str(table), "columns": COLUMNS}], "split": {"holdout": 0},
                                   "outputs": [{"format": "wds", "dir": "wds", "image": image}]}),
                 tmp_path / "both", quiet=True)
    assert alone["counts"]["written"] == 3 and both["counts"]["written"] == 5

    def by_id(folder):
        return {json.loads(s["json"])["id"]: s for s in _samples(folder).values()}

    a, b = by_id(tmp_path / "alone" / "wds"), by_id(tmp_path / "both" / "wds")
    assert set(a) < set(b)
    for item_id, sample in a.items():
        assert b[item_id] == sample and "partners" not in json.loads(sample["json"])
    assert sum(SRC_JPG in s for s in b.values()) == 2


# ------------------------------------------------------------------ loading, verify, resume

def _many_pairs(root: Path, n: int) -> Path:
    """``n`` pairs from ``n`` real photos: the source is the photo, the target its colours flipped."""
    photos = real_photos(root / "before", n, seed=3, min_side=96, max_side=200)
    (root / "after").mkdir()
    rows = ["target,before,instruction"]
    for i, p in enumerate(photos):
        ImageOps.invert(Image.open(p).convert("RGB")).save(root / "after" / p.name, quality=90)
        rows.append(f"after/{p.name},before/{p.name},invert photo {i}")
    (root / "edits.csv").write_text("\n".join(rows) + "\n")
    return root / "edits.csv"


@pytest.mark.slow
def test_the_loader_and_verify_iterate_pairs_over_ranks_and_workers(tmp_path):
    from shardsmith.loaders.wds import WdsLoader
    from shardsmith.loaders.wds_config import WdsLoaderConfig

    table = _many_pairs(tmp_path / "src", 16)
    out = tmp_path / "out"
    build(recipe_from_dict({"sources": [{"path": str(table), "columns": COLUMNS}], "split": {"holdout": 0},
                            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 3,
                                         "image": {"size": 64, "resize_mode": "center_crop"}}]}), out, quiet=True)
    folder = out / "wds"
    want = _samples(folder)
    assert len(want) == 16
    seen: list[str] = []
    for rank in range(2):
        cfg = WdsLoaderConfig(shards=folder, key_map={"real": "jpg", "source": SRC_JPG, "condition": "txt"},
                              deterministic=True, num_workers=2, rank=rank, world_size=2, batch_size=2)
        for batch in WdsLoader(cfg):
            assert batch["real"].shape == batch["source"].shape == (2, 64, 64, 3)
            for i, key in enumerate(batch["__key__"]):
                seen.append(key)
                assert np.array_equal(batch["real"][i].numpy(), _px(want[key]["jpg"]))
                assert np.array_equal(batch["source"][i].numpy(), _px(want[key][SRC_JPG]))
                assert batch["condition"][i] == want[key]["txt"].decode()
    assert sorted(seen) == sorted(want)  # every pair once, over 2 ranks x 2 workers

    r = subprocess.run([PY, "-m", "shardsmith", "verify", str(folder), "--key-map",
                        f"real=jpg,source={SRC_JPG},condition=txt", "--world", "2", "--workers", "2",
                        "--batch-size", "2", "--json", "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["ok"] is True, rep
    assert rep["key_map"] == {"real": "jpg", "source": SRC_JPG, "condition": "txt"}
    assert rep["contract"]["samples"] == 16 and all(c["ok"] for c in rep["checks"])
    assert rep["contract"]["keys"]["real"]["shape"] == rep["contract"]["keys"]["source"]["shape"] == [64, 64, 3]


def _start(recipe: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--quiet",
                             "--workers", "2", "--no-report"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _shard_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_a_build_killed_mid_way_resumes_to_the_same_bytes(tmp_path):
    table = _many_pairs(tmp_path / "src", 40)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(table), "columns": COLUMNS}], "split": {"holdout": 0.2, "seed": 1},
        "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2, "image": {"max_side": 160}}]}))
    p = _start(recipe, tmp_path / "ref")
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    want = {d: _shard_hashes(tmp_path / "ref" / d) for d in ("wds", "holdout/wds")}
    assert len([n for n in want["wds"] if n.endswith(".tar")]) >= 10

    out = tmp_path / "out"
    p = _start(recipe, out)
    deadline = time.monotonic() + 120
    while not list((out / "wds").glob("*.tar")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert p.poll() is None, "the build finished before it could be killed; the test proves nothing"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert len(list((out / "wds").glob("*.tar"))) < len(want["wds"]) - 1  # killed mid-way
    p = _start(recipe, out)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    assert {d: _shard_hashes(out / d) for d in want} == want
    samples = _samples(out / "wds")
    assert samples and all(set(s) == {"jpg", SRC_JPG, "txt", "json"} for s in samples.values())
    # a finished build re-run is a no-op: no byte changes
    before = {p.relative_to(out): p.stat().st_mtime_ns for p in (out / "wds").iterdir()}
    p = _start(recipe, out)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in (out / "wds").iterdir()} == before
    assert {d: _shard_hashes(out / d) for d in want} == want
