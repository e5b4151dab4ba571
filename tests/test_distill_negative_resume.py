"""A ``distill.text: source`` distill takes the source folder's ``neg_prompt_emb.npy`` for guidance. Before, a
distill interrupted, its source rebuilt with another negative prompt, then resumed: exit 0 without a word, the
shards written before the interruption sampled with the old negative and the rest with the new one (verify OK), and
``index.json`` said ``negative_prompt: ''``. Now the resume is refused (exit 2) naming the file and ``--overwrite``,
a finished build re-run warns that the file changed, and ``index.json`` records the embedding used (file, sha256).

The source is a hand-made prompt_wds folder (no text model); the teacher is the exact Gaussian one, made to stop
at the last shard's batch to leave an interrupted build behind (deterministic, no signal timing)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from shardsmith.distill import gaussian
from test_build import tree_bytes
from test_cli_mistakes import assert_message, invoke

N, PER_SHARD, L, D = 32, 4, 3, 8  # 8 shards: the ones before the last are committed when it stops
STOP = {"armed": False}
SENTINEL = 7.0  # the last prompt's embedding: the teacher stops at its batch while armed


def velocity_or_stop(x, t, cond):
    """:func:`shardsmith.distill.gaussian.velocity`, which fails on the last prompt's batch while armed."""
    if STOP["armed"] and bool((cond == SENTINEL).all(dim=tuple(range(1, cond.dim()))).any()):
        raise RuntimeError("stopped for the test (an interrupted distill)")
    return gaussian.velocity(x, t, cond)


def _pth(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _prompt_wds(folder: Path, negative: float) -> Path:
    """A prompt_wds folder: N samples (txt, txt_emb.pth), PER_SHARD a shard, and neg_prompt_emb.npy."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(N // PER_SHARD):
        with tarfile.open(folder / f"{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                value = SENTINEL if i == N - 1 else 0.1 * (i + 1)
                _add(tar, f"{i:06d}.txt", f"prompt number {i}".encode())
                _add(tar, f"{i:06d}.txt_emb.pth", _pth(torch.full((L, D), value, dtype=torch.float32)))
    (folder / "shard_count.json").write_text(json.dumps({f"{s:05d}.tar": PER_SHARD for s in range(N // PER_SHARD)}))
    _negative(folder, negative)
    return folder


def _negative(folder: Path, value: float) -> None:
    buf = io.BytesIO()
    np.save(buf, np.full((L, D), value, dtype=np.float32), allow_pickle=False)
    (folder / "neg_prompt_emb.npy").write_bytes(buf.getvalue())


def _recipe(tmp: Path, source: Path) -> Path:
    path = tmp / "kd.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"path": str(source), "kind": "wds"}], "split": {"holdout": 0},
        "models": {"teacher": {"family": "callable", "entry_point": "test_distill_negative_resume:velocity_or_stop",
                               "parameterisation": "flow"}, "device": "cpu", "batch_size": PER_SHARD},
        "distill": {"shape": [2, 4, 4], "steps": 8, "solver": "euler", "text": "source", "guidance": 2.0},
        "outputs": [{"format": "kd_wds", "samples_per_shard": PER_SHARD}]}))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def committed(out: Path) -> int:
    """Samples in the units the ledger of ``out`` has committed."""
    from shardsmith.plan.ledger import Ledger

    led = Ledger(out / ".shardsmith" / "ledger.sqlite")
    try:
        return led.db.execute("SELECT COALESCE(SUM(count), 0) FROM shards").fetchone()[0]
    finally:
        led.close()


def _shards(kd: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(kd.glob("*.tar"))}


@pytest.mark.slow
def test_a_resume_whose_source_negative_changed_is_refused_and_never_mixes_two_negatives(tmp_path):
    source = _prompt_wds(tmp_path / "pw", negative=-0.5)
    recipe, out = _recipe(tmp_path, source), tmp_path / "out"
    STOP["armed"] = True
    try:
        code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "-q", "--no-report")
    finally:
        STOP["armed"] = False
    assert code != 0, output
    assert committed(out), "the interrupted distill committed no shard before it stopped"
    written = _shards(out / "kd")
    assert len(written) < N // PER_SHARD

    _negative(source, 0.75)  # the source rebuilt with another negative prompt
    code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "-q", "--no-report")
    assert_message(code, output, str(source / "neg_prompt_emb.npy"), "changed since this distill began",
                   f"the {committed(out)} sample(s) written so far", "--overwrite")
    assert _shards(out / "kd") == written  # nothing sampled with the new negative beside the old samples

    code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "-q", "--no-report", "--overwrite")
    assert code == 0, output
    fresh = tmp_path / "fresh"  # an uninterrupted run with the new negative: the same bytes
    code, output = invoke("distill", recipe, "--out", fresh, "--workers", "1", "-q", "--no-report")
    assert code == 0, output
    assert _shards(out / "kd") == _shards(fresh / "kd") and len(_shards(fresh / "kd")) == N // PER_SHARD
    index = json.loads((out / "kd" / "index.json").read_text())
    assert index["negative"] == {"origin": "source", "file": str((source / "neg_prompt_emb.npy").resolve()),
                                 "sha256": _sha(source / "neg_prompt_emb.npy")}
    assert index["negative_prompt"] is None  # not '': guidance took the source's embedding, named in negative


@pytest.mark.slow
def test_a_finished_distill_rerun_after_its_source_negative_changed_warns_and_keeps_the_build(tmp_path):
    source = _prompt_wds(tmp_path / "pw", negative=-0.5)
    recipe, out = _recipe(tmp_path, source), tmp_path / "out"
    code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "-q", "--no-report")
    assert code == 0, output
    old_sha = _sha(source / "neg_prompt_emb.npy")
    assert json.loads((out / "kd" / "index.json").read_text())["negative"]["sha256"] == old_sha
    before = tree_bytes(out)
    _negative(source, 0.75)
    code, output = invoke("distill", recipe, "--out", out, "--workers", "1", "--no-report")
    assert code == 0, output
    assert "sources changed since this build was planned" in output and "neg_prompt_emb.npy changed" in output
    assert "--overwrite" in output
    assert tree_bytes(out) == before
