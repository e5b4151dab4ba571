"""Issue 16: the Python API. `shardsmith.build`, `scan`, `verify`, `inspect`, `repair` with typed
results; the README's example runs as written; `import shardsmith` stays light."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import shardsmith
from media_factory import real_photos
from shardsmith.api import BuildResult, Counts, InspectResult, RepairResult, ScanResult, VerifyResult
from shardsmith.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    """The first ```python block of the README's "## Python API" section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the example's relative paths, out/ under tmp
    r = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^6 of 6 written; manifest: out/api/manifest.json$", r.stdout, re.M), r.stdout
    assert re.search(r"^6 samples; 6 usable$", r.stdout, re.M), r.stdout


def test_import_is_light_and_the_api_is_there():
    code = ("import sys, shardsmith; heavy = lambda: sorted(m for m in ('torch', 'numpy', 'PIL') if m in sys.modules); "
            "print(heavy()); shardsmith.inspect, shardsmith.repair, shardsmith.BuildResult; print(heavy())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["[]", "[]"], r.stdout + r.stderr


def test_the_modules_stay_modules():
    """`shardsmith.build` is callable and still the module `import shardsmith.build` gives."""
    import shardsmith.build as build_mod
    import shardsmith.scan as scan_mod
    import shardsmith.verify as verify_mod

    assert shardsmith.build is build_mod and callable(build_mod) and hasattr(build_mod, "make_plan")
    assert shardsmith.scan is scan_mod and callable(scan_mod)
    assert shardsmith.verify is verify_mod and callable(verify_mod)
    assert callable(shardsmith.inspect) and callable(shardsmith.repair)
    from shardsmith import build, inspect  # noqa: F401

    assert build is build_mod


@pytest.fixture
def photos(tmp_path) -> Path:
    real_photos(tmp_path / "photos", 5, seed=4, min_side=60, max_side=120)
    return tmp_path / "photos"


def test_every_function_returns_its_typed_result(photos, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": "photos"}], "split": {"holdout": 1},
                                      "outputs": [{"format": "wds", "samples_per_shard": 2}]}))
    built = shardsmith.build(recipe, tmp_path / "out", workers=1)  # a recipe path (relative to its folder)
    assert isinstance(built, BuildResult) and built.manifest_path == tmp_path / "out" / "manifest.json"
    assert built.counts == Counts(5, 5, {}, {}) and built.written == 5
    wds = built.outputs["wds"]
    assert wds.format == "wds" and wds.splits["train"].written == 4 and wds.splits["holdout"].written == 1
    assert built.manifest["recipe_fingerprint"]

    checked = shardsmith.verify(tmp_path / "out" / "wds", world=1, workers=1)
    assert isinstance(checked, VerifyResult) and checked.ok and not checked.failed
    assert {c.name for c in checked.checks} >= {"coverage", "shard_count"}

    seen = shardsmith.inspect(tmp_path / "out" / "wds")
    assert isinstance(seen, InspectResult) and seen.ok and (seen.shards, seen.samples) == (2, 4)

    fixed = shardsmith.repair(tmp_path / "out" / "wds", dry_run=True)
    assert isinstance(fixed, RepairResult) and fixed.ok and set(fixed.actions.values()) == {"unchanged"}

    scanned = shardsmith.scan(photos)  # a folder: its one source
    assert isinstance(scanned, ScanResult) and scanned.items == 5 and scanned.kinds["image"] == 5


def test_a_recipe_object_and_a_dict_are_recipes(photos, tmp_path):
    from shardsmith.recipe import recipe_from_dict

    data = {"sources": [{"path": str(photos)}], "outputs": [{"format": "wds"}]}
    assert shardsmith.build(recipe_from_dict(data), tmp_path / "a", workers=1).written == 5
    assert shardsmith.build({**data, "sources": [{"path": "photos"}]}, tmp_path / "b", workers=1,
                            base_dir=photos.parent).written == 5


def test_a_mistake_raises_a_user_error(photos, tmp_path):
    with pytest.raises(UserError, match="samples_per_shard"):
        shardsmith.build({"sources": [{"path": str(photos)}], "outputs": [{"format": "wds", "samples_per_shard": 0}]},
                         tmp_path / "o")
    with pytest.raises(UserError, match="takes a folder of .tar shards"):
        shardsmith.inspect(tmp_path / "missing")


@pytest.mark.slow  # two builds and a report page: about 2 s
def test_build_writes_the_report_when_asked_as_the_readme_says(photos, tmp_path):
    """README's Report section: 'the Python API writes it with build(recipe, out, report=True)' (was a TypeError)."""
    data = {"sources": [{"path": str(photos)}], "outputs": [{"format": "wds"}]}
    assert "build(recipe, out, report=True)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert shardsmith.build(data, tmp_path / "with", workers=1, report=True).written == 5
    assert (tmp_path / "with" / "report.html").is_file()
    assert shardsmith.build(data, tmp_path / "without", workers=1).written == 5
    assert not (tmp_path / "without" / "report.html").exists()  # off by default in the API
