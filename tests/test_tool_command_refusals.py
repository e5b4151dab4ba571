"""The tool commands (register, repair, report, decode, verify) refuse a user's mistake with one message
naming the item and a fix that works, exit code 2, before any slow work, and write nothing on refusal:

- ``register --config`` edits only a shardsmith data config, never another program's YAML;
- ``register`` and ``repair`` refuse a dataset of an unfinished build (the build resumes; repair is for
  a finished dataset);
- ``repair`` of a read-only dataset says how to make it writable (it has no ``--out``); ``report`` of a
  build's output folder names the build folder to pass instead;
- ``verify``, ``decode`` and ``register`` refuse a missing path before importing torch;
- ``decode --out`` / ``report --output`` refuse a table source itself, not the project folder it sits in.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardsmith
from tests.test_cli_mistakes import assert_message, invoke

PY = sys.executable


def pictures(folder: Path, n: int = 3) -> Path:
    from PIL import Image

    rng = np.random.default_rng(7)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
    return folder


def small_recipe(source: Path | str) -> dict:
    return {"workers": 1, "sources": [{"path": str(source)}],
            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2, "image": {"size": 32}}]}


def small_build(base: Path) -> Path:
    """A finished build of 3 small pictures (``base/src``): ``base/out/wds`` in 2 shards."""
    shardsmith.build(small_recipe(pictures(base / "src")), base / "out", quiet=True)
    return base / "out"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return small_build(tmp_path_factory.mktemp("tool_refusals"))


@pytest.fixture
def build_copy(built, tmp_path) -> Path:
    dest = tmp_path / "out"
    shutil.copytree(built, dest)
    return dest


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (relative path -> bytes), the lock file aside (its holder text changes)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "lock"}


# -- register --config: only a shardsmith data config is edited -----------------------------------------------

TRAINER_YAML = ("# my trainer\nmodel:\n  name: dit-xl\n  lr: 1.0e-4\ndata:\n  path: /data/imagenet\n"
                "optimizer: adamw\n")


@pytest.mark.parametrize("text, key", [
    (TRAINER_YAML, "'model'"),
    ("sources: [{path: photos}]\noutputs: [{format: wds}]\n", "'sources'"),
])
def test_register_refuses_a_yaml_that_is_no_data_config(built, tmp_path, text, key):
    cfg = tmp_path / "train.yaml"
    cfg.write_bytes(text.encode())
    code, out = invoke("register", built / "wds", "--preset", "image", "--name", "x", "--config", cfg)
    assert_message(code, out, str(cfg), "is not a shardsmith data config", key, "pass --config a data-config file")
    assert cfg.read_bytes() == text.encode()


def test_add_entry_refuses_another_programs_yaml_and_keeps_data_configs(tmp_path):
    from shardsmith.loaders.registry import RegistryError, add_entry, read_config

    entry = {"preset": "image", "path": "${DATA_ROOT_DIR}/wds"}
    cfg = tmp_path / "trainer.yaml"
    cfg.write_text(TRAINER_YAML)
    with pytest.raises(RegistryError, match=r"trainer.yaml is not a shardsmith data config: its top-level key "
                                            r"'model' \(a mapping of name, lr\)"):
        add_entry(cfg, "x", entry)
    assert cfg.read_text() == TRAINER_YAML
    data = tmp_path / "data.yaml"  # a data config (both kinds of entry) still takes a new entry
    data.write_text("# mine\na:\n  preset: image\n  path: /a\nb: {kind: precomputed, path: /b, dirs: [latents]}\n")
    add_entry(data, "x", entry)
    assert read_config(data)["x"] == entry and data.read_text().startswith("# mine\n")
    for fresh in (tmp_path / "new.yaml", tmp_path / "empty.yaml"):  # a new or empty file is created / filled
        if fresh.name == "empty.yaml":
            fresh.write_text("# nothing yet\n")
        add_entry(fresh, "x", entry)
        assert read_config(fresh) == {"x": entry}


# -- register and repair refuse an unfinished build --------------------------------------------------------------

def test_register_and_repair_refuse_a_build_stopped_mid_way(tmp_path, disk_full_at):
    from shardsmith.errors import UserError
    from shardsmith.verify.repair import RepairError, repair_wds

    recipe, out = small_recipe(pictures(tmp_path / "src")), tmp_path / "out"
    disk_full_at(1)  # the second shard cannot be written: the build stops with 00000.tar committed
    with pytest.raises(UserError):
        shardsmith.build(recipe, out, quiet=True)
    assert (out / "wds" / "00000.tar").is_file() and not (out / "manifest.json").exists()
    before, cfg = tree_bytes(out), tmp_path / "data.yaml"
    fix = f"re-run the same `shardsmith build ... --out {out}` command (it resumes where it stopped)"
    code, said = invoke("register", out / "wds", "--preset", "image", "--name", "x", "--config", cfg)
    assert_message(code, said, f"{out / 'wds'} is an output of the unfinished build {out}", "no manifest.json", fix,
                   f"then register {out / 'wds'}")
    # given the build folder itself: the dataset to pass once it is finished (a build folder is refused then)
    assert_message(*invoke("register", out, "--preset", "image", "--name", "x", "--config", cfg),
                   f"{out} is an unfinished build", fix, f"then register {out / 'wds'}")
    for dry in ([], ["--dry-run"]):
        assert_message(*invoke("repair", out / "wds", *dry), "is an output of the unfinished build", fix,
                       f"then repair {out / 'wds'} if shardsmith verify still finds it damaged")
    assert_message(*invoke("repair", out), f"{out} is an unfinished build", fix, f"then repair {out / 'wds'} if")
    with pytest.raises(RepairError, match="unfinished build"):
        repair_wds(out / "wds")
    assert not cfg.exists() and tree_bytes(out) == before
    disk_full_at(None)
    shardsmith.build(recipe, out, quiet=True)  # the fix: the build resumes and finishes
    code, said = invoke("register", out / "wds", "--preset", "image", "--name", "x", "--config", cfg)
    assert code == 0, said
    assert invoke("repair", out / "wds", "--dry-run")[0] == 0


def test_a_ledger_that_does_not_mark_the_build_complete_is_unfinished(build_copy, tmp_path):
    db = sqlite3.connect(build_copy / ".shardsmith" / "ledger.sqlite")
    db.execute("DELETE FROM meta WHERE key='complete'")
    db.commit()
    db.close()
    before = tree_bytes(build_copy)
    assert_message(*invoke("register", build_copy / "wds", "--preset", "image", "--name", "x", "--config",
                           tmp_path / "d.yaml"), "unfinished build", "does not mark it complete")
    assert_message(*invoke("repair", build_copy / "wds"), "unfinished build", "does not mark it complete")
    assert tree_bytes(build_copy) == before and not (tmp_path / "d.yaml").exists()


# -- repair of a read-only dataset, report of an output folder: a fix that works --------------------------------

def _truncate(shard: Path) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])


def _read_only(folder: Path, script: str) -> subprocess.CompletedProcess:
    """``script`` (bash) with ``folder`` bind-mounted read-only (a private mount namespace), or a skip."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a read-only bind mount")
    cmd = f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && {script}"
    r = subprocess.run(["unshare", "-m", "bash", "-c", cmd], capture_output=True, text=True)
    if r.returncode != 0 and "shardsmith" not in r.stderr + r.stdout:
        pytest.skip(f"no read-only bind mount here: {r.stderr.strip()[:200]}")
    return r


@pytest.mark.parametrize("mounted", ["wds", "."])  # the dataset folder, or the whole build (where its lock is)
def test_repair_of_a_read_only_dataset_says_how_to_make_it_writable(build_copy, mounted):
    _truncate(build_copy / "wds" / "00000.tar")
    before = tree_bytes(build_copy)
    root = build_copy.resolve()
    folder = (build_copy / mounted).resolve()
    r = _read_only(folder, f"{PY} -m shardsmith repair {build_copy / 'wds'}")
    blocked = f"{root / 'wds'}" if mounted == "wds" else f"{root / '.shardsmith'} and {root / 'wds'}"
    assert_message(r.returncode, r.stdout + r.stderr, f"{blocked} cannot be written", "it has no --out",
                   f"chmod -R u+w {folder}", f"cp -a {root} COPY; chmod -R u+w COPY; then shardsmith repair COPY/wds",
                   f"shardsmith repair --dry-run {build_copy / 'wds'}")
    assert "(--out)" not in r.stderr and "ERROR" not in r.stdout
    assert tree_bytes(build_copy) == before


def test_repair_whose_lock_cannot_be_made_names_no_out_flag(build_copy, monkeypatch):
    """The lock folder refused by the file system after the permission check (a race, a full inode table):
    the same fix, not the build's "choose another folder (--out)"."""
    import contextlib
    import errno

    from shardsmith.safety.lock import cannot_write
    from shardsmith.verify import repair

    @contextlib.contextmanager
    def refused(folder, what, read_only=False):
        try:
            raise OSError(errno.EROFS, "Read-only file system", str(Path(folder) / ".shardsmith" / "lock"))
        except OSError as exc:
            raise cannot_write(Path(folder), exc, what) from None
        yield

    _truncate(build_copy / "wds" / "00000.tar")
    monkeypatch.setattr(repair, "hold", refused)
    code, out = invoke("repair", build_copy / "wds")
    assert_message(code, out, f"{build_copy.resolve() / '.shardsmith'} cannot be written (Read-only file system",
                   "it has no --out", "chmod -R u+w", "repair COPY/wds")
    assert "(--out)" not in out


def test_report_of_an_output_folder_names_the_build_to_pass(built, tmp_path):
    root = built.resolve()
    for inside in (built / "wds", built / "wds" / "00000.tar"):
        code, out = invoke("report", inside, "--no-previews", "--output", tmp_path / "r.html")
        assert_message(code, out, f"{inside.resolve()} is ", f"the shardsmith build at {root}",
                       f"pass {root} instead (shardsmith report {root})")
        assert "not a shardsmith build (no manifest.json)" not in out
    half = tmp_path / "half"
    shutil.copytree(built, half)
    (half / "manifest.json").unlink()
    code, out = invoke("report", half / "wds", "--no-previews")
    assert_message(code, out, f"is an output folder of the shardsmith build at {half.resolve()}", "not finished",
                   "resume it with the same command")
    assert not (tmp_path / "r.html").exists() and not (half / "report.html").exists()
    stray = tmp_path / "stray"
    stray.mkdir()
    assert_message(*invoke("report", stray), "is not a shardsmith build (no manifest.json)")


# -- a missing path is refused before torch is imported ----------------------------------------------------------

#: runs ``shardsmith ARGS`` in a fresh interpreter; prints its exit code, its output and whether torch was imported
WRAPPER = """
import json, sys
from typer.testing import CliRunner
from shardsmith import cli
r = CliRunner().invoke(cli.app, sys.argv[1:])
print(json.dumps({"code": r.exit_code, "output": r.output, "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("args, says", [
    (["verify", "{missing}", "--world", "1", "--workers", "0"], "give an EDM .zip, a folder with .tar shards"),
    (["verify", "{missing}", "--preset", "image", "--set", "batch_size=4"], "give an EDM .zip"),
    (["decode", "{missing}", "--out", "{tmp}/dec"], "decode takes a shardsmith build folder"),
    (["register", "{missing}", "--preset", "image", "--name", "x", "--config", "{tmp}/d.yaml"], "give an EDM .zip"),
])
def test_a_missing_path_is_refused_before_torch_is_imported(tmp_path, args, says):
    missing = tmp_path / "no" / "such"
    argv = [a.format(missing=missing, tmp=tmp_path) for a in args]
    r = subprocess.run([PY, "-c", WRAPPER, *argv], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert_message(got["code"], got["output"], f"{missing} does not exist", says)
    assert got["torch"] is False, f"torch was imported before the refusal of {argv[0]}"
    assert not (tmp_path / "dec").exists() and not (tmp_path / "d.yaml").exists()


def test_decode_of_an_output_folder_names_the_build_to_pass(built, tmp_path):
    code, out = invoke("decode", built / "wds", "--out", tmp_path / "dec")
    assert_message(code, out, f"lies inside the shardsmith build {built.resolve()}", f"pass {built.resolve()} instead")
    assert not (tmp_path / "dec").exists()


# -- decode --out / report --output: not onto a table source; its project folder is fine --------------------------

@pytest.fixture(scope="module")
def table_build(tmp_path_factory) -> tuple[Path, Path]:
    """(data folder, build): ``data/captions.csv`` names ``data/img/p*.png`` (relative paths); the build's
    --out is ``data/out``, inside the table's folder (build allows it: the table names its files)."""
    data = tmp_path_factory.mktemp("table_src") / "data"
    pictures(data / "img")
    (data / "captions.csv").write_text("file,caption\n" + "".join(f"img/p{i}.png,picture {i}\n" for i in range(3)))
    out = data / "out"
    shardsmith.build(small_recipe(data / "captions.csv"), out, quiet=True)
    return data, out


def test_report_output_beside_a_table_source_is_written_onto_it_refused(table_build, tmp_path):
    """The folder a table sits in is the user's project folder (build accepts --out there too): a page there
    is written; only the table file itself is refused (the manifest does not record where its rows point)."""
    data, out = table_build
    table = data / "captions.csv"
    before = table.read_bytes()
    code, said = invoke("report", out, "--no-previews", "--output", table)
    assert_message(code, said, f"--output {table} is source 'captions'", "outside every source folder")
    assert table.read_bytes() == before
    for dest in (data / "r.html", out / "report.html", tmp_path / "r.html"):
        code, said = invoke("report", out, "--no-previews", "--output", dest)
        assert code == 0 and dest.is_file(), said
        dest.unlink()


def _table_latent_build(tmp_path: Path) -> tuple[Path, Path]:
    """(the table, a latent build's folder whose manifest records it as its source)."""
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "a.png").write_bytes(b"png")
    (data / "t.jsonl").write_text('{"file": "img/a.png"}\n')
    root = tmp_path / "build"  # a latent build (its manifest) that read the table
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({
        "counts": {}, "models": {"vae": {"provenance": {"weights": "random-weights"}}},
        "outputs": {"lat": {"format": "latent_wds", "files": {"train": {"dir": "lat", "shards": []}}}},
        "recipe": {"sources": [{"path": str(data / "t.jsonl"), "name": "rows"}],
                   "outputs": [{"format": "latent_wds", "dir": "lat"}]}}))
    return data / "t.jsonl", root


@pytest.mark.parametrize("where", ["dec", "img/dec"])
def test_decode_out_in_a_table_sources_folder_is_not_refused_for_it(tmp_path, where):
    table, root = _table_latent_build(tmp_path)
    code, said = invoke("decode", root, "--out", table.parent / where)
    assert "table source" not in said and "source 'rows'" not in said, said
    code, said = invoke("decode", root, "--out", table)  # onto the table itself: refused
    assert_message(code, said, f"--out {table.resolve()} is source 'rows'")
