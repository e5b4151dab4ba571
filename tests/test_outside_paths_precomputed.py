"""A table source with ``allow_outside_paths: true`` built into a ``.precomputed/`` tree: a row naming a file
outside the table's folder (``../out_side/y.jpg``, an absolute path elsewhere) was a ValueError traceback from
``formats/precomputed.py`` ``mirrored()`` mid-build; the user allowed those files, so they are written, inside
the tree: each ``..`` is a ``__`` folder, an absolute path's root a ``_`` folder
(``formats.precomputed.tree_path``), and nothing is written outside the output folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from media_factory import real_photos, write_table
from shardsmith.formats.precomputed import cache_files


def _files(root: Path, skip: Path) -> dict[str, int]:
    """Every file and link under ``root`` (outside ``skip``), with its modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip.parent:
            dirnames[:] = [d for d in dirnames if d != skip.name]
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            out[str(p)] = p.lstat().st_mtime_ns
    return out


@pytest.mark.slow
def test_outside_rows_are_mirrored_inside_the_tree(tmp_path):
    table_dir = tmp_path / "tab"
    inside = real_photos(table_dir / "media", 1, seed=71, min_side=48, max_side=80)
    real_photos(table_dir / "media" / "sub", 1, seed=72, min_side=48, max_side=80)
    # a file inside the table's folder spelled as the outside one is mirrored (__/out_side/y): both are kept
    twin = real_photos(table_dir / "__" / "out_side", 1, seed=73, min_side=48, max_side=80)[0]
    twin = twin.rename(twin.with_name("y.jpg"))
    y = real_photos(tmp_path / "out_side", 1, seed=74, min_side=48, max_side=80)[0]
    y = y.rename(y.with_name("y.jpg"))
    z = real_photos(tmp_path / "elsewhere", 1, seed=75, min_side=48, max_side=80)[0]
    w = real_photos(tmp_path / "w_src", 1, seed=76, min_side=48, max_side=80)[0].rename(table_dir / "media" / "w.jpg")
    (table_dir / "lnk").symlink_to(table_dir / "media" / "sub")  # lnk/../w.jpg reads media/w.jpg
    rows = [{"file": f"media/{inside[0].name}", "caption": "inside"},
            {"file": "../out_side/y.jpg", "caption": "outside, relative"},
            {"file": str(z), "caption": "outside, absolute"},
            {"file": "__/out_side/y.jpg", "caption": "inside, spelled like the outside one"},
            {"file": "lnk/../w.jpg", "caption": "a .. after a link"}]
    table = write_table(table_dir, rows, "csv")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(table), "columns": {"media": "file", "caption": "caption"},
                     "allow_outside_paths": True}],
        "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 8},
        "outputs": [{"format": "precomputed", "latent_dtype": "float32"}]}), encoding="utf-8")
    out = tmp_path / "build"
    before = _files(tmp_path, out)

    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(recipe), "--out", str(out)],
                       capture_output=True, text=True)
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    assert "Traceback" not in output and "ValueError" not in output
    assert "5 of 5 inputs written" in output, output

    tree = out / ".precomputed"
    latents = cache_files(tree, "latents")
    assert cache_files(tree, "conditions") == latents  # the trainer pairs every sample
    assert len(latents) == 5 and len(set(latents)) == 5
    assert f"media/{inside[0].stem}.pt" in latents
    assert "_" + z.with_suffix(".pt").as_posix() in latents  # /abs/z.jpg -> _/abs/z.pt
    # ../out_side/y.jpg and the real __/out_side/y.jpg: one keeps the plain name, the other its digest
    twins = sorted(n for n in latents if n.startswith("__/out_side/"))
    assert len(twins) == 2 and twins[0] == "__/out_side/y.pt" and re.fullmatch(r"__/out_side/y_[0-9a-f]{8}\.pt",
                                                                                 twins[1]), latents
    assert any(re.fullmatch(r"lnk/__/w_[0-9a-f]{8}\.pt", n) for n in latents), latents
    for sub in ("latents", "conditions"):
        for p in (tree / sub).rglob("*"):
            assert ".." not in p.relative_to(tree).parts
            assert p.resolve().is_relative_to(tree.resolve())

    # nothing was written, or touched, outside the output folder
    assert _files(tmp_path, out) == before
    assert y.is_file() and z.is_file() and twin.is_file() and w.is_file()
