"""What ``--overwrite`` says when it resumes a rebuild an earlier, killed ``--overwrite`` began beside the
build: that rebuild keeps the plan it made, so the sources-changed warning names its folder and says to
remove it to plan again (it said "pass --overwrite", which the user had passed); and the advice works. The
files a replaced build carries into its successor are named ten at a time (a repair's quarantine may hold
thousands)."""

from __future__ import annotations

import shutil
import sqlite3

from media_factory import real_photos
from shardsmith.build import _say_carried, build
from shardsmith.progress import Progress
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety import swap


def _recipe(src):
    return recipe_from_dict({"sources": [{"path": str(src)}], "split": {"holdout": 0},
                             "outputs": [{"format": "wds", "dir": "wds"}]})


def test_an_overwrite_resuming_an_earlier_rebuild_says_how_to_plan_again(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    paths = real_photos(src, 3, seed=4, min_side=40, max_side=70)
    build(_recipe(src), out, quiet=True, workers=1)
    sibling = swap.next_sibling(out)
    shutil.copytree(out, sibling)  # a rebuild an earlier --overwrite began there, killed before it completed
    (sibling / "manifest.json").unlink()
    db = sqlite3.connect(sibling / ".shardsmith" / "ledger.sqlite")
    db.execute("DELETE FROM meta WHERE key='complete'")
    db.commit()
    db.close()
    shutil.copy(real_photos(tmp_path / "other", 1, seed=99, min_side=50, max_side=60)[0], paths[1])  # changed since
    capsys.readouterr()

    build(_recipe(src), out, quiet=True, workers=1, overwrite=True)
    said = capsys.readouterr().err
    assert "the sources changed since this build was planned: 1 changed" in said, said
    assert f"this --overwrite resumes the rebuild an earlier --overwrite began in {sibling}" in said, said
    assert f"remove {sibling} and re-run with --overwrite" in said and "pass --overwrite to start" not in said, said

    shutil.copytree(out, sibling)  # the same again, and this time the advice followed
    (sibling / "manifest.json").unlink()
    db = sqlite3.connect(sibling / ".shardsmith" / "ledger.sqlite")
    db.execute("DELETE FROM meta WHERE key='complete'")
    db.commit()
    db.close()
    shutil.rmtree(sibling)
    capsys.readouterr()
    m = build(_recipe(src), out, quiet=True, workers=1, overwrite=True)
    assert "sources changed" not in capsys.readouterr().err
    assert m["counts"]["written"] == 3 and m["counts"]["failed"] == {}


def test_the_carried_files_are_named_ten_at_a_time(capsys):
    carried = [f".shardsmith/quarantine/t/{i:04d}.pt" for i in range(25)]
    _say_carried(Progress(quiet=False), carried)
    said = capsys.readouterr()
    text = said.out + said.err
    assert "kept 25 file(s) of yours" in text and ".shardsmith/quarantine/t/0009.pt" in text, text
    assert ".shardsmith/quarantine/t/0010.pt" not in text and "and 15 more" in text, text
