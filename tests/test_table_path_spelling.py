"""A table's media path names its file once, however it is spelled.

``a//b.jpg``, ``./a/b.jpg``, ``a/../a/b.jpg`` and the absolute path of the table's ``a/b.jpg`` name one
file. They were as many items: ids and keys spelled as written (``a_a_b``, ``tmp_..._a_b`` with the host's
folders in it), each spelling a sample of its own under ``split.dedup: false``, and a ``.precomputed/``
tree refused an absolute or ``..`` path with a traceback. Now every spelling is the one name a folder
source gives the file (:func:`~shardsmith.sources.paths.table_name`), for partners (edit sources,
references, masks, audio) too, and a row that names a file again in another spelling is treated exactly as
a repeated row: the item ``<source>/<name>#row<n>``, ``skipped:duplicate`` (or, with dedup off, written
under its own key). A path that leaves the table's folder (``../outside.jpg``, ``a/../../outside.jpg``, an
absolute one) is still refused unread; a ``..`` after a symbolic link keeps the file the path reads.
A build planned before this change resumes with the keys it planned (the plan stands), and says that
the sources now list other ids.
"""

from __future__ import annotations

import json
import sqlite3
import tarfile
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from media_factory import real_photos, write_table
from shardsmith import cli
from shardsmith.sources import paths

TABLE_DIRS = ("/w/tbl", "/link/tbl")  # the table's folder resolved, then as written (through a link)


def invoke(*args) -> tuple[int, str]:
    """``shardsmith ARGS`` in this process: (exit code, everything printed, stderr included)."""
    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    return r.exit_code, r.output


def _build(tmp_path: Path, out: Path, sources: list[dict], dedup: bool = True, outputs: list[dict] | None = None,
           name: str = "recipe", extra: dict | None = None) -> tuple[int, str]:
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump({"sources": sources, "split": {"dedup": dedup},
                                      "outputs": outputs or [{"format": "wds", "samples_per_shard": 2}],
                                      **(extra or {})}))
    return invoke("build", recipe, "--out", out, "--workers", "1", "-q")


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _samples(out: Path) -> dict[str, dict]:
    """key -> the sample's json (plus its caption under ``"txt"`` and its member suffixes under ``"members"``)
    over every shard of ``out/wds``; a key written twice fails."""
    got: dict[str, dict] = {}
    members: dict[str, set[str]] = {}
    texts: dict[str, str] = {}
    for shard in sorted((out / "wds").glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                key, _, suffix = m.name.partition(".")
                members.setdefault(key, set()).add(suffix)
                if suffix == "json":
                    assert key not in got, f"{key} written twice"
                    got[key] = json.loads(tf.extractfile(m).read())
                elif suffix == "txt":
                    texts[key] = tf.extractfile(m).read().decode()
    for key, j in got.items():
        j["members"], j["txt"] = members[key], texts.get(key)
    return got


def _plan(out: Path) -> list[tuple[str, str, str, str | None]]:
    """(item_id, key, plan_status, sha256) of every planned item, in plan order."""
    db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
    try:
        return list(db.execute("SELECT item_id, key, plan_status, sha256 FROM items ORDER BY idx"))
    finally:
        db.close()


# --------------------------------------------------------------------------- the pure rule


def test_one_spelling_by_components_alone():
    for raw in ("clips/a.jpg", "clips//a.jpg", "./clips/a.jpg", "clips/./a.jpg", "clips/a.jpg/", ".//clips///a.jpg",
                "clips/../clips/a.jpg", "x/y/../../clips/a.jpg", "../tbl/clips/a.jpg", "/w/tbl/clips/a.jpg",
                "/w/tbl//clips/./a.jpg", "/link/tbl/clips/a.jpg", "/w/other/../tbl/clips/a.jpg"):
        assert paths.table_name(raw, TABLE_DIRS) == "clips/a.jpg", raw
    # leaving the table's folder: kept so (the path rules refuse it), only cleaned
    assert paths.table_name("../outside.jpg", TABLE_DIRS) == "../outside.jpg"
    assert paths.table_name("clips/../../outside.jpg", TABLE_DIRS) == "../outside.jpg"
    assert paths.table_name("..//..//x.jpg", TABLE_DIRS) == "../../x.jpg"
    assert paths.table_name("//etc//passwd", TABLE_DIRS) == "/etc/passwd"
    assert paths.table_name("/w/tblx/a.jpg", TABLE_DIRS) == "/w/tblx/a.jpg"  # by component: not inside /w/tbl
    assert paths.table_name("/w/tbl/../a.jpg", TABLE_DIRS) == "/w/a.jpg"
    assert paths.table_name("/w/tbl", TABLE_DIRS) == paths.table_name("./", TABLE_DIRS) == "."  # the folder itself
    # without parents, ``..`` stays (a link may come before it); slashes and dots still go
    assert paths.table_name("lnk/..//./a.jpg", TABLE_DIRS, parents=False) == "lnk/../a.jpg"
    assert paths.clean("lnk/..//./a.jpg", parents=False) == "lnk/../a.jpg"
    assert paths.clean("/..") == "/" and paths.clean("a/..") == "." and paths.clean("../a/../..") == "../.."
    assert paths.table_name("a//b.jpg", ()) == "a/b.jpg"


# --------------------------------------------------------------------------- through a real build


@pytest.fixture
def photos(tmp_path) -> Path:
    """A table folder ``tbl`` with ``clips/photo_00000.jpg`` and ``clips/photo_00001.jpg`` (distinct photos)."""
    tdir = tmp_path / "tbl"
    real_photos(tdir / "clips", 2, seed=61, min_side=40, max_side=72)
    return tdir


def _respelled(tdir: Path) -> list[dict]:
    """Five rows naming clips/photo_00000.jpg, each spelled another way (the odd one first: it names the
    item), then one row for clips/photo_00001.jpg."""
    return [{"file": "clips/../clips/photo_00000.jpg", "caption": "first"},
            {"file": "clips//photo_00000.jpg", "caption": "double slash"},
            {"file": "./clips/photo_00000.jpg", "caption": "dot"},
            {"file": str(tdir / "clips" / "photo_00000.jpg"), "caption": "absolute"},
            {"file": "clips/photo_00000.jpg", "caption": "plain"},
            {"file": "./clips/./photo_00001.jpg", "caption": "other"}]


def _exact(tdir: Path) -> list[dict]:
    """The same rows, every path spelled plainly: a table that repeats one row's file four times."""
    return [{**r, "file": "clips/photo_00001.jpg" if r["caption"] == "other" else "clips/photo_00000.jpg"}
            for r in _respelled(tdir)]


@pytest.mark.parametrize("dedup", [True, False])
def test_spellings_of_one_file_are_one_item_keyed_as_a_folder_source_keys_it(photos, tmp_path, dedup):
    respelled = write_table(photos, _respelled(photos), "csv")
    exact = write_table(photos, _exact(photos), "jsonl")
    assert [r["file"] for r in _exact(photos)] == ["clips/photo_00000.jpg"] * 5 + ["clips/photo_00001.jpg"]
    code, output = _build(tmp_path, tmp_path / "o", [{"path": str(respelled)}], dedup=dedup)
    assert code == 0, output
    code, output = _build(tmp_path, tmp_path / "exact", [{"path": str(exact)}], dedup=dedup, name="exact")
    assert code == 0, output

    m = _manifest(tmp_path / "o")
    got = _samples(tmp_path / "o")
    if dedup:  # the file once, its first row's caption; the other four spellings are duplicates of it
        assert m["counts"]["written"] == 2 and m["counts"]["skipped"] == {"duplicate": 4}
        assert m["counts"]["failed"] == {} and m["counts"]["inputs"] == 6
        assert set(got) == {"clips_photo_00000", "clips_photo_00001"}
        assert m["counts"]["examples"]["skipped:duplicate"]["ids"] == [
            f"metadata/clips/photo_00000.jpg#row{n}" for n in range(1, 5)]
    else:  # dedup off keeps every row (one file, several captions), each under its own key, as repeated rows are
        assert m["counts"]["written"] == 6 and m["counts"]["skipped"] == {} and m["counts"]["failed"] == {}
        assert len(got) == 6 and {"clips_photo_00000", "clips_photo_00001"} <= set(got)
        assert sorted(j["txt"] for j in got.values()) == sorted(r["caption"] for r in _respelled(photos))
    first = got["clips_photo_00000"]
    assert first["txt"] == "first" and first["id"] == "metadata/clips/photo_00000.jpg"
    assert got["clips_photo_00001"]["txt"] == "other"
    assert {j["path"] for j in got.values()} == {"clips/photo_00000.jpg", "clips/photo_00001.jpg"}

    # exactly what a table that repeats the plain path makes: the same ids, keys, statuses and samples
    assert _plan(tmp_path / "o") == _plan(tmp_path / "exact")
    assert _samples(tmp_path / "exact") == got
    assert _manifest(tmp_path / "exact")["counts"] == m["counts"]

    # and the keys a folder source at the table's folder gives the two photos
    if dedup:
        code, output = _build(tmp_path, tmp_path / "folder", [{"path": str(photos), "labels": "none"}], name="folder")
        assert code == 0, output
        assert {k for k, j in _samples(tmp_path / "folder").items() if j["path"].startswith("clips/")} == set(got)


def _pair_photos(tdir: Path) -> None:
    for i in range(3):
        for sub, colour in (("tgt", (200, 40 * i, 30)), ("src", (20, 40 * i, 160))):
            (tdir / sub).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (64, 48), colour).save(tdir / sub / f"x{i}.jpg", quality=92)


def test_partner_paths_are_named_once_and_an_outside_partner_is_refused(tmp_path):
    """Edit pairs (a ``source`` partner): the target's and the partner's spellings both become their one
    name; the same target again under its absolute path is a duplicate; a partner that leaves the folder is
    refused unread."""
    tdir = tmp_path / "tbl"
    _pair_photos(tdir)
    (tmp_path / "outside.jpg").write_bytes((tdir / "src" / "x2.jpg").read_bytes())
    rows = [{"target": "./tgt//x0.jpg", "before": "src/./x0.jpg", "caption": "zero"},
            {"target": str(tdir / "tgt" / "x0.jpg"), "before": "src/x0.jpg", "caption": "zero again"},
            {"target": "tgt/x1.jpg", "before": "../tbl/src//x1.jpg", "caption": "one"},
            {"target": "tgt/../tgt/x2.jpg", "before": "src/../../outside.jpg", "caption": "two"}]
    table = write_table(tdir, rows, "csv")
    src = {"path": str(table), "columns": {"media": "target", "source": "before", "caption": "caption"}}
    code, output = _build(tmp_path, tmp_path / "o", [src])
    assert code == 0, output
    m = _manifest(tmp_path / "o")
    assert m["counts"]["inputs"] == 4 and m["counts"]["written"] == 2
    assert m["counts"]["skipped"] == {"duplicate": 1}
    assert m["counts"]["failed"] == {"source_path_outside_table_dir": 1}
    got = _samples(tmp_path / "o")
    assert set(got) == {"tgt_x0", "tgt_x1"}
    assert {k: (j["path"], j["partners"]["source"]["path"], j["txt"]) for k, j in got.items()} == {
        "tgt_x0": ("tgt/x0.jpg", "src/x0.jpg", "zero"), "tgt_x1": ("tgt/x1.jpg", "src/x1.jpg", "one")}
    assert all("src.jpg" in j["members"] for j in got.values())
    plan = {i: (k, s) for i, k, s, _ in _plan(tmp_path / "o")}
    assert plan == {"metadata/tgt/x0.jpg": ("tgt_x0", "ok"),
                    "metadata/tgt/x0.jpg#row1": (plan["metadata/tgt/x0.jpg#row1"][0], "skipped:duplicate"),
                    "metadata/tgt/x1.jpg": ("tgt_x1", "ok"),
                    "metadata/tgt/x2.jpg": ("tgt_x2", "failed:source_path_outside_table_dir")}


def test_paths_leaving_the_table_folder_are_still_refused_unread(photos, tmp_path):
    outside = tmp_path / "outside.jpg"
    outside.write_bytes((photos / "clips" / "photo_00001.jpg").read_bytes())
    rows = [{"file": "clips/photo_00000.jpg", "caption": "in"},
            {"file": "../outside.jpg", "caption": "dot-dot"},
            {"file": "clips/../../outside.jpg", "caption": "in, then out"},
            {"file": str(outside), "caption": "absolute"},
            {"file": "clips/../../tbl/clips/photo_00000.jpg", "caption": "out, then back in"}]
    table = write_table(photos, rows, "csv")
    code, output = _build(tmp_path, tmp_path / "o", [{"path": str(table)}])
    assert code == 0, output
    m = _manifest(tmp_path / "o")
    assert m["counts"]["written"] == 1 and m["counts"]["skipped"] == {"duplicate": 1}
    assert m["counts"]["failed"] == {"path_outside_table_dir": 3}
    assert set(_samples(tmp_path / "o")) == {"clips_photo_00000"}
    plan = _plan(tmp_path / "o")
    refused = [(i, sha) for i, _, s, sha in plan if s == "failed:path_outside_table_dir"]
    assert refused == [("metadata/../outside.jpg", None), ("metadata/../outside.jpg#row2", None),
                       (f"metadata/{outside}", None)]  # never opened, so never hashed
    assert plan[-1][:3] == ("metadata/clips/photo_00000.jpg#row4", plan[-1][1], "skipped:duplicate")

    # allowed: read, and the two spellings of ../outside.jpg are one name; its absolute path stays absolute
    allowed = {"path": str(table), "allow_outside_paths": True}
    code, output = _build(tmp_path, tmp_path / "a", [allowed], dedup=False, name="allowed")
    assert code == 0, output
    got = _samples(tmp_path / "a")
    assert _manifest(tmp_path / "a")["counts"]["written"] == 5 and len(got) == 5
    assert sorted(j["path"] for j in got.values()) == sorted(
        ["clips/photo_00000.jpg", "clips/photo_00000.jpg", "../outside.jpg", "../outside.jpg", str(outside)])
    assert [i for i, *_ in _plan(tmp_path / "a")][1:3] == ["metadata/../outside.jpg", "metadata/../outside.jpg#row2"]


def test_a_dotdot_after_a_link_keeps_the_file_the_path_reads(photos, tmp_path):
    """``lnk/../photo_00001.jpg`` with ``lnk`` a link to ``clips/sub`` reads ``clips/photo_00001.jpg``; cut by
    its components it would name ``photo_00001.jpg`` beside the table, another file: it keeps its ``..``."""
    (photos / "clips" / "sub").mkdir()
    (photos / "lnk").symlink_to(photos / "clips" / "sub")
    real_photos(tmp_path / "decoy", 1, seed=62, min_side=40, max_side=72)[0].rename(photos / "photo_00001.jpg")
    rows = [{"file": "lnk//../photo_00001.jpg", "caption": "through the link"},
            {"file": "photo_00001.jpg", "caption": "the decoy"},
            {"file": "clips/photo_00001.jpg", "caption": "what the link path reads"}]
    table = write_table(photos, rows, "csv")
    code, output = _build(tmp_path, tmp_path / "o", [{"path": str(table)}])
    assert code == 0, output
    m = _manifest(tmp_path / "o")
    assert m["counts"]["written"] == 2 and m["counts"]["skipped"] == {"duplicate": 1}
    got = _samples(tmp_path / "o")
    assert {k: (j["path"], j["txt"]) for k, j in got.items()} == {
        "lnk_photo_00001": ("lnk/../photo_00001.jpg", "through the link"),
        "photo_00001": ("photo_00001.jpg", "the decoy")}
    plan = _plan(tmp_path / "o")
    assert plan[2][2] == "skipped:duplicate" and plan[2][3] == plan[0][3] != plan[1][3]


def test_a_build_planned_with_the_old_names_resumes_with_its_keys(photos, tmp_path, monkeypatch, disk_full_at):
    """A build planned before paths were named once (each spelled as written), stopped after its first
    unit: the resume writes the rest under the keys it planned (the plan stands: no sample under two keys,
    no key changed), and does not call the same files, listed under the ids of now, changed sources."""
    table = write_table(photos, [{"file": "clips/../clips/photo_00000.jpg", "caption": "a"},
                                 {"file": "clips/photo_00001.jpg", "caption": "b"},
                                 {"file": "./clips//photo_00001.jpg", "caption": "c"}], "csv")
    name_once = getattr(paths, "table_name", None)
    # every spelling as written (raising=False: the same test runs on the code from before the change)
    monkeypatch.setattr(paths, "table_name", lambda raw, dirs, parents=True: raw, raising=False)
    disk_full_at(1)
    out = tmp_path / "o"
    spec = ([{"path": str(table)}], False, [{"format": "wds", "samples_per_shard": 1}])
    code, output = _build(tmp_path, out, *spec)
    assert code != 0 and "No space left" in output, output
    old = [(i, k) for i, k, *_ in _plan(out)]
    assert old[:2] == [("metadata/clips/../clips/photo_00000.jpg", "clips_clips_photo_00000"),
                       ("metadata/clips/photo_00001.jpg", "clips_photo_00001")]
    assert old[2][0] == "metadata/./clips//photo_00001.jpg" and old[2][1].startswith("clips_photo_00001_")
    assert {p.name for p in (out / "wds").glob("*.tar")} == {"00000.tar"}

    disk_full_at(None)
    monkeypatch.setattr(paths, "table_name", name_once, raising=False)
    code, output = _build(tmp_path, out, *spec)
    assert code == 0, output
    # the same files under the ids of now: not 'changed' (was: 2 new and 2 gone, and advice to rebuild everything)
    assert "the sources changed" not in output, output
    assert [(i, k) for i, k, *_ in _plan(out)] == old
    m = _manifest(out)
    assert m["counts"]["written"] == 3 and m["counts"]["skipped"] == {} and m["counts"]["failed"] == {}
    assert set(_samples(out)) == {k for _, k in old}  # clips_clips_photo_00000 (planned so), no clips_photo_00000

    # the same table built afresh: the names of now
    code, output = _build(tmp_path, tmp_path / "fresh", *spec)
    assert code == 0, output
    fresh = [(i, k) for i, k, *_ in _plan(tmp_path / "fresh")]
    assert fresh[:2] == [("metadata/clips/photo_00000.jpg", "clips_photo_00000"),
                         ("metadata/clips/photo_00001.jpg", "clips_photo_00001")]
    assert fresh[2][0] == "metadata/clips/photo_00001.jpg#row2" and fresh[2][1].startswith("clips_photo_00001_")
    assert fresh[2][1] != old[2][1]


@pytest.mark.slow  # a real VAE and text encoder on CPU: about 7 s
def test_a_precomputed_tree_mirrors_the_one_name(photos, tmp_path):
    """``.precomputed/`` mirrors media paths: an absolute path inside the table's folder, or one with
    ``..``, was a ``ValueError`` traceback there; now it is mirrored under its one name."""
    rows = [{"file": str(photos / "clips" / "photo_00000.jpg"), "caption": "absolute"},
            {"file": "clips/../clips/photo_00001.jpg", "caption": "dot-dot"},
            {"file": "./clips//photo_00001.jpg", "caption": "again"}]
    table = write_table(photos, rows, "csv")
    code, output = _build(tmp_path, tmp_path / "o", [{"path": str(table)}],
                          outputs=[{"format": "precomputed"}], extra={
                              "geometry": {"buckets": ["32x32x1"]}, "images": {"upscale": True},
                              "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}}})
    assert code == 0, output
    m = _manifest(tmp_path / "o")
    assert m["counts"]["written"] == 2 and m["counts"]["skipped"] == {"duplicate": 1}
    tree = tmp_path / "o" / ".precomputed"
    assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.pt")) == [
        "conditions/clips/photo_00000.pt", "conditions/clips/photo_00001.pt",
        "latents/clips/photo_00000.pt", "latents/clips/photo_00001.pt"]
