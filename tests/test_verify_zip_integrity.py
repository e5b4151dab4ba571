"""verify compares the EDM ZIP a shardsmith build wrote with the sha256 its manifest records (check
``integrity``): two images relabelled in ``dataset.json`` used to pass every check (exit 0). And the negative
prompt's embedding a latent output holds beside its shards (``neg_prompt_emb.npy``, the manifest's
``neg_prompt_emb``) is checked (check ``neg_prompt``): gone, or changed against the sha256 a manifest records,
it fails; where no sha256 is recorded, a note says it was not compared."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import shardsmith
from media_factory import real_photos
from tests.test_cli_mistakes import invoke
from tests.test_verify_bucket_integrity import built, copy  # noqa: F401 - fixtures: a latent_wds output in buckets
from tests.test_verify_integrity_sha import check


@pytest.fixture(scope="module")
def zbuilt(tmp_path_factory) -> Path:
    """A finished build of a labelled EDM ZIP: 4 photos in two class folders."""
    base = tmp_path_factory.mktemp("zip_integrity")
    for i, cls in enumerate(("cat", "dog")):
        real_photos(base / "src" / cls, 2, seed=i, min_side=60, max_side=120)
    shardsmith.build({"sources": [{"path": str(base / "src")}],
                      "outputs": [{"format": "zip", "resolution": 32, "upscale": True}]}, base / "out", quiet=True)
    return base / "out"


def _relabel(src: Path, dst: Path) -> None:
    """Write ``dst``: the ZIP ``src`` with the labels of its first two images exchanged in dataset.json."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for n in zi.namelist():
            d = zi.read(n)
            if n == "dataset.json":
                j = json.loads(d)
                (a, la), (b, lb) = j["labels"][0], j["labels"][-1]
                assert la != lb
                j["labels"][0][1], j["labels"][-1][1] = lb, la
                d = json.dumps(j).encode()
            zo.writestr(n, d)


def test_a_relabelled_zip_fails_integrity(zbuilt, tmp_path):
    rep = shardsmith.verify(zbuilt / "dataset.zip", world=1, workers=0).report
    assert rep["ok"] and check(rep, "integrity")["ok"], rep["checks"]
    import shutil

    shutil.copytree(zbuilt, tmp_path / "b")
    z = tmp_path / "b" / "dataset.zip"
    _relabel(zbuilt / "dataset.zip", z)
    rep = shardsmith.verify(z, world=1, workers=0).report
    integ = check(rep, "integrity")
    assert not rep["ok"] and not integ["ok"], rep["checks"]
    assert "dataset.zip does not hash to the sha256 the build recorded" in integ["detail"]
    assert "--overwrite" in integ["detail"], integ
    code, out = invoke("verify", z, "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] integrity" in out and "Traceback" not in out, out


@pytest.mark.slow
def test_a_lost_negative_prompt_fails(copy):  # noqa: F811
    lat = copy / "lat"
    (lat / "neg_prompt_emb.npy").unlink()
    rep = shardsmith.verify(lat, world=1, workers=0).report
    neg = check(rep, "neg_prompt")
    assert not rep["ok"] and not neg["ok"] and "neg_prompt_emb.npy" in neg["detail"] and "is gone" in neg["detail"]
    code, out = invoke("inspect", lat)
    assert code == 1 and "neg_prompt: neg_prompt_emb.npy" in out and "Traceback" not in out, out


@pytest.mark.slow
def test_a_changed_negative_prompt_fails_where_its_sha256_is_recorded(copy):  # noqa: F811
    lat = copy / "lat"
    npy = lat / "neg_prompt_emb.npy"
    m = json.loads((copy / "manifest.json").read_text())
    files = m["outputs"]["latent_wds"]["files"]["train"]
    # the build records the sha256 of the file it wrote (outputs.NAME.files.SPLIT.neg_prompt_emb_sha256)
    assert files["neg_prompt_emb_sha256"] == hashlib.sha256(npy.read_bytes()).hexdigest()
    assert check(shardsmith.verify(lat, world=1, workers=0).report, "neg_prompt")["ok"]
    a = np.load(npy)
    np.save(npy, (np.random.default_rng(0).standard_normal(a.shape) * 100).astype(a.dtype))  # same shape
    rep = shardsmith.verify(lat, world=1, workers=0).report
    neg = check(rep, "neg_prompt")
    assert not rep["ok"] and not neg["ok"] and "does not hash to the sha256 the build recorded" in neg["detail"]
    # a manifest of a build made before it recorded one: said, not a failure
    del files["neg_prompt_emb_sha256"]
    (copy / "manifest.json").write_text(json.dumps(m))
    rep = shardsmith.verify(lat, world=1, workers=0).report
    assert not [c for c in rep["checks"] if c["name"] == "neg_prompt"]
    assert any("neg_prompt_emb.npy not compared" in n for n in rep["notes"]), rep["notes"]
