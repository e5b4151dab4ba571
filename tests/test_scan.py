"""``shardsmith scan``: probes real media without writing anything and reports exact counts.

The fixture folder mixes real photos (scikit-image's astronaut, chelsea, coffee, camera) with
the usual breakage: a truncated JPEG, a zero-byte file, a text file named ``.jpg``, two
byte-identical copies, a latin-1 caption sidecar and a table row naming a missing file.
"""

from __future__ import annotations

import io
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from skimage import data as skdata

from shardsmith import formats
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.scan import ASPECT_BINS, SHORT_SIDE_BINS, format_scan, human_bytes, scan
from shardsmith.scan.histograms import binned, stats

PY = "/work/venv/bin/python" if Path("/work/venv/bin/python").exists() else sys.executable


def _jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90, **kw)
    return buf.getvalue()


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _listing(root: Path) -> dict[str, tuple[int, float]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.stat()
            out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scanmedia")
    astronaut = Image.fromarray(skdata.astronaut())  # 512x512 RGB
    chelsea = Image.fromarray(skdata.chelsea())  # 451x300 RGB
    coffee = Image.fromarray(skdata.coffee())  # 600x400 RGB
    camera = Image.fromarray(skdata.camera())  # 512x512 L

    photos = root / "photos"
    for d in ("cats", "people", "food"):
        (photos / d).mkdir(parents=True)
    cat = _jpeg(chelsea)
    (photos / "cats" / "chelsea.jpg").write_bytes(cat)
    (photos / "cats" / "chelsea.txt").write_text("a cat on a table", encoding="utf-8")
    (photos / "cats" / "chelsea_copy.jpg").write_bytes(cat)  # exact duplicate
    (photos / "people" / "astronaut.jpg").write_bytes(_jpeg(astronaut))
    (photos / "people" / "camera.png").write_bytes(_png(camera))  # grayscale, mode L
    exif = Image.Exif()
    exif[0x0112] = 8  # stored 600x400, upright 400x600
    (photos / "food" / "coffee.jpg").write_bytes(_jpeg(coffee, exif=exif.tobytes()))
    (photos / "food" / "x.jpg").write_bytes(_jpeg(coffee.crop((100, 100, 300, 300))))
    (photos / "food" / "x.txt").write_bytes(b"caf\xe9")  # latin-1, not UTF-8
    full = _jpeg(astronaut.rotate(90))
    (photos / "food" / "truncated.jpg").write_bytes(full[: int(len(full) * 0.6)])
    (photos / "food" / "empty.jpg").write_bytes(b"")
    (photos / "food" / "notes.jpg").write_text("this is not a picture\n", encoding="utf-8")

    tbl = root / "tbl"
    (tbl / "img").mkdir(parents=True)
    (tbl / "img" / "wide.jpg").write_bytes(_jpeg(astronaut.crop((0, 100, 400, 250))))  # 400x150
    (tbl / "img" / "tall.png").write_bytes(_png(chelsea.crop((150, 0, 270, 300))))  # 120x300
    (tbl / "meta.csv").write_text(
        "file,caption\n"
        "img/wide.jpg,an astronaut in a wide crop\n"
        "img/tall.png,\n"
        "img/missing.jpg,this file is gone\n", encoding="utf-8")
    return root


def _recipe(media: Path, **extra):
    data = {
        "sources": [{"path": str(media / "photos"), "license": "CC0-1.0", "origin": "skimage"},
                    {"path": str(media / "tbl" / "meta.csv")}],
        "outputs": [{"format": "wds", "dir": "wds"}, {"format": "zip", "path": "d.zip", "resolution": 64}],
    }
    data.update(extra)
    return recipe_from_dict(data)


@pytest.fixture(scope="module")
def report(media) -> dict:
    before = _listing(media)
    rep = scan(_recipe(media), batch=8, updates=100)
    assert _listing(media) == before, "scan must not write anything into the sources"
    return rep


def test_report_is_json_and_sources(report):
    assert json.loads(json.dumps(report)) == report
    s = report["sources"]
    assert list(s) == ["photos", "meta"]
    assert s["photos"]["kind"] == "folder" and s["meta"]["kind"] == "table"
    assert s["photos"]["items"] == 9 and s["meta"]["items"] == 3
    assert s["photos"]["labels"] == ["cats", "food", "people"] and s["meta"]["labels"] is None
    assert s["photos"]["license"] == "CC0-1.0" and s["photos"]["origin"] == "skimage"
    photo_bytes = sum(p.stat().st_size for p in Path(s["photos"]["path"]).rglob("*.*") if p.suffix != ".txt")
    assert s["photos"]["bytes"] == photo_bytes
    assert report["items"] == 12


def test_kinds_licences_labels_captions(report):
    assert report["kinds"] == {"image": 12, "video": 0, "audio": 0, "other": 0}
    assert report["licenses"] == {"CC0-1.0": 9, "undeclared": 3}
    assert report["labels"] == {"cats": 2, "food": 5, "people": 2}
    assert report["labels_usable"] == {"cats": 1, "food": 1, "people": 2}
    # chelsea.txt + the three table captions (one of them empty); x.txt is a problem, not a caption
    assert report["captions"] == {"with_caption": 4, "empty": 1, "without": 8}
    assert any("no declared licence" in w for w in report["warnings"])


def test_problems(report):
    assert report["problem_counts"] == {
        "failed:truncated": 1, "failed:empty_file": 1, "failed:not_an_image": 1,
        "failed:caption_not_utf8": 1, "failed:missing_file": 1}
    by_id = {p["id"]: p for p in report["problems"]}
    assert set(by_id) == {"photos/food/truncated.jpg", "photos/food/empty.jpg", "photos/food/notes.jpg",
                          "photos/food/x.jpg", "meta/img/missing.jpg"}
    assert by_id["photos/food/truncated.jpg"]["status"] == "failed:truncated"
    assert by_id["photos/food/x.jpg"]["status"] == "failed:caption_not_utf8"
    assert "0xe9" in by_id["photos/food/x.jpg"]["detail"]
    assert by_id["meta/img/missing.jpg"]["path"].endswith("missing.jpg")
    assert all(p["detail"] for p in report["problems"])


def test_duplicates(report):
    d = report["duplicates"]
    assert d["duplicate_items"] == 1
    assert [g["items"] for g in d["groups"]] == [["photos/cats/chelsea.jpg", "photos/cats/chelsea_copy.jpg"]]
    assert len(d["groups"][0]["sha256"]) == 64


def test_image_stats(report):
    im = report["images"]
    # decoded: chelsea, its copy, astronaut, camera, coffee, x (bad caption, good pixels), wide, tall
    assert im["count"] == 8
    assert list(im["short_side"]) == [b for b, _ in SHORT_SIDE_BINS]
    assert list(im["aspect"]) == [b for b, _ in ASPECT_BINS]
    assert sum(im["short_side"].values()) == sum(im["aspect"].values()) == im["count"]
    assert im["short_side"] == {"<64": 0, "64-127": 1, "128-255": 2, "256-511": 3, "512-1023": 2,
                                "1024-2047": 0, ">=2048": 0}
    assert im["aspect"] == {"<0.5": 1, "0.5-0.75": 1, "0.75-0.9": 0, "0.9-1.1": 3, "1.1-1.33": 0,
                            "1.33-1.8": 2, "1.8-2.5": 0, ">=2.5": 1}
    assert im["width"] == {"min": 120, "median": 425.5, "max": 512}
    assert im["height"] == {"min": 150, "median": 300, "max": 600}
    assert im["modes"] == {"RGB": 7, "L": 1}
    assert im["formats"] == {"JPEG": 6, "PNG": 2}
    assert im["notes"] == {"exif_transposed": 1}  # coffee.jpg, orientation 8
    assert im["below_min_size"] == 0


def test_estimate_matches_a_real_build(media, report, tmp_path):
    est = report["estimate"]
    assert set(est) == {"wds", "zip"}
    w, z = est["wds"], est["zip"]
    assert w["usable"] == 6 and w["sampled"] == 6 and w["written_in_sample"] == 6 and w["samples"] == 6
    # the ZIP is class-conditional: the two unlabelled table images would be skipped:no_label
    assert z["sampled"] == 6 and z["written_in_sample"] == 4 and z["samples"] == 4
    assert z["skipped_in_sample"] == {"skipped:no_label": 2}
    assert any("2 usable image(s) have no class label" in x for x in report["warnings"])
    for e in (w, z):
        assert e["bytes"] > 0 and e["per_sample_bytes"] > 0 and e["human"] == human_bytes(e["bytes"])

    manifest = build(_recipe(media), tmp_path / "out", quiet=True, workers=1)
    outs = manifest["outputs"]
    real_wds = sum(s["bytes"] for s in outs["wds"]["files"]["train"]["shards"])
    real_zip = outs["zip"]["files"]["train"]["bytes"]
    assert outs["wds"]["counts"]["written"] == 6 and outs["zip"]["counts"]["written"] == 4
    assert real_wds / 2 <= w["bytes"] <= real_wds * 2
    assert real_zip / 2 <= z["bytes"] <= real_zip * 2
    # the estimate uses the real makers on every usable image here, so it is close, not just within 2x
    assert abs(w["bytes"] - real_wds) / real_wds < 0.05
    assert abs(z["bytes"] - real_zip) / real_zip < 0.05


def test_enough_data(report):
    en = report["enough_data"]
    assert en["usable"] == 6 and en["holdout"] == 0 and en["unique"] == 6
    assert en["samples_seen"] == 800
    assert en["repetition"] == pytest.approx(133.3, abs=0.05)
    assert len(en["warnings"]) == 2
    assert "seen ~133.3 times" in en["warnings"][0] and "memorisation" in en["warnings"][0]
    assert "tiny dataset" in en["warnings"][1]
    assert all(w in report["warnings"] for w in en["warnings"])


def test_enough_data_without_batch_and_with_holdout(media):
    rep = scan(_recipe(media, split={"holdout": 2, "seed": 3}), size_sample=2)
    en = rep["enough_data"]
    assert en["usable"] == 6 and en["holdout"] == 2 and en["unique"] == 4
    assert "repetition" not in en and "samples_seen" not in en
    assert [w for w in en["warnings"] if "tiny" in w]
    assert rep["estimate"]["wds"]["sampled"] == 2 and rep["estimate"]["wds"]["samples"] == 6
    # a generous budget: no memorisation warning
    rep = scan(_recipe(media), batch=1, updates=6, size_sample=0)
    assert rep["enough_data"]["repetition"] == 1.0
    assert not [w for w in rep["enough_data"]["warnings"] if "memorisation" in w]
    assert rep["estimate"]["wds"]["bytes"] == 0 and rep["estimate"]["wds"]["sampled"] == 0


def test_one_sample_recipe_still_scans_everything(media, report):
    rep = scan(_recipe(media, one_sample=True), batch=8, updates=100)
    assert rep["items"] == 12 and rep["problem_counts"] == report["problem_counts"] and rep["usable"] == 6


def test_no_dedup_and_min_size(media):
    rep = scan(_recipe(media, split={"dedup": False}, images={"min_size": 200}), size_sample=0)
    # below 200: wide (150) and tall (120) -> too small; x is a problem anyway (its 200 is not below)
    assert rep["images"]["below_min_size"] == 2
    assert rep["duplicates"]["duplicate_items"] == 1 and rep["duplicates"]["dedup"] is False
    en = rep["enough_data"]
    assert en["usable"] == 5 and en["unique"] == 4  # chelsea copy kept, but it is not a distinct sample
    assert any("min_size=200" in w for w in rep["warnings"])


def test_format_scan_text(report):
    text = format_scan(report)
    for needle in ("sources", "licences", "shorter side", "aspect ratio", "problems (5)", "failed:truncated",
                   "exact duplicates (1 group(s), 1 extra copies)", "estimated output size", "enough data?",
                   "UNDECLARED", "repetition 133.3x"):
        assert needle in text, needle
    assert re.search(r"^    512-1023 +2  #+$", text, re.M)  # histogram row: label, count, bar
    for w in report["warnings"]:
        assert f"warning: {w}" in text


def _cli(media: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "shardsmith", "scan", str(media / "photos"), str(media / "tbl" / "meta.csv"),
                           *args], capture_output=True, text=True, timeout=60, cwd=media.parent)


@pytest.mark.slow
def test_cli_json_and_text(media, report):
    before = _listing(media)
    res = _cli(media, "--json", "--batch", "8", "--updates", "100")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    for key in ("kinds", "problem_counts", "duplicates", "images", "captions", "labels", "enough_data"):
        assert rep[key] == report[key], key
    assert rep["licenses"] == {"undeclared": 12}
    assert list(rep["estimate"]) == ["wds"]
    assert rep["estimate"]["wds"]["bytes"] == report["estimate"]["wds"]["bytes"]

    res = _cli(media, "--batch", "8", "--updates", "100")
    assert res.returncode == 0, res.stderr
    assert "warning: each sample would be seen ~133.3 times" in res.stdout
    assert "warning: tiny dataset" in res.stdout
    assert "warning: 12 item(s) have no declared licence" in res.stdout
    assert _listing(media) == before


def test_splits_match_a_real_build(media, tmp_path):
    # count holdout, duplicates kept: like the planner, the truncated JPEG (whose header is fine) takes a
    # holdout slot with seed 2, and the kept copy follows its first copy's split
    extra = {"split": {"holdout": 3, "seed": 2, "dedup": False}}
    en = scan(_recipe(media, **extra), size_sample=0)["enough_data"]
    manifest = build(_recipe(media, **extra), tmp_path / "out", quiet=True, workers=1)
    splits = manifest["outputs"]["wds"]["splits"]
    assert en["usable"] == splits["train"]["written"] + splits["holdout"]["written"] == 7
    assert en["holdout"] == splits["holdout"]["written"] == 2
    assert en["unique"] == 4  # 5 written to train, one of them a byte-identical copy


def test_problems_are_what_a_build_records(media, report, tmp_path):
    # scan runs the build's planner and the transform's decode: each problem is the status and detail the
    # build's ledger gives that item (skipped duplicates are not problems)
    build(_recipe(media), tmp_path / "out", quiet=True, workers=1)
    ledger = Ledger(tmp_path / "out" / formats.LEDGER_FILE)
    try:
        recorded = {i: (st, det) for _, i, st, det in ledger.status_rows("wds", written=False)
                    if st != "skipped:duplicate"}
    finally:
        ledger.close()
    assert {p["id"]: (p["status"], p["detail"]) for p in report["problems"]} == recorded


@pytest.mark.parametrize("values, median", [([], None), ([5], 5), ([4, 1, 3], 3), ([1, 2, 4, 3], 2.5), ([2, 4], 3)])
def test_histogram_stats_in_sql(values, median):
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (v INTEGER)")
    db.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    assert stats(db, "t", "1", "v") == {"min": min(values, default=None), "median": median,
                                        "max": max(values, default=None)}
    assert isinstance(stats(db, "t", "1", "v")["median"], type(median))
    # a bin holds values below its upper bound; the last bin takes the rest
    db.executemany("INSERT INTO t VALUES (?)", [(63,), (64,), (2047,), (2048,), (99999,)])
    hist = binned(db, "t", "v >= 63", "v", SHORT_SIDE_BINS)
    assert list(hist) == [b for b, _ in SHORT_SIDE_BINS]
    assert (hist["<64"], hist["64-127"], hist["1024-2047"], hist[">=2048"]) == (1, 1, 1, 2)
    assert binned(db, "t", "v = 64", "v * 1.0 / 58", ASPECT_BINS)["1.1-1.33"] == 1  # 64/58 = 1.103


def test_enough_data_counts_the_effective_batch_and_the_updates_to_the_repeat_limit():
    """samples seen = batch x grad_accum x world x updates; every sample seen max_repeat times after
    ceil(max_repeat x unique / effective batch) updates (hand arithmetic)."""
    from shardsmith.scan.verdicts import enough_data

    en = enough_data(usable=12_000, holdout=2_000, unique=10_000, batch=8, updates=5_000, max_repeat=20,
                     grad_accum=4, world=8)
    assert en["effective_batch"] == 256 and en["samples_seen"] == 1_280_000
    assert en["repetition"] == 128.0
    assert en["updates_to_max_repeat"] == 782  # ceil(20 * 10000 / 256) = ceil(781.25)
    assert len(en["warnings"]) == 1 and "seen ~128.0 times" in en["warnings"][0]
    assert "train at most 782 updates" in en["warnings"][0]
    # one device, no accumulation: the batch alone, as before
    en = enough_data(usable=10_000, holdout=0, unique=10_000, batch=8, updates=5_000, max_repeat=20)
    assert en["effective_batch"] == 8 and en["samples_seen"] == 40_000 and en["repetition"] == 4.0
    assert en["updates_to_max_repeat"] == 25_000 and not en["warnings"]
    # a tiny dataset: plumbing only, said loudly even with a modest budget
    en = enough_data(usable=40, holdout=0, unique=40, batch=4, updates=5, max_repeat=20, world=2)
    assert en["samples_seen"] == 40 and en["updates_to_max_repeat"] == 100
    assert any("tiny dataset" in w and "plumbing only" in w for w in en["warnings"])


def test_scan_cli_takes_grad_accum_and_world(media):
    from typer.testing import CliRunner

    from shardsmith import cli

    r = CliRunner().invoke(cli.app, ["scan", str(media), "--batch", "2", "--grad-accum", "3", "--world", "4",
                                     "--updates", "10", "--json", "-q"])
    assert r.exit_code == 0, r.output
    en = json.loads(r.output[r.output.index("{"):])["enough_data"]
    assert en["effective_batch"] == 24 and en["samples_seen"] == 240 and en["grad_accum"] == 3 and en["world"] == 4
    r = CliRunner().invoke(cli.app, ["scan", str(media), "--batch", "2", "--grad-accum", "3", "--world", "4",
                                     "--updates", "10", "-q"])
    assert "batch 2 x grad-accum 3 x world 4 = effective batch 24; x updates 10 = 240 samples seen" in r.output
