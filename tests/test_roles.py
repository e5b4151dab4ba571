"""Roles (issue 15): an item's media by role, every role probed by the planner, one geometry
decision per item applied to every role, captions-only tables. Real photos from scikit-image
(``media_factory``), real tables, the real planner and the real CLI."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from media_factory import real_photos, write_table
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import RecipeError, recipe_from_dict
from shardsmith.records import ROLES, ItemError, MediaRef, PlannedItem
from shardsmith.scan.dry_run import planned
from shardsmith.sources.base import SourceError
from shardsmith.transform.buckets import Bucket
from shardsmith.transform.geometry import Geometry, decide, for_partner
from shardsmith.transform.video import resize_crop_image

PY = sys.executable


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _paired(root: Path, n: int = 3) -> tuple[Path, list[dict]]:
    """``n`` photos (targets), each with a half-size grey mask (PNG) and an edit source (a
    different photo), listed in a CSV with columns file, src_file, mask_file, text."""
    targets = real_photos(root / "tgt", n, seed=1)
    sources = real_photos(root / "src", n, seed=2)
    (root / "masks").mkdir()
    rows = []
    for i, (t, s) in enumerate(zip(targets, sources)):
        img = Image.open(t)
        mask = img.convert("L").resize((img.width // 2, img.height // 2), Image.Resampling.BILINEAR)
        mask.save(root / "masks" / f"m{i}.png")
        rows.append({"file": f"tgt/{t.name}", "src_file": f"src/{s.name}", "mask_file": f"masks/m{i}.png",
                     "text": f"edit number {i}", "extra": i})
    return write_table(root, rows, "csv"), rows


def _recipe(table: Path, columns: dict | None, **src) -> object:
    spec = {"path": str(table), **src}
    if columns is not None:
        spec["columns"] = columns
    return recipe_from_dict({"sources": [spec], "outputs": [{"format": "wds", "dir": "wds"}]})


ROLE_COLUMNS = {"target": "file", "source": "src_file", "mask": "mask_file", "caption": "text"}


def _plan(recipe) -> list[PlannedItem]:
    with planned(recipe) as run:
        return list(run.ledger.items())


def test_every_role_is_probed_and_recorded(tmp_path):
    table, rows = _paired(tmp_path)
    items = _plan(_recipe(table, ROLE_COLUMNS))
    assert [it.plan_status for it in items] == ["ok"] * 3
    for it, row in zip(items, rows):
        assert list(it.media) == ["target", "source", "mask"]
        for role, col in (("target", "file"), ("source", "src_file"), ("mask", "mask_file")):
            ref, f = it.media[role], tmp_path / row[col]
            assert ref.path == str(f.resolve()) and ref.relpath == row[col]
            assert ref.kind == "image"
            assert ref.sha256 == _sha(f) and ref.size_bytes == f.stat().st_size
            assert (ref.width, ref.height) == Image.open(f).size
        t, m = it.media["target"], it.media["mask"]
        assert (m.width, m.height) == (t.width // 2, t.height // 2)
        assert (t.image_format, t.mode, m.image_format, m.mode) == ("JPEG", "RGB", "PNG", "L")
        # the flat fields stay the target's: existing code reads them
        assert (it.path, it.sha256, it.width, it.height) == (t.path, t.sha256, t.width, t.height)
        assert it.caption == row["text"] and it.meta == {"extra": row["extra"]}  # a CSV number stays a number (issue 16)


def test_dedup_stays_on_the_target(tmp_path):
    table, rows = _paired(tmp_path, 2)
    # two rows share one mask file (same bytes): not duplicates; the targets differ
    rows[1]["mask_file"] = rows[0]["mask_file"]
    rows[1]["src_file"] = rows[0]["src_file"]
    write_table(tmp_path, rows, "csv")
    items = _plan(_recipe(table, ROLE_COLUMNS))
    assert [it.plan_status for it in items] == ["ok", "ok"] and items[1].dup_of is None
    assert items[0].media["mask"].sha256 == items[1].media["mask"].sha256


def test_missing_mask_names_row_column_and_file(tmp_path):
    table, _ = _paired(tmp_path)
    (tmp_path / "masks" / "m1.png").unlink()
    items = _plan(_recipe(table, ROLE_COLUMNS))
    assert [it.plan_status for it in items] == ["ok", "failed:missing_mask", "ok"]
    detail = items[1].detail
    for text in ("row 1", "mask_file", "masks/m1.png"):
        assert text in detail, detail


def test_empty_mask_cell_is_missing_mask(tmp_path):
    table, rows = _paired(tmp_path)
    rows[2]["mask_file"] = ""
    write_table(tmp_path, rows, "csv")
    items = _plan(_recipe(table, ROLE_COLUMNS))
    assert items[2].plan_status == "failed:missing_mask" and "mask_file" in items[2].detail


@pytest.mark.parametrize("content, reason", [(b"", "empty_file"), (b"this is not a picture at all\n", "not_an_image")])
def test_unreadable_mask_fails_with_its_role(tmp_path, content, reason):
    table, _ = _paired(tmp_path)
    (tmp_path / "masks" / "m0.png").write_bytes(content)
    items = _plan(_recipe(table, ROLE_COLUMNS))
    assert [it.plan_status for it in items] == [f"failed:mask_{reason}", "ok", "ok"]
    assert "mask" in items[0].detail and "m0.png" in items[0].detail
    assert items[0].media["target"].sha256 is not None  # the target was read; the mask failed


def test_partner_outside_the_table_folder_is_refused_unopened(tmp_path):
    table, rows = _paired(tmp_path / "t")
    rows[0]["mask_file"] = "../secret.png"
    (tmp_path / "secret.png").write_bytes((tmp_path / "t" / "masks" / "m0.png").read_bytes())
    write_table(tmp_path / "t", rows, "csv")
    items = _plan(_recipe(table, ROLE_COLUMNS))
    assert items[0].plan_status == "failed:mask_path_outside_table_dir"
    assert "mask" not in items[0].media


def test_folder_items_carry_their_target(tmp_path):
    photos = real_photos(tmp_path / "photos", 2)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "photos")}],
                            "outputs": [{"format": "wds", "dir": "wds"}]})
    items = _plan(rec)
    assert [list(it.media) for it in items] == [["target"], ["target"]]
    assert [it.media["target"].sha256 for it in items] == [_sha(p) for p in photos]


# ---------------------------------------------------------------- captions-only tables


def _prompts(root: Path, n: int) -> Path:
    return write_table(root, [{"prompt": f"a watercolour of lighthouse number {i}", "seed": i} for i in range(n)],
                       "csv")


@pytest.mark.parametrize("columns", [{"caption": "prompt"}, None])
def test_captions_only_table_plans_text_items(tmp_path, columns):
    table = _prompts(tmp_path, 5)
    items = _plan(_recipe(table, columns))
    assert len(items) == 5
    for i, it in enumerate(items):
        assert it.plan_status == "ok" and it.kind == "text"
        assert it.caption == f"a watercolour of lighthouse number {i}"
        assert it.media == {} and it.path == "" and it.sha256 is None
        assert it.meta == {"seed": i}  # a CSV number stays a number (issue 16)
    assert len({it.key for it in items}) == 5


def test_captions_only_empty_caption_fails(tmp_path):
    table = write_table(tmp_path, [{"prompt": "a cat"}, {"prompt": ""}], "csv")
    items = _plan(_recipe(table, {"caption": "prompt"}))
    assert [it.plan_status for it in items] == ["ok", "failed:no_caption"]
    assert "row 1" in items[1].detail


def test_a_forgotten_media_column_is_not_taken_for_captions_only(tmp_path):
    photos = real_photos(tmp_path / "p", 1)
    table = write_table(tmp_path, [{"img_path": f"p/{photos[0].name}", "prompt": "a photo"}], "csv")
    with pytest.raises(SourceError, match="set columns.target: img_path"):
        _plan(_recipe(table, None))
    # said so: captions only, the file names kept as metadata
    [it] = _plan(_recipe(table, {"caption": "prompt"}))
    assert (it.kind, it.caption, it.meta) == ("text", "a photo", {"img_path": f"p/{photos[0].name}"})


def test_scan_of_a_captions_only_table(tmp_path):
    table = _prompts(tmp_path, 4)
    r = subprocess.run([PY, "-m", "shardsmith", "scan", str(table), "--columns", "caption=prompt", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["items"] == 4 and rep["kinds"]["text"] == 4 and rep["kinds"]["image"] == 0
    assert rep["problem_counts"] == {} or not any(rep["problem_counts"].values()), rep["problem_counts"]


# ---------------------------------------------------------------- recipe: role keys


def test_role_keys_are_accepted():
    cols = _recipe(Path("/x/t.csv"), {"target": "f", "mask": "m", "audio": "a", "camera": "c", "reference": "r",
                                      "source": "s"}).sources[0].columns
    assert cols.target_column == "f"
    assert cols.partners() == {"source": "s", "reference": "r", "mask": "m", "audio": "a", "camera": "c"}
    assert set(ROLES) <= set(type(cols).model_fields)


def test_a_column_plays_one_role():
    with pytest.raises(RecipeError, match="both columns.target and columns.mask"):
        _recipe(Path("/x/t.csv"), {"target": "f", "mask": "f"})


def test_unknown_role_key_suggests_the_right_one():
    with pytest.raises(RecipeError, match="did you mean `mask`"):
        _recipe(Path("/x/t.csv"), {"target": "f", "maks": "m"})


def test_media_and_target_both_given_is_refused_by_the_cli(tmp_path):
    table, _ = _paired(tmp_path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": str(table), "columns": {"media": "file", "target": "file"}}],
                                      "outputs": [{"format": "wds", "dir": "wds"}]}), encoding="utf-8")
    r = subprocess.run([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out
    assert "both columns.media" in out and "columns.target" in out, out
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- one geometry per item


def test_geometry_applied_to_a_half_size_mask(tmp_path):
    target_path = real_photos(tmp_path, 1, seed=5, min_side=300, max_side=600)[0]
    target = Image.open(target_path).convert("RGB")
    w, h = target.size
    mask = target.resize((w // 2, h // 2), Image.Resampling.LANCZOS)
    geom = decide(w, h, Bucket(128, 128, 1), fps=1.0)
    part = for_partner(geom, "mask", *mask.size, name="photo")
    assert isinstance(part, Geometry) and part.source_size == mask.size
    assert (part.resize, part.crop, part.bucket, part.fps) == (geom.resize, geom.crop, geom.bucket, geom.fps)
    sx, sy = mask.size[0] / w, mask.size[1] / h
    assert part.source_box == pytest.approx(tuple(v * s for v, s in zip(geom.source_box, (sx, sy, sx, sy))))
    assert part.source_box == pytest.approx(tuple(v / 2 for v in geom.source_box), abs=1.0)
    # the same output pixels: the half-size copy lands where the target does
    a = resize_crop_image(target, geom).astype(np.int16)
    b = resize_crop_image(mask, part).astype(np.int16)
    assert a.shape == b.shape == (128, 128, 3)
    assert np.abs(a - b).mean() < 6
    shifted = np.abs(a[:, 4:] - b[:, :-4]).mean()  # a 4-pixel misalignment is visibly worse
    assert shifted > 2 * np.abs(a - b).mean()


def test_partner_of_another_aspect_is_refused():
    geom = decide(640, 480, Bucket(256, 256, 1))
    for_partner(geom, "mask", 321, 240)  # 0.3 % off: resized onto the target's geometry
    with pytest.raises(ItemError) as e:
        for_partner(geom, "mask", 320, 200, name="tbl/a.jpg")
    assert e.value.status == "failed:mask_geometry_mismatch"
    assert "320x200" in e.value.detail and "640x480" in e.value.detail


def test_partner_clip_must_hold_the_targets_frames():
    geom = decide(640, 360, Bucket(256, 128, 9), frame_indices=list(range(0, 18, 2)), fps=12.0)
    assert geom.frame_indices == (0, 2, 4, 6, 8, 10, 12, 14, 16)
    assert for_partner(geom, "reference", 320, 180, frames=17).frame_indices == geom.frame_indices
    with pytest.raises(ItemError) as e:
        for_partner(geom, "reference", 320, 180, frames=16)
    assert e.value.status == "failed:reference_too_short"


def test_geometry_matches_the_resize_crop_rule():
    geom = decide(640, 480, Bucket(256, 256, 1))
    rc = geom.resize_crop
    assert (rc.resize_w, rc.resize_h, rc.crop_x0, rc.crop_y0, rc.crop_w, rc.crop_h) == (341, 256, 42, 0, 256, 256)
    assert geom.out_size == (256, 256) and geom.crop == rc.box


# ---------------------------------------------------------------- the ledger


_OLD_ITEMS = """CREATE TABLE items (
    idx INTEGER PRIMARY KEY, item_id TEXT NOT NULL UNIQUE, key TEXT NOT NULL UNIQUE, source INTEGER NOT NULL,
    path TEXT NOT NULL, relpath TEXT NOT NULL, caption TEXT, label INTEGER, label_name TEXT, meta TEXT NOT NULL,
    sha256 TEXT, size_bytes INTEGER, kind TEXT NOT NULL, width INTEGER, height INTEGER, image_format TEXT,
    mode TEXT, split TEXT NOT NULL, plan_status TEXT NOT NULL, detail TEXT, dup_of TEXT);"""


def test_an_old_ledger_without_media_opens(tmp_path):
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.executescript(_OLD_ITEMS)
    db.execute("INSERT INTO items VALUES (0,'s/a.jpg','s_a',0,'/d/a.jpg','a.jpg',NULL,NULL,NULL,'{}','ab',10,"
               "'image',4,3,'JPEG','RGB','train','ok',NULL,NULL)")
    db.commit()
    db.close()
    led = Ledger(path)
    try:
        [old] = list(led.items())
        assert old.media == {"target": MediaRef("/d/a.jpg", "a.jpg", "image", 10, "ab", 4, 3, "JPEG", "RGB")}
        new = PlannedItem(idx=1, item_id="s/b.jpg", key="s_b", source=0, path="/d/b.jpg", relpath="b.jpg",
                          caption=None, label=None, label_name=None, meta={}, sha256="cd", size_bytes=5, kind="image",
                          width=2, height=2, image_format="PNG", mode="L", split="train", plan_status="ok",
                          media={"target": MediaRef("/d/b.jpg", "b.jpg", "image", 5, "cd", 2, 2, "PNG", "L"),
                                 "mask": MediaRef("/d/bm.png", "bm.png", "image", 3, "ef", 1, 1, "PNG", "L")})
        with led.transaction():
            led.add_items([new])
        assert list(led.items())[1] == new
    finally:
        led.close()
    Ledger(path).close()  # opens again with the column now there


def test_media_column_json_is_every_field_in_order_and_audio_copied():
    """The ledger's media column is the dataclass's fields in declaration order (as ``asdict`` wrote them);
    the audio facts are a copy: changing the returned dict leaves the ref as it was."""
    from dataclasses import asdict

    from shardsmith.records import media_from_json, media_to_json

    audio = {"rate": 48000, "channels": 2, "layout": "stereo", "duration": 4.5, "codec": "aac", "stream": 0}
    refs = {"target": MediaRef("/d/a.m4a", "a.m4a", "audio", 9, "ab", audio=audio),
            "mask": MediaRef("/d/m.png", "m.png", "image", 3, "ef", 1, 1, "PNG", "L")}
    text = media_to_json(refs)
    assert text == json.dumps({r: asdict(m) for r, m in refs.items()}, ensure_ascii=False)
    assert list(json.loads(text)["target"]) == ["path", "relpath", "kind", "size_bytes", "sha256", "width", "height",
                                                 "image_format", "mode", "audio"]
    assert media_from_json(text) == refs
    d = refs["target"].to_json()
    d["audio"]["rate"] = 1
    assert refs["target"].audio["rate"] == 48000
