"""Names that are not UTF-8 and malformed caption tables never end in a traceback.

- A media file whose name (or a folder's on its path) is not UTF-8 (a Latin-1 ``caf\\xe9.jpg``) was a
  ``UnicodeEncodeError`` in the split's hash. It is now the item ``failed:name_not_utf8``, its id spelled with
  ``\\xNN`` (stable, valid UTF-8), counted in the manifest and named by scan, while the rest is built; every
  output (tar names, ZIP, manifest, ledger) stays valid UTF-8. A source path that is not UTF-8 is refused (exit 2).
- A CSV with a quote that is never closed swallowed the rows after it (or, past 128 KiB, was ``_csv.Error``). A
  table that does not parse is now one message naming the file, the line and the fix (exit 2) before anything
  is written; a long or multi-line quoted caption is read as it is.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from shardsmith import cli
from shardsmith.recipe import recipe_from_dict
from shardsmith.sources import open_sources
from shardsmith.sources.base import SourceError
from shardsmith.split import assign

LATIN1 = os.fsdecode(b"caf\xe9.jpg")  # the name ``os.listdir`` gives for the Latin-1 bytes caf\xe9.jpg
FOLDER = os.fsdecode(b"d\xe9j\xe0")  # a folder named in Latin-1


def invoke(*args) -> tuple[int, str]:
    """``shardsmith ARGS`` in this process: (exit code, everything printed)."""
    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    return r.exit_code, r.output


def _jpg(path: Path, color=(200, 30, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (48, 40), color).save(path)


def _valid_text(v) -> None:
    """Every string of a parsed JSON value is valid Unicode (a lone surrogate escape is not, for other readers)."""
    if isinstance(v, str):
        v.encode("utf-8")
    elif isinstance(v, dict):
        for k, x in v.items():
            _valid_text(k)
            _valid_text(x)
    elif isinstance(v, list):
        for x in v:
            _valid_text(x)


def _manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    _valid_text(m)
    return m


def _members(out: Path) -> list[str]:
    names = []
    for shard in sorted(out.rglob("*.tar")):
        with tarfile.open(shard) as t:
            names += t.getnames()
    return names


@pytest.fixture
def latin1_folder(tmp_path) -> Path:
    """ok.jpg, a Latin-1 caf\\xe9.jpg, a Latin-1 folder with one photo, a Latin-1 non-media file."""
    src = tmp_path / "src"
    _jpg(src / "ok.jpg")
    _jpg(src / LATIN1, (10, 200, 10))
    _jpg(src / FOLDER / "inner.jpg", (10, 10, 200))
    (src / os.fsdecode(b"n\xf6te.dat")).write_bytes(b"not media")
    return src


# ---- names that are not UTF-8 -------------------------------------------------------------------------------


def test_a_latin1_file_name_fails_that_item_and_the_build_goes_on(latin1_folder, tmp_path):
    out = tmp_path / "out"
    code, output = invoke("build", "--source", latin1_folder, "--to", "wds", "--out", out, "-q")
    assert code == 0, output
    assert "Traceback" not in output
    m = _manifest(out)
    assert m["counts"]["inputs"] == 3 and m["counts"]["written"] == 1
    assert m["counts"]["failed"] == {"name_not_utf8": 2}
    example = m["counts"]["examples"]["failed:name_not_utf8"]
    assert example["ids"] == ["src/caf\\xe9.jpg", "src/d\\xe9j\\xe0/inner.jpg"]
    assert "the file name 'caf\\xe9.jpg' is not valid UTF-8" in example["detail"]
    assert "rename it to UTF-8" in example["detail"]
    assert m["sources"][0]["ignored"]["examples"] == ["n\\xf6te.dat"]  # passed over, spelled as valid text
    assert _members(out) == ["ok.jpg", "ok.json"]
    for name in _members(out):
        name.encode("utf-8")


def test_a_latin1_class_folder_is_no_class_of_a_zip(latin1_folder, tmp_path):
    (latin1_folder / "cats").mkdir()
    os.replace(latin1_folder / "ok.jpg", latin1_folder / "cats" / "ok.jpg")
    out = tmp_path / "out"
    code, output = invoke("build", "--source", latin1_folder, "--to", "zip", "--resolution", "32", "--out", out, "-q")
    assert code == 0, output
    m = _manifest(out)
    assert m["sources"][0]["labels"] == ["cats"]  # the Latin-1 folder holds nothing usable: not a class
    assert m["counts"]["written"] == 1 and m["counts"]["failed"] == {"name_not_utf8": 2}
    import zipfile

    with zipfile.ZipFile(out / "dataset.zip") as z:
        assert json.loads(z.read("dataset.json"))["labels"] == [["00000/img00000000.png", 0]]


def test_scan_names_a_latin1_file_and_says_why(latin1_folder):
    code, output = invoke("scan", latin1_folder)
    assert code == 0, output
    assert "Traceback" not in output
    assert "failed:name_not_utf8" in output
    assert "src/caf\\xe9.jpg" in output and "rename it to UTF-8" in output


def test_latin1_ids_are_stable_and_valid_text(latin1_folder):
    def ids():
        [(_, items)] = open_sources(recipe_from_dict({"sources": [{"path": str(latin1_folder)}],
                                                     "outputs": [{"format": "wds"}]}))
        return [(i.item_id, i.path, i.error and i.error[0]) for i in items()]

    first = ids()
    assert first == ids()
    assert [(i, e) for i, _, e in first] == [("src/caf\\xe9.jpg", "name_not_utf8"),
                                            ("src/d\\xe9j\\xe0/inner.jpg", "name_not_utf8"), ("src/ok.jpg", None)]
    for item_id, path, _ in first:
        (item_id + path).encode("utf-8")


def test_the_split_hash_takes_any_id_and_keeps_valid_ones():
    import hashlib

    old = int.from_bytes(hashlib.sha256("7\x00src/ok.jpg".encode()).digest()[:8], "big") / 2**64
    assert assign.split_u("src/ok.jpg", 7) == old  # the same split for every existing id
    assert assign.split_u("src/caf\udce9.jpg", 7) == assign.split_u("src/caf\udce9.jpg", 7)


def test_a_source_folder_whose_path_is_not_utf8_is_refused(tmp_path):
    src = tmp_path / FOLDER
    _jpg(src / "ok.jpg")
    out = tmp_path / "out"
    code, output = invoke("build", "--source", src, "--to", "wds", "--out", out, "-q")
    assert code == 2, output
    assert "Traceback" not in output
    assert "d\\xe9j\\xe0 is not valid UTF-8" in output and "rename the folder to a UTF-8 name" in output
    assert not out.exists()


def test_a_table_row_linking_to_a_latin1_name_fails_that_row(tmp_path):
    _jpg(tmp_path / "ok.jpg")
    _jpg(tmp_path / LATIN1)
    os.symlink(LATIN1, tmp_path / "link.jpg")
    (tmp_path / "t.csv").write_text("file,caption\nok.jpg,fine\nlink.jpg,a cup\n")
    [(_, items)] = open_sources(recipe_from_dict({"sources": [{"path": str(tmp_path / "t.csv")}],
                                                 "outputs": [{"format": "wds"}]}))
    got = list(items())
    assert [i.error for i in got][0] is None
    reason, detail = got[1].error
    assert reason == "name_not_utf8" and "link.jpg" in detail and "caf\\xe9.jpg" in detail
    (got[1].path + detail).encode("utf-8")


def test_a_prompt_shard_key_that_is_not_utf8_fails_that_sample(tmp_path):
    src = tmp_path / "prompts"
    src.mkdir()
    with tarfile.open(src / "00000.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for name, data in (("good.txt", b"a cat"), (os.fsdecode(b"caf\xe9.txt"), b"a cup")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    [(_, items)] = open_sources(recipe_from_dict({"sources": [{"path": str(src), "kind": "wds"}],
                                                 "outputs": [{"format": "wds"}]}))
    got = {i.item_id: i.error for i in items()}
    assert got["prompts/00000.tar/good"] is None
    assert got["prompts/00000.tar/caf\\xe9"][0] == "name_not_utf8"


def test_a_jsonl_caption_with_an_unpaired_surrogate_escape_is_a_bad_row(tmp_path):
    _jpg(tmp_path / "a.jpg")
    _jpg(tmp_path / "b.jpg", (0, 90, 0))
    (tmp_path / "t.jsonl").write_text('{"file": "a.jpg", "caption": "caf\\udce9"}\n'
                                      '{"file": "b.jpg", "caption": "fine \\ud83d\\ude00"}\n')
    out = tmp_path / "out"
    code, output = invoke("build", "--source", tmp_path / "t.jsonl", "--to", "wds", "--out", out, "-q")
    assert code == 0, output
    m = _manifest(out)
    assert m["counts"]["inputs"] == 2 and m["counts"]["written"] == 1 and m["counts"]["failed"] == {"bad_row": 1}
    detail = m["counts"]["examples"]["failed:bad_row"]["detail"]
    assert "line 1" in detail and "'caption'" in detail and "unpaired surrogate" in detail


# ---- malformed CSV tables -----------------------------------------------------------------------------------


@pytest.fixture
def photos(tmp_path) -> Path:
    for name, color in (("astronaut.jpg", (200, 0, 0)), ("coffee.jpg", (0, 200, 0)), ("rocket.jpg", (0, 0, 200))):
        _jpg(tmp_path / name, color)
    return tmp_path


def _refused(code: int, output: str, *texts: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    for t in texts:
        assert t in output, f"{t!r} not in:\n{output}"


def test_an_unclosed_quote_in_a_large_csv_is_one_message_as_a_user_runs_it(photos):
    """The tester's case: past 128 KiB this was ``_csv.Error: field larger than field limit`` (exit 1)."""
    table = photos / "big.csv"
    table.write_text('file,caption\n"astronaut.jpg,x\n' + "coffee.jpg,a cup\n" * 9000)
    out = photos / "out"
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(table), "--out", str(out), "-q"],
                       capture_output=True, text=True)
    _refused(r.returncode, r.stdout + r.stderr, str(table), "line 2", "never closed", "close the quote")
    assert not out.exists()


def test_an_unclosed_quote_in_a_small_csv_no_longer_swallows_the_rows_after_it(photos):
    table = photos / "small.csv"
    table.write_text('file,caption\n"astronaut.jpg,x\ncoffee.jpg,a cup\ncoffee.jpg,b\nrocket.jpg,c\n')
    out = photos / "out"
    code, output = invoke("build", "--source", table, "--to", "wds", "--out", out, "-q")
    _refused(code, output, "small.csv", "starts on line 2", "lines 2-5", "never closed")
    assert not out.exists()
    code, output = invoke("scan", table)
    _refused(code, output, "small.csv", "line 2")


def test_a_quote_closed_rows_later_with_more_cells_than_the_header_is_refused(photos):
    table = photos / "mid.csv"
    table.write_text('file,caption\nastronaut.jpg,"he said\ncoffee.jpg,a cup\n"coffee.jpg,b\nrocket.jpg,c\n')
    code, output = invoke("build", "--source", table, "--to", "wds", "--out", photos / "out", "-q")
    _refused(code, output, "mid.csv", "lines 2-4", "3 cells, the header 2", "remove the stray quote")


def test_a_media_path_over_several_lines_is_refused_not_merged(photos):
    table = photos / "paths.csv"
    table.write_text('file,caption\nrocket.jpg,ok\n"astronaut.jpg\ncoffee.jpg",x\n')
    code, output = invoke("build", "--source", table, "--to", "wds", "--out", photos / "out", "-q")
    _refused(code, output, "paths.csv", "'file' cell (a media path)", "starts on line 3", "lines 3-4")


def test_a_quote_in_the_header_is_refused(photos):
    table = photos / "head.csv"
    table.write_text('"file,caption\nastronaut.jpg,x\ncoffee.jpg",y\n')
    with pytest.raises(SourceError, match=r"the header runs over lines 1-3"):
        open_sources(recipe_from_dict({"sources": [{"path": str(table)}], "outputs": [{"format": "wds"}]}))


def test_a_cell_past_the_field_limit_names_the_line(photos):
    table = photos / "huge.csv"
    row = "coffee.jpg,a cup of coffee on a wooden table\n"
    table.write_text('file,caption\n"astronaut.jpg,x\n' + row * ((17 << 20) // len(row)))  # 17 MiB
    with pytest.raises(SourceError, match=r"huge.csv: the row that starts on line 2 has a cell over 16 MiB"):
        open_sources(recipe_from_dict({"sources": [{"path": str(table)}], "outputs": [{"format": "wds"}]}))


def test_a_long_quoted_caption_and_a_multi_line_one_are_read_whole(photos):
    long = "a very long caption " * 15000 + "end"  # 300 KB: over Python's default 128 KiB field limit
    table = photos / "long.csv"
    table.write_text(f'file,caption\nastronaut.jpg,"{long}"\ncoffee.jpg,"two lines,\nof caption"\n')
    out = photos / "out"
    code, output = invoke("build", "--source", table, "--to", "wds", "--out", out, "-q")
    assert code == 0, output
    m = _manifest(out)
    assert m["counts"]["inputs"] == 2 and m["counts"]["written"] == 2
    [shard] = sorted(out.rglob("*.tar"))
    with tarfile.open(shard) as t:
        captions = {n: t.extractfile(n).read().decode() for n in t.getnames() if n.endswith(".txt")}
    assert captions == {"astronaut.txt": long, "coffee.txt": "two lines,\nof caption"}
