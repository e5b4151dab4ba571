"""Found by an audit of ``build`` with a careless user's inputs (2026-12-04): one output writing over another's
shards, pipes and devices named like media hanging or exhausting the build, an ``--out`` that cannot be
created ending in a traceback, and an output ``dir`` that is one of the build's own files."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from media_factory import real_photos
from shardsmith.plan.probe import read_and_hash
from shardsmith.sources.paths import NotRegularFile
from shardsmith.recipe import RecipeError, recipe_from_dict

PY = sys.executable


def build(*args, timeout=120, prefix=()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, PY, "-m", "shardsmith", "build", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def refused(r: subprocess.CompletedProcess, *texts: str) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    for t in texts:
        assert t in out, f"{t!r} not in:\n{out}"


def recipe(tmp_path, outputs, **more):
    (tmp_path / "photos").mkdir(exist_ok=True)
    return recipe_from_dict({"sources": [{"path": "photos"}], "outputs": outputs, **more}, base_dir=tmp_path)


@pytest.mark.parametrize("second, says", [
    ("./wds", "'./wds' is where output 'a' writes too"),
    ("wds/", "'wds/' is where output 'a' writes too"),
    ("sub/../wds", "'sub/../wds' must be a relative path inside --out"),
])
def test_one_folder_spelled_two_ways_is_refused(tmp_path, second, says):
    """Before: only identical strings were refused, and ``./wds`` wrote over ``wds``'s 00000.tar (exit 0, a
    manifest holding the hash of a shard that was gone)."""
    with pytest.raises(RecipeError) as e:
        recipe(tmp_path, [{"format": "wds", "dir": "wds", "name": "a"}, {"format": "wds", "dir": second, "name": "b"}])
    assert says in str(e.value)


@pytest.mark.parametrize("target, says", [
    ("holdout/wds", "the held-out split's outputs"),
    ("holdout", "the held-out split's outputs"),
    ("manifest.json", "the build's manifest"),
    ("./report.html", "the build's HTML report"),
    (".shardsmith/shards", "the build's ledger and state"),
    ("manifest.json/x", "the build's manifest"),  # (a folder there: the manifest's write failed after the build)
    ("./report.html/r", "the build's HTML report"),
])
def test_an_output_in_a_place_the_build_writes_itself_is_refused(tmp_path, target, says):
    """Before: ``holdout/wds`` overwrote the held-out split of output ``wds`` with training samples;
    ``manifest.json`` ran the whole build, then crashed at the manifest (every re-run again)."""
    with pytest.raises(RecipeError) as e:
        recipe(tmp_path, [{"format": "wds", "dir": "wds", "name": "a"}, {"format": "wds", "dir": target, "name": "b"}],
               split={"holdout": 1})
    assert f"output 'b': {target!r} is where the build keeps {says}" in str(e.value)


def test_read_and_hash_refuses_a_pipe_without_waiting(tmp_path):
    """A path that became a named pipe after the listing: opening it for reading used to block forever."""
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    got: list = []
    t = threading.Thread(target=lambda: got.append(_refusal(fifo)), daemon=True)
    t.start()
    t.join(10)
    assert got == ["a named pipe (FIFO)"]


def _refusal(path: Path) -> str | None:
    try:
        read_and_hash(str(path), keep=True)
    except NotRegularFile as exc:
        return exc.what
    return None


@pytest.mark.slow
def test_pipes_and_devices_named_like_media_fail_and_are_never_opened(tmp_path):
    """Before: a FIFO ``pipe.jpg`` hung ``build`` and ``scan`` for ever, and a character device ``zero.jpg``
    (a copy of /dev/zero) was read until memory ran out. Now each is ``failed:not_a_regular_file``, the
    build goes on, and the manifest accounts for it."""
    src = tmp_path / "photos"
    real_photos(src, 2, seed=3)
    os.mkfifo(src / "pipe.jpg")
    (src / "link.jpg").symlink_to(src / "pipe.jpg")
    special = 2
    if os.geteuid() == 0:  # only root may make a device node
        os.mknod(src / "zero.jpg", stat.S_IFCHR | 0o644, os.makedev(1, 5))
        special = 3
    r = build("--source", src, "--to", "wds", "--out", tmp_path / "out", "-q", timeout=90)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["counts"]["written"] == 2
    assert m["counts"]["failed"] == {"not_a_regular_file": special}
    s = subprocess.run([PY, "-m", "shardsmith", "scan", str(src)], capture_output=True, text=True, timeout=90)
    assert s.returncode == 0 and f"failed:not_a_regular_file {special}" in s.stdout, s.stdout + s.stderr


def _without_root_override() -> tuple[str, ...]:
    """A prefix that makes root obey file permissions (it ignores them otherwise); () for another user."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root ignores file permissions, and setpriv is not here to drop that")
    caps = "-dac_override,-dac_read_search"
    return (setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}")


def test_an_out_under_a_file_is_one_message(tmp_path):
    """Before: NotADirectoryError, a traceback, exit code 1."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "photos").mkdir()
    r = build("--source", tmp_path / "photos", "--to", "wds", "--out", tmp_path / "afile" / "sub", "-q")
    refused(r, f"{tmp_path / 'afile'} is a file, not a folder; choose another folder (--out)")


@pytest.mark.slow
def test_unwritable_out_is_one_message_and_a_finished_read_only_build_is_still_checked(tmp_path):
    """Before: PermissionError tracebacks (exit 1) for an --out in a read-only folder, and for re-running a
    finished build whose folder is read-only (which needs no write at all)."""
    prefix = _without_root_override()
    src = tmp_path / "photos"
    real_photos(src, 2, seed=4)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = build("--source", src, "--to", "wds", "--out", ro / "out", "-q", prefix=prefix)
        refused(r, f"{ro / 'out'} cannot be written (Permission denied); make it writable")
    finally:
        ro.chmod(0o755)
    done = tmp_path / "done"
    assert build("--source", src, "--to", "wds", "--out", done, "-q").returncode == 0
    before = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
    subprocess.run(["chmod", "-R", "a-w", str(done)], check=True)
    try:
        r = build("--source", src, "--to", "wds", "--out", done, prefix=prefix)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
        assert "already holds this build, complete; nothing to do" in " ".join((r.stdout + r.stderr).split())
        r = build("--source", src, "--to", "wds", "--image-size", "64", "--out", done, prefix=prefix)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr  # another recipe: refused
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(done)], check=True)
    assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file()} == before


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_a_source_with_nothing_to_read_is_one_message(tmp_path):
    """Before: an empty folder, or one holding only files without a media extension, built an empty dataset
    with exit 0 and "done"; ``path: ""`` read the recipe's own folder."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.doc").write_text("x")
    for src in ("empty", "other"):
        r = build("--source", tmp_path / src, "--to", "wds", "--out", tmp_path / f"out_{src}", "-q")
        refused(r, f"source '{src}' ({tmp_path / src}) holds no media file", "check the path")
        assert not (tmp_path / f"out_{src}").exists()  # the refused build leaves no folder it made
    with pytest.raises(RecipeError) as e:
        recipe_from_dict({"sources": [{"path": " "}], "outputs": [{"format": "wds"}]}, base_dir=tmp_path)
    assert "sources[0].path: the source path is empty" in str(e.value)


def test_unknown_format_lists_the_formats_and_never_suggests_a_codec(tmp_path):
    """Before: ``--to h264`` said "unknown format 'h264'; did you mean `h264`?" (video_wds's codec was taken for
    a format), and the list of formats named h264."""
    with pytest.raises(RecipeError) as e:
        recipe(tmp_path, [{"format": "h264"}])
    msg = str(e.value)
    assert "unknown format 'h264'; use one of wds, zip, latent_wds" in msg and "`h264`" not in msg
    with pytest.raises(RecipeError) as e:
        recipe(tmp_path, [{"format": "wdss"}])
    assert "did you mean `wds`?" in str(e.value)
    with pytest.raises(RecipeError) as e:
        recipe(tmp_path, [{"format": "wds"}], images={"background": "red"})
    assert "images.background" in str(e.value) and "three integers in 0..255" in str(e.value)


def test_files_the_walk_passes_over_are_counted_and_named(tmp_path):
    """Before: hidden files and folders and files without a media extension (``scan.jfif``, ``meta.json``)
    were left out without a word: in no count, no reason, no warning."""
    src = tmp_path / "photos"
    files = real_photos(src, 2, seed=5)
    (src / ".hidden.jpg").write_bytes(files[0].read_bytes())
    (src / ".more").mkdir()
    (src / ".more" / "c.jpg").write_bytes(files[1].read_bytes())
    (src / "scan.jfif").write_bytes(files[1].read_bytes())
    (src / "sub").mkdir()
    (src / "sub" / "meta.json").write_text("{}")
    r = build("--source", src, "--to", "wds", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["counts"]["written"] == 2
    assert m["sources"][0]["ignored"] == {"hidden": 2, "no_media_extension": 2,
                                          "examples": [".hidden.jpg", ".more", "scan.jfif", "sub/meta.json"]}
    said = " ".join((r.stdout + r.stderr).split())
    assert "source 'photos': 4 file(s) or folder(s) passed over, not counted as inputs (hidden 2, no media " \
           "extension 2; e.g. .hidden.jpg, .more, scan.jfif, sub/meta.json)" in said, said


def test_a_file_gone_or_turned_into_a_pipe_after_the_plan_is_named_so(tmp_path):
    """Before: a source file deleted between a kill and the resume was ``failed:unreadable`` (the README says
    ``failed:vanished``), and one replaced by a named pipe blocked the decode worker for ever."""
    from shardsmith.records import ItemError
    from shardsmith.transform.samples import read_verified

    with pytest.raises(ItemError) as e:
        read_verified(str(tmp_path / "gone.jpg"), None, "photos/gone.jpg")
    assert e.value.reason == "vanished" and "re-run once the folder is stable" in e.value.detail
    os.mkfifo(tmp_path / "p.jpg")
    got: list = []

    def read():
        try:
            read_verified(str(tmp_path / "p.jpg"), None, "photos/p.jpg", prefix="mask_")
        except ItemError as exc:
            got.append(exc.reason)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert got == ["mask_not_a_regular_file"]


@pytest.mark.slow
def test_images_with_only_video_buckets_are_refused_before_any_output(tmp_path):
    """Before: every image was ``skipped:no_image_bucket`` after the VAE had loaded, and the build ended with
    exit 0 and "done" having written nothing."""
    src = tmp_path / "photos"
    real_photos(src, 2, seed=6)
    r = build("--source", src, "--to", "latent_wds", "--set", "models.vae.family=sd", "--set", "models.vae.config=tiny",
              "--set", "models.device=cpu", "--resolution-buckets", "64x64x17", "--out", tmp_path / "out", "-q")
    refused(r, "output 'latent_wds': every input it takes is an image, and geometry.buckets (64x64x17) has no "
               "bucket of 1 frame")
    assert not list((tmp_path / "out").glob("latents/*.tar"))


@pytest.mark.slow
def test_verify_out_json_never_overwrites_another_file(tmp_path):
    """Before: ``verify --out-json`` wrote over any file, a shard of the dataset it checked included, and a
    missing folder failed only after the whole run with a bare ``[Errno 2]``."""
    src = tmp_path / "photos"
    real_photos(src, 2, seed=7)
    assert build("--source", src, "--to", "wds", "--out", tmp_path / "b", "-q").returncode == 0
    ds = tmp_path / "b" / "wds"
    shard = ds / "00000.tar"
    before = shard.read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")

    def verify(target):
        return subprocess.run([PY, "-m", "shardsmith", "verify", str(ds), "--world", "1", "--workers", "0", "-q",
                               "--out-json", str(target)], capture_output=True, text=True, timeout=120)

    refused(verify(shard), "lies inside the dataset")
    refused(verify(notes), "exists and is not a verify report")
    refused(verify(tmp_path / "nope" / "v.json"), "does not exist (it is not created)")
    assert shard.read_bytes() == before and notes.read_text() == "mine"
    first = verify(tmp_path / "v.json")
    assert first.returncode == 0 and json.loads((tmp_path / "v.json").read_text())["ok"] is True, first.stderr
    assert verify(tmp_path / "v.json").returncode == 0  # its own earlier report is replaced


def _tar(path: Path, samples: list[dict[str, bytes]]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i, members in enumerate(samples):
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"s{path.stem}_{i:03d}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_verify_infers_batch_keys_past_an_empty_first_shard_and_from_later_shards(tmp_path):
    """Before: the keys came from the first shard alone. An empty first shard (what repair leaves of one cut
    before its first sample) gave a raw pydantic error; a caption only the first shard's samples carry made
    verify report every later sample as dropped (missing:txt)."""
    from shardsmith.verify.runner import infer_key_map

    _tar(tmp_path / "00000.tar", [])
    _tar(tmp_path / "00001.tar", [{"jpg": b"x", "txt": b"a", "cls": b"1"}] * 3)
    _tar(tmp_path / "00002.tar", [{"jpg": b"x", "cls": b"2"}] * 3)
    assert infer_key_map(tmp_path) == {"jpg": "jpg", "cls": "cls"}
    empty = tmp_path / "empty"
    empty.mkdir()
    _tar(empty / "00000.tar", [])
    with pytest.raises(ValueError, match="no shard of .* holds a sample to infer the batch keys from; pass them "
                                         "with --key-map"):
        infer_key_map(empty)


@pytest.mark.parametrize("args, flag", [
    (("verify", "{ds}", "--image-size", "0"), "--image-size"),
    (("verify", "{ds}", "--batches", "-1"), "--batches"),
    (("verify", "{ds}", "--workers", "-1"), "--workers"),
    (("verify", "{ds}", "--batch-size", "0"), "--batch-size"),
    (("inspect", "{ds}", "--world", "-1"), "--world"),
    (("inspect", "{ds}", "--workers", "-1"), "--workers"),
    (("decode", "{ds}", "--out", "{out}", "--limit", "-1"), "--limit"),
])
def test_flags_out_of_range_are_refused_when_read(tmp_path, args, flag):
    """Before: ``verify --image-size 0`` ran and failed the dataset (exit 1, every sample "dropped"); ``inspect
    --world -1``, ``decode --limit -1`` and ``verify --batches -1`` were taken with exit 0."""
    from test_cli_mistakes import invoke

    (tmp_path / "ds").mkdir()
    code, out = invoke(*(a.format(ds=tmp_path / "ds", out=tmp_path / "dec") for a in args))
    assert code == 2 and f"Invalid value for '{flag}'" in out, out
    assert not (tmp_path / "dec").exists()


def test_repair_of_a_folder_without_shards_is_one_message_and_writes_nothing(tmp_path):
    """Before: ``repair`` of an empty folder said "shard_count.json: None -> {}", exited 0 and left a
    ``.shardsmith/`` folder in the user's folder."""
    from test_cli_mistakes import invoke

    empty = tmp_path / "emptyf"
    empty.mkdir()
    code, out = invoke("repair", empty)
    assert code == 2 and f"{empty} holds no .tar shards; repair takes a WebDataset folder" in out, out
    assert list(empty.iterdir()) == []


@pytest.mark.slow
def test_verify_set_of_a_flag_key_and_a_bad_key(tmp_path):
    """Before: ``verify --set batch_size=4`` was a TypeError traceback (the flag's keyword given twice), and a
    bad ``--set`` key a raw pydantic dump with links; ``verify /nonexistent`` did not say it does not exist."""
    from test_cli_mistakes import invoke

    src = tmp_path / "photos"
    real_photos(src, 3, seed=8)
    assert build("--source", src, "--to", "wds", "--out", tmp_path / "b", "-q").returncode == 0
    ds = tmp_path / "b" / "wds"
    code, out = invoke("verify", ds, "--set", "batch_size=2", "--world", "1", "--workers", "0", "--json")
    assert code == 0 and json.loads(out[out.index("{"):])["batch_size"] == 2, out
    code, out = invoke("verify", ds, "--set", "bogus_key=3")
    assert code == 2 and "WdsLoaderConfig.bogus_key: not a setting of it" in out and "pydantic.dev" not in out, out
    code, out = invoke("verify", ds, "--set", "batch_size=0")
    assert code == 2 and "WdsLoaderConfig.batch_size: Input should be greater than or equal to 1" in out, out
    code, out = invoke("verify", tmp_path / "nowhere")
    assert code == 2 and f"{tmp_path / 'nowhere'} does not exist" in out, out


def test_register_beside_a_manifest_of_another_shape_is_a_message(tmp_path):
    """Before: ``register`` without ``--preset`` of a dataset whose build manifest is a JSON list crashed
    (AttributeError: 'list' object has no attribute 'get') while looking for the build's mode."""
    from test_cli_mistakes import invoke

    ds = tmp_path / "b" / "wds"
    ds.mkdir(parents=True)
    _tar(ds / "00000.tar", [{"jpg": b"x", "txt": b"a"}])
    (tmp_path / "b" / ".shardsmith").mkdir()
    for bad in ("[]", '{"outputs": [1, 2], "recipe": "x"}'):
        (tmp_path / "b" / "manifest.json").write_text(bad)
        code, out = invoke("register", ds, "--name", "x", "--config", tmp_path / "data.yaml")
        assert code == 2 and "--preset is required" in out and "Traceback" not in out, out


@pytest.mark.slow
def test_decode_out_that_cannot_be_written_is_refused_before_any_model(tmp_path):
    """Before: ``decode --out`` in a read-only folder failed only after the VAE had loaded."""
    prefix = _without_root_override()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code = ("import sys; from pathlib import Path; from shardsmith.verify.decode import prepare_out, DecodeError\n"
            "try:\n    prepare_out(Path(sys.argv[1]), Path(sys.argv[2]), False)\n"
            "except DecodeError as e:\n    print('refused:', e)\n")
    try:
        r = subprocess.run([*prefix, PY, "-c", code, str(ro / "dec"), str(tmp_path / "build")], capture_output=True,
                           text=True, timeout=60)
    finally:
        ro.chmod(0o755)
    assert f"refused: --out {ro / 'dec'} cannot be written" in r.stdout, r.stdout + r.stderr
    assert list(ro.iterdir()) == []
