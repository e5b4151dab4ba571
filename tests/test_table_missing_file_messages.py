"""A table row whose media file is not there says why when the reason is not a typo.

- A URL cell (an img2dataset-style table) was told ``.../https:/example.com/a.jpg does not exist; fix the path``: the
  URL mangled into a local path. It now says it is a URL, that nothing is downloaded, and how to fetch the files.
- A cell naming ``café.jpg`` in NFC beside a file whose name is NFD (as macOS writes it) was told the file ``does not
  exist`` while ``ls`` shows it. It now names the file spelled in the other normalisation and the fix.
"""

from __future__ import annotations

import unicodedata

from shardsmith.recipe import recipe_from_dict
from shardsmith.sources import open_sources
from test_source_names_and_tables import _jpg, invoke


def _errors(table) -> list:
    [(_, items)] = open_sources(recipe_from_dict({"sources": [{"path": str(table)}], "outputs": [{"format": "wds"}]}))
    return [i.error for i in items()]


def test_a_url_cell_is_said_to_be_a_url_that_is_not_downloaded(tmp_path):
    t = tmp_path / "t2.csv"
    t.write_text("url,caption\nhttps://example.com/a.jpg,remote one\n")
    code, out = invoke("build", t, "--out", tmp_path / "o", "--media-column", "url")
    assert code == 3 and "Traceback" not in out, out
    assert ("row 0 of t2.csv names 'https://example.com/a.jpg', a URL: shardsmith reads local files and downloads "
            "nothing; fetch the files first (e.g. with img2dataset)") in out, out
    assert f"{tmp_path}/https:" not in out and "does not exist" not in out  # no mangled local path
    t = tmp_path / "t3.csv"
    t.write_text("file,caption\nhttps://example.com/a.jpg,remote one\ns3://bucket/b.png,other\n")
    [(r0, d0), (r1, d1)] = _errors(t)
    assert (r0, d0) == ("missing_file", "row 0 of t3.csv names 'https://example.com/a.jpg', a URL: shardsmith reads "
                        "local files and downloads nothing; fetch the files first (e.g. with img2dataset), then put "
                        "their local paths (relative to the table's folder) in this column, or delete the row")
    assert r1 == "missing_file" and d1.startswith("row 1 of t3.csv names 's3://bucket/b.png', a URL:")


def test_a_name_in_another_unicode_normalisation_is_named(tmp_path):
    nfd, nfc = unicodedata.normalize("NFD", "café.jpg"), unicodedata.normalize("NFC", "café.jpg")
    _jpg(tmp_path / nfd)
    _jpg(tmp_path / "sub" / "plain.jpg")
    (tmp_path / "t.csv").write_text(f"file,caption\n{nfc},nice\nsub/gone.jpg,typo\n{nfd},same bytes\n",
                                    encoding="utf-8")
    [(r0, d0), (r1, d1), none] = _errors(tmp_path / "t.csv")
    assert none is None  # the file's own spelling is read
    assert r0 == "missing_file" and d0 == (
        f"row 0 of t.csv names {nfc!r}, but {tmp_path / nfc} does not exist: {tmp_path} holds {nfd!r}, which looks "
        "the same but is spelled in another Unicode normalisation: 'cafe\\u0301.jpg' is NFD, the table's "
        "'caf\\xe9.jpg' NFC, different bytes to the file system; rename the file or rewrite the cell so both are "
        "spelled alike (unicodedata.normalize('NFC', name) makes them equal), or delete the row")
    assert (r1, d1) == ("missing_file", f"row 1 of t.csv names 'sub/gone.jpg', but {tmp_path / 'sub' / 'gone.jpg'} "
                                        "does not exist; fix the path (relative to the table's folder) or delete the row")
