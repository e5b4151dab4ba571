"""A table's class labels that EDM / FastGen would read as another class are refused before anything is built.

- A negative whole-number label (``-1`` in JSON, ``"-1"`` in a CSV cell) was written as class id -1 in the EDM
  ZIP's ``dataset.json`` and in ``.cls`` (build exit 0); a one-hot ``np.eye(K)[-1]`` trains it as the last class.
- A true/false label was merged with class 1 (``True == 1`` in the set of labels), the manifest naming no ``True``.

Both are now one message naming the table, the row and the fix, exit 2, and no output folder.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

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
