"""A refusal of the complete plan (a source with no input, inputs of kinds an output does not take, a holdout that
takes every item of an output) leaves nothing in ``--out`` that blocks the user's fix: the corrected re-run with the
same ``--out`` builds, whether the fix is in the recipe or in the sources.

Before: a fix in the sources (a file put into the empty folder, images beside the audio files) was refused again
from the old plan, which stood complete ("holds no media file" of a folder that now holds one); and where the first
(latent) output ran ahead of the plan, an empty source or the holdout refusal left its units in the ledger, so the
corrected recipe was refused as "a build of a different recipe"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from test_cli_mistakes import assert_message, invoke
from test_recipe_refusals_2 import _wav

TINY = {"vae": {"family": "sd", "config": "tiny"}, "device": "cpu", "batch_size": 2}
LATENT = {"format": "latent_wds", "samples_per_shard": 1}
EMPTY = "source 'b' ({}) holds no media file"


def _images(folder: Path, n: int, start: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + n):
        Image.new("RGB", (64, 64), (40 * i % 256, 90, 160)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"picture {i}")
    return folder


def _write(path: Path, **recipe) -> Path:
    path.write_text(yaml.safe_dump(recipe))
    return path


def _built(out: Path, recipe: Path, written: int) -> dict:
    code, output = invoke("build", recipe, "--out", out, "--no-report", "-q")
    assert code == 0, output
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["inputs"] == m["counts"]["written"] == written, m["counts"]
    return m


def test_an_empty_source_filled_then_the_same_command_builds(tmp_path):
    _images(tmp_path / "a", 3)
    (tmp_path / "b").mkdir()
    recipe = _write(tmp_path / "r.yaml", sources=[{"path": "a"}, {"path": "b"}], outputs=[{"format": "wds"}])
    out = tmp_path / "out"
    code, output = invoke("build", recipe, "--out", out, "--no-report")
    assert_message(code, output, EMPTY.format(tmp_path / "b"))
    _images(tmp_path / "b", 2, start=10)  # the fix: the folder is filled
    m = _built(out, recipe, 5)
    assert [s["items"] for s in m["sources"]] == [3, 2]


def test_an_empty_source_removed_from_the_recipe_builds_in_the_same_out(tmp_path):
    _images(tmp_path / "a", 3)
    (tmp_path / "b").mkdir()
    out = tmp_path / "out"
    code, output = invoke("build", _write(tmp_path / "r.yaml", sources=[{"path": "a"}, {"path": "b"}],
                                          outputs=[{"format": "wds"}]), "--out", out, "--no-report")
    assert_message(code, output, EMPTY.format(tmp_path / "b"))
    _built(out, _write(tmp_path / "fix.yaml", sources=[{"path": "a"}], outputs=[{"format": "wds"}]), 3)


def test_audio_files_only_then_images_added_the_same_command_builds(tmp_path, monkeypatch):
    """Refused from the plan (the name walk gives up at once, as past its bound), then images put beside the audio
    files: the same command plans again and writes them (the audio files skipped as an image output's)."""
    import shardsmith.precheck as precheck

    monkeypatch.setattr(precheck, "FOLDER_WALK_LIMIT", 1)
    for i in range(2):
        _wav(tmp_path / "src" / f"s{i}.wav", tone=440 + 110 * i)
    recipe = _write(tmp_path / "r.yaml", sources=[{"path": "src"}], outputs=[{"format": "wds"}])
    out = tmp_path / "out"
    code, output = invoke("build", recipe, "--out", out, "--no-report")
    assert_message(code, output, "output 'wds' (outputs[0], wds) would write nothing",
                   "(the plan found only audio files in source 'src')")
    _images(tmp_path / "src", 2)
    code, output = invoke("build", recipe, "--out", out, "--no-report", "-q")
    assert code == 0, output
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 2 and m["counts"]["skipped"] == {"unsupported_kind_audio": 2}, m["counts"]


@pytest.mark.slow  # (loads a VAE)
def test_an_empty_source_where_the_latent_output_ran_ahead_then_the_corrected_recipe_builds(tmp_path):
    _images(tmp_path / "a", 3)
    (tmp_path / "b").mkdir()
    out = tmp_path / "out"

    def recipe(name: str, sources: list[dict]) -> Path:
        return _write(tmp_path / name, sources=sources, models=TINY, geometry={"buckets": ["64x64x1"]},
                      outputs=[LATENT])

    code, output = invoke("build", recipe("r.yaml", [{"path": "a"}, {"path": "b"}]), "--out", out, "--no-report")
    assert_message(code, output, EMPTY.format(tmp_path / "b"))
    assert not list(out.rglob("*.tar"))  # what the latent output wrote ahead of the plan went with the refusal
    _built(out, recipe("fix.yaml", [{"path": "a"}]), 3)


@pytest.mark.slow  # (loads a VAE)
def test_a_holdout_refused_where_the_latent_output_ran_ahead_then_the_corrected_recipe_builds(tmp_path):
    """Seed 0 holds out b's one image at a fraction of 0.5 (and one of a's four): output 'wds' would have no
    training item, refused once the plan is complete, after the latent output wrote a's units ahead of it."""
    _images(tmp_path / "a", 4)
    Image.new("RGB", (64, 64), (1, 2, 3)).save(_images(tmp_path / "b", 0) / "x.png")
    out = tmp_path / "out"

    def recipe(name: str, holdout: float) -> Path:
        return _write(tmp_path / name, sources=[{"path": "a"}, {"path": "b"}], models=TINY,
                      geometry={"buckets": ["64x64x1"]}, split={"holdout": holdout, "seed": 0},
                      outputs=[{**LATENT, "sources": ["a"]}, {"format": "wds", "sources": ["b"]}])

    code, output = invoke("build", recipe("r.yaml", 0.5), "--out", out, "--no-report")
    assert_message(code, output, "split.holdout (a fraction of 0.5) holds out all 1 planned item(s) of output 'wds'")
    _built(out, recipe("fix.yaml", 0.0), 5)
