"""``verify --out-json PATH`` and ``decode --out PATH`` where PATH cannot be written: under a regular file
(``file.txt/out.json``), in a folder this user may not look into (``chmod 000``) or write in (``chmod 555``).
Each ends in one message naming the path, the folder (or file) in the way and the fix, exit code 2, before any
slow work (verify's run, the VAE), never a traceback.

Before: verify said the folder ``file.txt`` "does not exist ... create it first"; a ``chmod 000`` folder was a
``PermissionError`` traceback (verify and decode); a read-only folder was a traceback after verify's whole run;
decode under a file said "``file.txt is not a folder in file.txt``".

Root ignores file permissions: the permission tests run the command with ``setpriv`` dropping that power
(skipped where it is missing, as tests/test_safety_audit.py does).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_audit_decode_distill import hand_build
from test_cli_mistakes import assert_message, invoke
from test_safety_audit import _without_root_override


@pytest.fixture
def no_verify_run(monkeypatch):
    """Running verify fails the test: the refusal must come first."""
    def refuse(*a, **k):
        raise AssertionError("verify ran before the refusal")

    monkeypatch.setattr("shardsmith.verify.runner.verify", refuse)


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the VAE was loaded before the refusal")

    monkeypatch.setattr("shardsmith.verify.decode.load_vae", refuse)


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A folder to verify (never read: every test here is refused first)."""
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "00000.tar").write_bytes(b"\0" * 1024)
    return ds


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "file.txt"
    f.write_text("mine")
    return f


def test_verify_out_json_under_a_file_names_the_file(dataset, a_file, no_verify_run):
    code, out = invoke("verify", dataset, "--out-json", a_file / "out.json")
    assert_message(code, out, f"--out-json {a_file / 'out.json'}: {a_file} is a file, not a folder",
                   "give a path inside a folder")
    assert "does not exist" not in out
    assert a_file.read_text() == "mine"


def test_verify_out_json_missing_folder_is_still_said_as_before(dataset, tmp_path, no_verify_run):
    code, out = invoke("verify", dataset, "--out-json", tmp_path / "nope" / "v.json")
    assert_message(code, out, "does not exist (it is not created); create it first")


def test_decode_out_under_a_file_names_the_file_before_any_model(tmp_path, a_file, no_model_load):
    build = hand_build(tmp_path / "b")
    for out in (a_file / "dec", a_file / "deeper" / "dec"):
        code, said = invoke("decode", build, "--out", out, "--device", "cpu")
        assert_message(code, said, f"--out {out}: {a_file} is a file, not a folder", "give a path inside a folder")
    code, said = invoke("decode", build, "--out", a_file, "--device", "cpu")
    assert_message(code, said, f"--out {a_file} is a file; give a folder (it is created)")
    assert a_file.read_text() == "mine"


def test_decode_api_refuses_an_out_under_a_file_with_a_decode_error(tmp_path, a_file):
    from shardsmith.verify.decode import DecodeError, check_out

    with pytest.raises(DecodeError, match="is a file, not a folder"):
        check_out(a_file / "dec", tmp_path / "b", False)


def test_nearest_folder_is_the_existing_folder_above(tmp_path):
    from shardsmith.user_paths import nearest_folder

    assert nearest_folder(tmp_path / "a" / "b" / "c") == tmp_path
    assert nearest_folder(tmp_path) == tmp_path


# --------------------------------------------------------------------------- permissions (real processes)


def _run(prefix: tuple[str, ...], *args) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def locked_and_read_only(tmp_path):
    """``locked/`` (chmod 000: not even looked into) and ``ro/`` (chmod 555: read, not written); both
    restored after the test."""
    locked, ro = tmp_path / "locked", tmp_path / "ro"
    locked.mkdir()
    ro.mkdir()
    locked.chmod(0o000)
    ro.chmod(0o555)
    yield locked, ro
    locked.chmod(0o755)
    ro.chmod(0o755)


def test_verify_out_json_in_a_folder_this_user_cannot_open_or_write(dataset, locked_and_read_only):
    prefix = _without_root_override()
    locked, ro = locked_and_read_only
    for target in (locked / "out.json", locked / "sub" / "out.json"):
        r = _run(prefix, "verify", dataset, "--out-json", target)
        assert_message(r.returncode, r.stdout + r.stderr, f"--out-json {target} cannot be written",
                       f"permission denied on {locked}", f"chmod u+rwx {locked}")
    r = _run(prefix, "verify", dataset, "--out-json", ro / "out.json")
    assert_message(r.returncode, r.stdout + r.stderr, f"--out-json {ro / 'out.json'} cannot be written",
                   f"Permission denied in {ro}", f"chmod u+w {ro}")
    assert r.stdout == "", r.stdout  # refused before the run: no check was printed
    assert list(ro.iterdir()) == []


def test_decode_out_in_a_folder_this_user_cannot_open(tmp_path, locked_and_read_only):
    prefix = _without_root_override()
    locked, ro = locked_and_read_only
    build = hand_build(tmp_path / "b")
    r = _run(prefix, "decode", build, "--out", locked / "dec", "--device", "cpu")
    assert_message(r.returncode, r.stdout + r.stderr, f"--out {locked / 'dec'} cannot be written",
                   f"permission denied on {locked}")
    r = _run(prefix, "decode", build, "--out", ro / "dec", "--device", "cpu")
    assert_message(r.returncode, r.stdout + r.stderr, f"--out {ro / 'dec'} cannot be written",
                   f"Permission denied in {ro}")
    assert list(ro.iterdir()) == []
