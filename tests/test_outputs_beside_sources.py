"""decode's --out and report's --output never lie inside (or around) a source the build read:
decoded pictures or a page there would be read (and trained on) by the next build. Refused with
exit 2, naming the path, the source and the fix, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardsmith import cli


def invoke(*args) -> tuple[int, str]:
    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    return r.exit_code, r.output


def listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.fixture
def photos(tmp_path) -> Path:
    d = tmp_path / "photos"
    (d / "sub").mkdir(parents=True)
    (d / "a.jpg").write_bytes(b"jpg")
    (d / "sub" / "b.jpg").write_bytes(b"jpg")
    return d


@pytest.fixture
def build_dir(tmp_path, photos) -> Path:
    """A finished build's folder whose manifest records a latent output and the recipe's source."""
    root = tmp_path / "out" / "lat"
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({
        "counts": {}, "models": {"vae": {"provenance": {"weights": "random-weights"}}},
        "outputs": {"lat": {"format": "latent_wds", "files": {"train": {"dir": "lat", "shards": []}}}},
        "recipe": {"sources": [{"path": str(photos), "name": "photos"}],
                   "outputs": [{"format": "latent_wds", "dir": "lat"}]}}))
    return root


def assert_refused(code: int, output: str, flag: str, path: Path, photos: Path, before: list[str]) -> None:
    assert code == 2, output
    text = " ".join(output.split())  # the message may be wrapped
    assert "Traceback" not in text, output
    for want in (f"{flag} {path.resolve()}", "'photos'", str(photos.resolve()), f"outside every source folder"):
        assert want in text, f"{want!r} not in:\n{output}"
    assert listing(photos) == before  # nothing written: no decoded files, no lock, no page


@pytest.mark.parametrize("where", ["dec", "sub/dec", "sub", "."])
def test_decode_out_inside_a_source_is_refused(build_dir, photos, where):
    before = listing(photos)
    out = photos / where
    assert_refused(*invoke("decode", build_dir, "--out", out), "--out", out, photos, before)


def test_decode_out_around_a_source_is_refused(build_dir, photos, tmp_path):
    before = listing(photos)
    code, output = invoke("decode", build_dir, "--out", tmp_path)
    assert code == 2 and "contains source 'photos'" in " ".join(output.split()), output
    assert listing(photos) == before and not (tmp_path / ".shardsmith").exists()


def test_decode_out_beside_the_sources_is_not_refused_for_them(build_dir, photos, tmp_path):
    code, output = invoke("decode", build_dir, "--out", tmp_path / "dec")
    assert "outside every source folder" not in " ".join(output.split()), output  # it fails later, on the fake build


@pytest.mark.parametrize("where", ["r.html", "sub/r.html"])
def test_report_output_inside_a_source_is_refused(build_dir, photos, where):
    before = listing(photos)
    dest = photos / where
    assert_refused(*invoke("report", build_dir, "--output", dest), "--output", dest, photos, before)


def test_a_real_build_refuses_a_report_into_its_source(tmp_path):
    from media_factory import real_photos
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    src = tmp_path / "p"
    real_photos(src, 2, seed=1, min_side=40, max_side=60)
    out = tmp_path / "qs"
    build(recipe_from_dict({"sources": [{"path": str(src), "name": "pics"}],
                            "outputs": [{"format": "wds", "dir": "wds"}]}), out, quiet=True, workers=1)
    before = listing(src)
    code, output = invoke("report", out, "--output", src / "r.html")
    assert code == 2 and "'pics'" in output and "outside every source folder" in " ".join(output.split()), output
    assert listing(src) == before
    code, output = invoke("report", out, "--output", tmp_path / "r.html")
    assert code == 0 and (tmp_path / "r.html").is_file(), output
