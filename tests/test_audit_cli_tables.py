"""Audit A, findings F5, F6, F8, F10 (recipe and table messages) and F11: each user mistake is one
message and exit code 2 before any probing, a flag is never silently dropped, and a table never
loses a cell or a column without a word."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from shardsmith import cli
from shardsmith.errors import UserError
from shardsmith.recipe import recipe_from_dict

PHOTOS = ("astronaut", "coffee", "chelsea")


def invoke(*args) -> tuple[int, str]:
    """``shardsmith ARGS`` in this process: (exit code, stdout + stderr, whitespace and box lines folded)."""
    r = CliRunner().invoke(cli.app, [str(a) for a in args], env={"COLUMNS": "300"})
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception  # a traceback is a failure of its own
    return r.exit_code, r.output


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def assert_message(code: int, output: str, *texts: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    flat = _flat(output)
    for t in texts:
        assert t in flat, f"{t!r} not in:\n{output}"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Three real photos (scikit-image's), small."""
    import numpy as np
    import skimage.data
    from PIL import Image

    d = tmp_path_factory.mktemp("audit") / "photos"
    d.mkdir()
    for name in PHOTOS:
        im = Image.fromarray(np.asarray(getattr(skimage.data, name)())[..., :3])
        im.thumbnail((96, 96))
        im.save(d / f"{name}.jpg", quality=90)
    return d


def _never_probe(monkeypatch) -> None:
    """Fail the test if the plan (the probe) starts."""
    import shardsmith.scan.dry_run

    def never(*a, **k):
        raise AssertionError("the plan (probing) started before the flags were checked")

    monkeypatch.setattr(shardsmith.scan.dry_run, "make_plan", never)


# ---------------------------------------------------------------- F5: scan's training figures

@pytest.mark.parametrize("flags, name", [
    (["--batch", "0", "--updates", "10"], "--batch"),  # was a ZeroDivisionError after the whole probe
    (["--batch", "-4", "--updates", "10"], "--batch"),  # was a report of -40 samples seen
    (["--batch", "4", "--updates", "-10"], "--updates"),
    (["--batch", "4", "--updates", "0"], "--updates"),
    (["--max-repeat", "-1"], "--max-repeat"),
    (["--max-repeat", "0"], "--max-repeat"),
])
def test_scan_refuses_training_figures_below_one_before_probing(photos, monkeypatch, flags, name):
    _never_probe(monkeypatch)
    code, out = invoke("scan", photos, *flags)
    assert_message(code, out, f"Invalid value for '{name}'")


def test_the_scan_api_refuses_a_zero_batch_before_probing(photos, monkeypatch):
    import shardsmith

    _never_probe(monkeypatch)
    recipe = {"sources": [{"path": str(photos)}], "outputs": [{"format": "wds"}]}
    with pytest.raises(UserError, match="batch=0"):
        shardsmith.scan(recipe, batch=0, updates=10)
    with pytest.raises(UserError, match="max_repeat"):
        shardsmith.scan(recipe, batch=2, updates=10, max_repeat=0)


def test_scan_warns_that_build_would_refuse_a_holdout_of_everything(photos):
    code, out = invoke("scan", photos, "--holdout", str(len(PHOTOS)), "--json")
    assert code == 0, out
    warns = json.loads(out)["warnings"]
    refused = [w for w in warns if "build would refuse this holdout" in w]
    assert refused, warns
    # the build's own message (safety.holdout), counts and fix included
    assert f"holds out all {len(PHOTOS)} planned item(s) of output 'wds'" in refused[0]
    assert "the train split would be empty" in refused[0] and "split.holdout: 1" in refused[0]
    code, out = invoke("scan", photos, "--holdout", "1", "--json")
    assert code == 0 and not any("would refuse" in w for w in json.loads(out)["warnings"]), out


# ---------------------------------------------------------------- F6: --load-text-encoder-in-8bit with --set

def _raw(sources=None, to=None, sets=(), recipe=None, **flags):
    data, _ = cli._raw_recipe(recipe, list(sources or []), flags, list(to or []), list(sets))
    return data


def test_the_8bit_flag_quantizes_a_text_encoder_given_by_set(photos):
    data = _raw([str(photos)], ["latent_wds"], ["models.vae.family=sd", "models.text.family=minilm",
                                                 "geometry.buckets=[64x64x1]"], text_8bit=True)
    assert data["models"]["text"] == {"family": "minilm", "quantize": "int8"}
    assert recipe_from_dict(data).models.text.quantize == "int8"


def test_the_8bit_flag_through_the_cli_is_not_refused_when_set_gives_the_text_encoder(photos, tmp_path, monkeypatch):
    """Up to the build itself: the flag is taken (no 'no text encoder' message) and reaches the recipe."""
    import shardsmith.build

    seen = {}

    def fake_build(recipe, out, **kw):
        seen["quantize"] = recipe.models.text.quantize
        return {"counts": {"written": 0, "inputs": 0}}

    monkeypatch.setattr(shardsmith.build, "build", fake_build)
    code, out = invoke("build", "--source", photos, "--to", "latent_wds", "--resolution-buckets", "64x64x1",
                       "--set", "models.vae.family=sd", "--set", "models.text.family=minilm",
                       "--load-text-encoder-in-8bit", "--out", tmp_path / "o", "-q")
    assert code == 0, out
    assert seen == {"quantize": "int8"}


def test_the_8bit_flag_without_any_text_encoder_is_still_refused(photos, tmp_path):
    code, out = invoke("build", "--source", photos, "--to", "latent_wds", "--resolution-buckets", "64x64x1",
                       "--set", "models.vae.family=sd", "--load-text-encoder-in-8bit", "--out", tmp_path / "o")
    assert_message(code, out, "--load-text-encoder-in-8bit", "no text encoder", "--set models.text.family")
    assert not (tmp_path / "o").exists()


def test_flag_and_set_precedence_stays_file_then_flag_then_set(photos, tmp_path):
    """Flags override the recipe file; --set overrides both (the 8-bit flag included)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(photos)}], "geometry": {"buckets": ["64x64x1"]},
        "outputs": [{"format": "wds", "image": {"quality": 70}}, {"format": "latent_wds"}],
        "models": {"vae": {"family": "sd"}, "text": {"family": "t5", "quantize": "fp8"}}}))
    data = _raw(recipe=recipe, text_8bit=True, quality=80)
    assert data["models"]["text"]["quantize"] == "int8" and data["outputs"][0]["image"]["quality"] == 80
    data = _raw(recipe=recipe, sets=["models.text.quantize=fp8", "outputs[0].image.quality=50"], text_8bit=True,
                quality=80)
    assert data["models"]["text"]["quantize"] == "fp8" and data["outputs"][0]["image"]["quality"] == 50
    # a --set that replaces models.text keeps the flag's quantization
    data = _raw(recipe=recipe, sets=["models.text={family: minilm}"], text_8bit=True)
    assert data["models"]["text"] == {"family": "minilm", "quantize": "int8"}


# ---------------------------------------------------------------- F8: flags that apply to no output or source

@pytest.mark.parametrize("flags, texts", [
    (["--to", "wds", "--resolution", "64"],
     ["--resolution applies to zip outputs", "(outputs: wds)", "for wds use --image-size 64"]),
    (["--to", "wds", "--transform", "center-crop"],
     ["--transform applies to zip outputs", "for wds use --resize-mode center_crop|border|keep_ratio"]),
    (["--to", "wds", "--zip-path", "small.zip"], ["--zip-path applies to zip outputs", "add a zip output (--to zip)"]),
    (["--to", "zip", "--image-size", "64"], ["--image-size applies to wds outputs", "for zip use --resolution 64"]),
    (["--to", "zip", "--quality", "50"], ["--quality applies to wds outputs", "leave --quality out"]),
    (["--to", "zip", "--samples-per-shard", "10"],
     ["--samples-per-shard applies to wds, latent_wds or prompt_wds outputs", "(outputs: zip)"]),
    (["--to", "latent_zip", "--resolution", "64x32"],
     ["--resolution applies to zip outputs", "for latent_zip use --set outputs[0].resolution=[64,32]"]),
    (["--to", "wds", "--columns", "media=file,caption=text"],
     ["--columns applies to table sources", "source '{photos}' is a folder", "leave --columns out"]),
    (["--to", "wds", "--caption-column", "text"], ["--caption-column applies to table sources", "is a folder"]),
    (["--to", "wds", "--video-column", "file"], ["--video-column applies to table sources"]),
    (["--to", "wds", "--engine", "ray"], ["--engine ray", "--gpus is 1 (the default)", "add --gpus N"]),
    (["--to", "wds", "--engine", "ray", "--gpus", "1"], ["--engine ray", "--gpus is 1,", "add --gpus N"]),
])
def test_a_flag_that_applies_to_no_output_or_source_is_a_message(photos, tmp_path, flags, texts):
    code, out = invoke("build", "--source", photos, *flags, "--out", tmp_path / "o")
    assert_message(code, out, *[t.format(photos=photos) for t in texts])
    assert not (tmp_path / "o").exists()


def test_scan_names_only_flags_it_has(photos, monkeypatch):
    _never_probe(monkeypatch)
    code, out = invoke("scan", photos, "--resolution", "64")  # scan has no --image-size
    assert_message(code, out, "--resolution applies to zip outputs", "--set outputs[0].image.size=64")
    assert "--image-size" not in out


def test_output_flags_still_apply_where_an_output_takes_them(photos, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": str(photos)}],
                                      "outputs": [{"format": "wds"}, {"format": "zip", "resolution": 32}]}))
    data = _raw(recipe=recipe, resolution="16", transform="center-crop-wide", quality=60)
    assert data["outputs"][0] == {"format": "wds", "image": {"quality": 60}}
    assert data["outputs"][1] == {"format": "zip", "resolution": 16, "transform": "center-crop-wide"}
    # --engine ray with more than one GPU, from the flag or the file, is taken
    assert _raw([str(photos)], ["wds"], engine="ray", gpus="2")["distribute"] == {"gpus": 2, "engine": "ray"}
    assert _raw([str(photos)], ["wds"], ["distribute.gpus=all"], engine="ray")["distribute"]["engine"] == "ray"
    # the column flags with a table among the sources
    table = photos.parent / "t.csv"
    table.write_text("file,text\ncoffee.jpg,a cup\n")
    data = _raw([str(table)], ["wds"], caption_column="text")
    assert data["sources"][0]["columns"] == {"caption": "text"}


# ---------------------------------------------------------------- F10: recipe and table-row messages

@pytest.mark.parametrize("name", ["list.yaml", "list.yml"])
def test_a_yaml_list_is_a_recipe_that_must_be_a_mapping_not_a_table(tmp_path, name):
    path = tmp_path / name
    path.write_text("[1, 2, 3]\n")
    code, out = invoke("build", path, "--out", tmp_path / "o")
    assert_message(code, out, f"recipe {path} must be a mapping with sources: and outputs:", "not a list")
    assert "dataset table" not in out


def _table_items(table: Path, **spec):
    from shardsmith.sources import open_sources

    recipe = recipe_from_dict({"sources": [{"path": str(table), **spec}], "outputs": [{"format": "wds"}]})
    (_, items), = open_sources(recipe)
    return list(items())


def test_a_table_row_naming_a_folder_or_a_pipe_says_what_it_is(photos, tmp_path):
    import shutil

    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(photos / "coffee.jpg", d / "coffee.jpg")
    (d / "sub.jpg").mkdir()
    os.mkfifo(d / "pipe.jpg")
    (d / "t.csv").write_text("file,text\n.,dot\nsub.jpg,a folder\npipe.jpg,a pipe\ncoffee.jpg,a cup\nnone.jpg,x\n")
    items = _table_items(d / "t.csv")
    errors = [i.error for i in items]
    assert [e[0] if e else None for e in errors] == ["not_a_regular_file"] * 3 + [None, "missing_file"]
    assert f"{d} is a folder, not a regular file" in errors[0][1] and "does not exist" not in errors[0][1]
    assert f"{d / 'sub.jpg'} is a folder, not a regular file" in errors[1][1]
    assert "is a named pipe (FIFO), not a regular file" in errors[2][1]
    assert "does not exist" in errors[4][1]


# ---------------------------------------------------------------- F11: CSV headers and ragged rows

def test_a_duplicated_csv_column_is_a_table_error(photos, tmp_path):
    table = photos.parent / "dupcol.csv"
    table.write_text("file,file,text\ncoffee.jpg,astronaut.jpg,a cup\n")
    code, out = invoke("build", table, "--out", tmp_path / "o", "-q")
    assert_message(code, out, "names column 'file' 2 times", "rename the others")
    assert not (tmp_path / "o" / "wds").exists()  # refused when the sources open: nothing planned or written


def test_a_csv_row_with_more_cells_than_the_header_is_a_bad_row(photos):
    table = photos.parent / "ragged.csv"
    table.write_text('file,text\nphotos/coffee.jpg,a cup,of coffee on a saucer\nphotos/chelsea.jpg,"a cat, ginger"\n'
                     "photos/astronaut.jpg\n")
    items = _table_items(table)
    assert [i.error[0] if i.error else None for i in items] == ["bad_row", None, None]
    bad = items[0]
    assert bad.item_id == "ragged/#row0" and bad.path == ""  # nothing to open
    assert "has 3 cells and the header 2" in bad.error[1] and "'of coffee on a saucer'" in bad.error[1]
    assert "quote a caption that contains commas" in bad.error[1]
    assert items[1].caption == "a cat, ginger"  # quoted commas are one cell, as before
    assert items[2].caption is None  # a short row still reads as before (its missing cells empty)


def test_a_csv_whose_every_row_is_ragged_says_why_not_no_rows(photos, tmp_path):
    table = photos.parent / "ragged_only.csv"
    table.write_text("file,text\ncoffee.jpg,a cup,of coffee\n")
    code, out = invoke("build", table, "--out", tmp_path / "o", "-q")
    assert_message(code, out, "has no readable row", "has 3 cells and the header 2", "quote a caption")
