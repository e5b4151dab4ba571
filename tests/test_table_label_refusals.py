"""A table's class labels that EDM / FastGen would read as another class are refused before anything is built.

- A negative whole-number label (``-1`` in JSON, ``"-1"`` in a CSV cell) was written as class id -1 in the EDM
  ZIP's ``dataset.json`` and in ``.cls`` (build exit 0); a one-hot ``np.eye(K)[-1]`` trains it as the last class.
- A true/false label was merged with class 1 (``True == 1`` in the set of labels), the manifest naming no ``True``.

Both are now one message naming the table, the row and the fix, exit 2, and no output folder.

- A whole number written as a float (``-1.0`` in a CSV cell or JSON, a Parquet float64 column, as pandas writes a
  column of ids with an empty cell) was taken as a name: ``-1.0`` built (exit 0) and every label was renumbered
  as a name (-1.0 -> 0, 0 -> 1, 1 -> 2), so every image trained under another class. Now it is that whole number:
  ``-1.0`` refused like ``-1``, ``2.0`` class 2.
- Whole numbers mixed with names (2, 10, "x") were all numbered as names (10 -> 0, 2 -> 1): now refused.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from test_source_names_and_tables import _jpg, invoke


def _table(tmp_path: Path, name: str, text: str) -> Path:
    for i, f in enumerate(("A.jpg", "b.jpg", "c.jpg", "d.jpg")):
        _jpg(tmp_path / "tab" / f, (40 * i, 90, 200 - 40 * i))
    p = tmp_path / "tab" / name
    p.write_text(text)
    return p


def test_negative_json_label_is_refused_naming_row_and_fix(tmp_path):
    t = _table(tmp_path, "neg.jsonl", '{"file":"A.jpg","label":-1}\n{"file":"b.jpg","label":7}\n'
                                      '{"file":"c.jpg","label":"-1"}\n{"file":"d.jpg","label":7}\n')
    code, out = invoke("build", t, "--to", "zip", "--resolution", 32, "--out", tmp_path / "o")
    assert code == 2, out
    assert "Traceback" not in out
    assert f"table {t}: row 0 of neg.jsonl has label -1 in column 'label' (row 2 too: negative or true/false)" in out
    assert "a negative class id" in out and "renumber the labels from 0" in out
    assert "leave the cell empty for an item with no label" in out
    assert not (tmp_path / "o").exists()


def test_negative_csv_label_is_refused(tmp_path):
    t = _table(tmp_path, "t.csv", "file,label\nA.jpg,0\nb.jpg,1\nc.jpg,-3\n")
    code, out = invoke("build", t, "--to", "wds", "--out", tmp_path / "o")
    assert code == 2, out
    assert f"table {t}: row 2 of t.csv has label '-3' in column 'label', a negative class id" in out
    assert not (tmp_path / "o").exists()


def test_boolean_label_is_refused_not_merged_with_class_1(tmp_path):
    t = _table(tmp_path, "b.jsonl", '{"file":"A.jpg","label":1}\n{"file":"b.jpg","label":0}\n'
                                    '{"file":"c.jpg","label":true}\n')
    code, out = invoke("build", t, "--to", "wds", "--out", tmp_path / "o")
    assert code == 2, out
    assert (f"table {t}: row 2 of b.jsonl has label true in column 'label', a true/false value, not a class" in out)
    assert "true would be taken as class 1" in out
    assert not (tmp_path / "o").exists()
    code, out = invoke("scan", t)  # scan reads the same source: the same refusal
    assert code == 2 and "row 2 of b.jsonl has label true" in out, out


def test_labels_from_zero_and_empty_cells_still_build(tmp_path):
    t = _table(tmp_path, "ok.jsonl", '{"file":"A.jpg","label":0}\n{"file":"b.jpg","label":"1"}\n'
                                     '{"file":"c.jpg","label":""}\n{"file":"d.jpg","label":1}\n')
    code, out = invoke("build", t, "--to", "zip", "--resolution", 32, "--out", tmp_path / "o")
    assert code == 0, out
    with zipfile.ZipFile(tmp_path / "o" / "dataset.zip") as z:
        labels = json.loads(z.read("dataset.json"))["labels"]
    assert [lab for _, lab in labels] == [0, 1, 1]  # c.jpg: skipped:no_label


def _parquet(tmp_path: Path, name: str, labels: list[float]) -> Path:
    """A Parquet table of A.jpg, b.jpg, ... with a float64 label column (NaN: an empty cell, as pandas writes it)."""
    p = _table(tmp_path, name, "")
    files = ["A.jpg", "b.jpg", "c.jpg", "d.jpg"][:len(labels)]
    pq.write_table(pa.table({"file": files, "label": pa.array(labels, pa.float64())}), p)
    return p


def _zip_labels(out: Path) -> list[int]:
    with zipfile.ZipFile(out / "dataset.zip") as z:
        return [lab for _, lab in json.loads(z.read("dataset.json"))["labels"]]


def test_negative_float_labels_are_refused_like_negative_ints(tmp_path):
    t_csv = _table(tmp_path, "neg.csv", "file,label\nA.jpg,-1.0\nb.jpg,0\nc.jpg,1\n")
    t_json = _table(tmp_path, "neg.jsonl", '{"file":"A.jpg","label":0.0}\n{"file":"b.jpg","label":-1.0}\n')
    t_pq = _parquet(tmp_path, "neg.parquet", [-1.0, 0.0, 1.0])
    for t, row, shown in ((t_csv, 0, "'-1.0'"), (t_json, 1, "-1.0"), (t_pq, 0, "-1.0")):
        out = tmp_path / f"o_{t.suffix[1:]}"
        code, text = invoke("build", t, "--to", "zip", "--resolution", 32, "--out", out)
        assert code == 2, text
        assert "Traceback" not in text
        assert (f"table {t}: row {row} of {t.name} has label {shown} in column 'label', a negative class id"
                in text), text
        assert "renumber the labels from 0" in text
        assert not out.exists()


def test_float_whole_labels_are_their_class_ids_not_names(tmp_path):
    # a pandas-style float column (an empty cell made it float: NaN) and CSV cells written as 2.0
    t_pq = _parquet(tmp_path, "ids.parquet", [2.0, 0.0, float("nan"), 1.0])
    code, text = invoke("build", t_pq, "--to", "zip", "--resolution", 32, "--out", tmp_path / "o1")
    assert code == 0, text
    assert _zip_labels(tmp_path / "o1") == [2, 0, 1]  # c.jpg: skipped:no_label
    t_csv = _table(tmp_path, "ids.csv", "file,label\nA.jpg,2.0\nb.jpg,0\nc.jpg,1.0\nd.jpg,1\n")
    code, text = invoke("build", t_csv, "--to", "wds", "--out", tmp_path / "o2")
    assert code == 0, text
    cls, meta = {}, {}
    for shard in sorted((tmp_path / "o2").rglob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, suffix = m.name.split(".", 1)
                if suffix == "cls":
                    cls[key] = tar.extractfile(m).read()
                elif suffix == "json":
                    meta[key] = json.loads(tar.extractfile(m).read())
    by_file = {meta[k]["path"]: (cls[k], meta[k]["label_name"]) for k in meta}
    assert by_file == {"A.jpg": (b"2", "2"), "b.jpg": (b"0", "0"), "c.jpg": (b"1", "1"), "d.jpg": (b"1", "1")}


def test_whole_numbers_mixed_with_names_are_refused(tmp_path):
    """Before: 2, 10 and "x" were all names in text order (10 -> 0, 2 -> 1, x -> 2), exit 0."""
    t = _table(tmp_path, "mix.jsonl", '{"file":"A.jpg","label":2}\n{"file":"b.jpg","label":10}\n'
                                      '{"file":"c.jpg","label":"x"}\n')
    code, text = invoke("build", t, "--to", "zip", "--resolution", 32, "--out", tmp_path / "o")
    assert code == 2, text
    assert "Traceback" not in text
    assert (f"table {t}: column 'label' mixes class ids and names: row 0 of mix.jsonl has the whole number 2 and "
            "row 2 the name 'x'") in text, text
    assert "write every label as a class id (whole numbers from 0) or every one as a name" in text
    assert not (tmp_path / "o").exists()
    names = _table(tmp_path, "names.csv", "file,label\nA.jpg,cat\nb.jpg,dog\nc.jpg,cat\n")
    code, text = invoke("build", names, "--to", "zip", "--resolution", 32, "--out", tmp_path / "o3")
    assert code == 0, text
    assert _zip_labels(tmp_path / "o3") == [0, 1, 0]
