"""``report BUILD --output LINK``, where LINK is a symlink to another build's ``report.html``, wrote through
the link and overwrote that build's page (the checks looked at the file the link points to, which is "a
build's own report.html"). Now the link itself is replaced by the page, as ``verify --out-json`` does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import shardsmith
from tests.media_factory import real_photos
from tests.test_cli_mistakes import assert_message, invoke


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory) -> tuple[Path, Path]:
    """Two finished builds of 2 photos each, with their report.html."""
    from shardsmith.report_html import write_report

    base = tmp_path_factory.mktemp("replink")
    outs = []
    for name, seed in (("one", 1), ("two", 2)):
        real_photos(base / f"src_{name}", 2, seed=seed, min_side=40, max_side=64)
        shardsmith.build({"sources": [{"path": str(base / f"src_{name}")}],
                          "outputs": [{"format": "wds", "dir": "wds"}]}, base / name, quiet=True)
        write_report(base / name, previews=False)
        outs.append(base / name)
    return outs[0], outs[1]


@pytest.fixture
def builds(two_builds, tmp_path) -> tuple[Path, Path]:
    one, two = (tmp_path / "one", tmp_path / "two")
    shutil.copytree(two_builds[0], one, symlinks=True)
    shutil.copytree(two_builds[1], two, symlinks=True)
    return one, two


def test_output_link_to_another_builds_report_replaces_the_link(builds, tmp_path):
    one, two = builds
    theirs = (two / "report.html").read_bytes()
    link = tmp_path / "r2.html"
    link.symlink_to(two / "report.html")
    code, out = invoke("report", one, "--output", link, "--no-previews")
    assert code == 0, out
    assert (two / "report.html").read_bytes() == theirs  # the other build's page is untouched
    assert not link.is_symlink() and link.is_file()  # the link was replaced by this build's page
    page = link.read_text()
    assert page != theirs.decode() and "one" in page


def test_output_link_through_a_relative_path_and_the_api(builds, tmp_path, monkeypatch):
    from shardsmith.report_html import write_report

    one, two = builds
    theirs = (two / "report.html").read_bytes()
    monkeypatch.chdir(tmp_path)
    Path("rel.html").symlink_to(Path("two") / "report.html")
    dest = write_report(one, "rel.html", previews=False)
    assert dest == tmp_path.resolve() / "rel.html"
    assert (two / "report.html").read_bytes() == theirs
    assert not Path("rel.html").is_symlink()


def test_output_inside_another_build_through_a_linked_folder_is_still_refused(builds, tmp_path):
    one, two = builds
    (tmp_path / "elsewhere").symlink_to(two)  # a link to the other build's folder: its files are inside it
    before = sorted(p.name for p in two.iterdir())
    code, out = invoke("report", one, "--output", tmp_path / "elsewhere" / "page.html", "--no-previews")
    assert_message(code, out, "lies inside the shardsmith build", str(two.resolve()))
    assert sorted(p.name for p in two.iterdir()) == before


def test_output_link_to_a_users_file_is_refused_and_the_file_kept(builds, tmp_path):
    one, _ = builds
    mine = tmp_path / "notes.txt"
    mine.write_text("precious")
    link = tmp_path / "r3.html"
    link.symlink_to(mine)
    code, out = invoke("report", one, "--output", link, "--no-previews")
    assert_message(code, out, "is not a shardsmith report")
    assert mine.read_text() == "precious" and link.is_symlink()
