"""A source file with a long but legal name (up to 255 bytes) builds into a ``.precomputed/`` tree.

Before: a 250-byte ``<name>.jpg`` mirrored to a 249-byte ``<name>.pt``, but the atomic write's temporary
``<name>.pt.tmp-<pid>`` was over NAME_MAX: ``OSError: [Errno 36] File name too long`` from atomic.py, exit 1, on every
resume (the build could never finish, its short-named items never written either). And two 251-byte-stem files
(``X.jpg``, ``X.png``) gave the second the digest name ``<stem>_<8 hex>.pt``, itself 263 bytes: the same traceback.

Now the temporary name falls back to a short hidden ``.<16 hex><suffix>.tmp-<pid>`` where the long one would not fit
(only the final name's length counts), and a digest name over 255 bytes has its stem cut, at a character, to fit.
"""

from __future__ import annotations

import os

import pytest

from shardsmith import formats
from shardsmith import atomic
from shardsmith.atomic import TMP_MARK, atomic_write_bytes, remove_stale_tmp
from shardsmith.build import build
from test_build import tree_bytes
from test_partner_integrity import _photo, _pt_names, _same_stem_recipe

LONG = "N" * 246 + ".pt"  # 249 bytes: legal; with ".tmp-<pid>" over 255


def test_a_long_final_name_is_written_through_a_short_temporary_name(tmp_path):
    atomic_write_bytes(tmp_path / "d" / LONG, b"payload")
    assert (tmp_path / "d" / LONG).read_bytes() == b"payload"
    assert os.listdir(tmp_path / "d") == [LONG]  # no temporary left


def test_temporary_names(tmp_path):
    assert atomic.tmp_path(tmp_path / "00003.tar") == tmp_path / f"00003.tar{TMP_MARK}{os.getpid()}"  # as before
    t = atomic.tmp_path(tmp_path / LONG)
    assert t.parent == tmp_path and t.name.startswith(".") and t.name.endswith(f".pt{TMP_MARK}{os.getpid()}")
    assert len(t.name) == 1 + 16 + 3 + len(TMP_MARK) + len(str(os.getpid()))
    t.write_bytes(b"left by a killed run")
    assert remove_stale_tmp(tmp_path) == [t]  # a leftover is still found by its mark


def test_a_digest_name_over_255_bytes_is_cut_to_fit():
    stem = "X" * 251
    rel = formats.precomputed.sample_rel(f"{stem}.png", None, key="other", item_id="src/" + stem + ".png",
                                         key_source=None)
    digest = formats.unique_key("", "src/" + stem + ".png")
    assert rel == "X" * (255 - 12) + f"{digest}.pt" and len(rel.encode()) == 255
    # a multi-byte name is cut at a character, never inside one
    wide = "é" * 125  # 250 bytes; "é" * 125 + ".jpg" is a legal 254-byte name
    rel = formats.precomputed.sample_rel(f"sub/{wide}.jpg", None, key="other", item_id="src/sub/w.jpg",
                                         key_source=None)
    name = rel.split("/")[-1]
    assert rel.startswith("sub/") and len(name.encode()) <= 255
    assert name == "é" * 121 + formats.unique_key("", "src/sub/w.jpg") + ".pt"
    # a name that fits is the mirrored one, as before
    assert formats.precomputed.sample_rel("a/x.jpg", None, key="a_x", item_id="src/a/x.jpg",
                                          key_source=None) == "a/x.pt"


@pytest.mark.slow
def test_a_precomputed_build_of_long_names_finishes_and_resumes_to_the_same_bytes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _photo("astronaut").save(src / ("N" * 246 + ".jpg"), quality=95)  # 250 bytes
    _photo("rocket").save(src / ("X" * 251 + ".jpg"), quality=95)  # 255 bytes
    _photo("coffee").save(src / ("X" * 251 + ".png"))  # 255 bytes: takes the digest name
    _photo("chelsea").save(src / "ok.jpg", quality=95)
    m = build(_same_stem_recipe(src), tmp_path / "o", quiet=True)
    assert m["counts"]["written"] == m["counts"]["inputs"] == 4
    tree = tmp_path / "o" / ".precomputed"
    want = sorted(["N" * 246 + ".pt", "X" * 251 + ".pt", "ok.pt",
                   "X" * 243 + formats.unique_key("", "src/" + "X" * 251 + ".png") + ".pt"])
    assert _pt_names(tree, "latents") == _pt_names(tree, "conditions") == want
    assert not [p for p in tree.rglob("*") if TMP_MARK in p.name]
    before = tree_bytes(tree)
    build(_same_stem_recipe(src), tmp_path / "o", quiet=True)  # a resume: nothing left to do, nothing changed
    assert tree_bytes(tree) == before
