"""A ``shardsmith distill`` whose prompts come from a prompt_wds folder reads each prompt's ``txt_emb.pth`` at the
(shard, offset) its plan recorded. Before, when that folder was rebuilt between a stopped distill and its resume
(``shardsmith build ... --overwrite`` with another samples_per_shard, its samples in another order, or embeddings
of another encoding), the resume read the planned offsets of the new files: another sample's embedding, sampled and
written under the planned prompt without a word (for samples that kept their key, not even the "sources changed"
warning). Now the plan lists the sha256 of each member it will read, a resume reads a position only while it holds
those bytes (else ``failed:changed_since_plan``, or ``failed:vanished`` for a shard gone, as changed media fail), and
the sources-changed warning names those prompts.

The source is a hand-made prompt_wds folder (no text model: each prompt's embedding is a constant tensor of its
own value); the teacher is the exact Gaussian one; the first run stops at a full disk on its third shard."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from shardsmith.plan.ledger import Ledger
from test_cli_mistakes import invoke
from test_distill_negative_resume import _add, _pth

N, L, D = 12, 3, 8
WARNING = "the sources changed since this build was planned"


def _value(i: int, encoding: int = 0) -> float:
    return 0.1 * (i + 1) + 10.0 * encoding


def _prompt_wds(folder: Path, per_shard: int = 3, reverse: bool = False, encoding: int = 0) -> Path:
    """A prompt_wds folder of the N prompts (``txt``, ``txt_emb.pth``), ``per_shard`` a shard, written (again) in
    place as ``build --overwrite`` does; ``reverse``: each shard's samples in reverse order; ``encoding``: other
    embedding values (another text encoder) of the same size."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.tar"):
        old.unlink()
    counts = {}
    for s, first in enumerate(range(0, N, per_shard)):
        name = f"{s:05d}.tar"
        keys = list(range(first, min(first + per_shard, N)))
        with tarfile.open(folder / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in reversed(keys) if reverse else keys:
                _add(tar, f"{i:06d}.txt", f"prompt number {i}".encode())
                _add(tar, f"{i:06d}.txt_emb.pth", _pth(torch.full((L, D), _value(i, encoding), dtype=torch.float32)))
        counts[name] = len(keys)
    (folder / "shard_count.json").write_text(json.dumps(counts))
    buf = io.BytesIO()
    np.save(buf, np.full((L, D), -0.5, dtype=np.float32), allow_pickle=False)
    (folder / "neg_prompt_emb.npy").write_bytes(buf.getvalue())
    return folder


def _recipe(tmp: Path, source: Path) -> Path:
    path = tmp / "kd.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"path": str(source), "kind": "wds"}], "split": {"holdout": 0},
        "models": {"teacher": {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity",
                               "parameterisation": "flow"}, "device": "cpu", "batch_size": 3},
        "distill": {"shape": [2, 4, 4], "steps": 4, "solver": "euler", "text": "source", "guidance": 2.0},
        "outputs": [{"format": "kd_wds", "samples_per_shard": 3}]}))
    return path


def _samples(kd: Path) -> dict[str, dict[str, bytes]]:
    """key -> {member suffix: bytes} of every sample of every shard in ``kd``."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(kd.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, _, suffix = m.name.partition(".")
                out.setdefault(key, {})[suffix] = tar.extractfile(m).read()
    return out


def _distill(recipe: Path, out: Path) -> tuple[int, str]:
    return invoke("distill", recipe, "--out", out, "--workers", "1", "--no-report")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """An uninterrupted distill of the original prompts: the bytes of every sample the plan meant."""
    tmp = tmp_path_factory.mktemp("reference")
    source = _prompt_wds(tmp / "pw")
    code, output = _distill(_recipe(tmp, source), tmp / "out")
    assert code == 0, output
    samples = _samples(tmp / "out" / "kd")
    assert len(samples) == N
    return samples


REBUILDS = {
    "4_per_shard": dict(per_shard=4),  # samples moved between shards (their ids gone, new ones listed)
    "reordered": dict(reverse=True),  # the same ids and prompts, at other offsets in the same shards
    "reencoded": dict(encoding=1),  # the same positions, the embeddings of another encoding
}


@pytest.mark.slow
@pytest.mark.parametrize("rebuild", list(REBUILDS))
def test_a_resume_after_the_prompt_dataset_was_rebuilt_never_samples_another_embedding(
        tmp_path, disk_full_at, reference, rebuild, monkeypatch):
    from shardsmith.safety import source_changes

    monkeypatch.setattr(source_changes, "EXAMPLES", 2 * N)  # the warning names every item, not the first three
    source = _prompt_wds(tmp_path / "pw")
    recipe, out = _recipe(tmp_path, source), tmp_path / "out"
    disk_full_at(2)  # the third shard cannot be written: the distill stops after the first two
    code, output = _distill(recipe, out)
    assert code != 0, output
    disk_full_at(None)

    _prompt_wds(source, **REBUILDS[rebuild])  # rebuilt with --overwrite between the stop and the resume
    code, output = _distill(recipe, out)
    assert code == 0, output  # as a build resumed after its media changed: it goes on with the plan

    # every sample written is the planned prompt with its planned embedding: the bytes of the uninterrupted run
    samples = _samples(out / "kd")
    assert samples, "the stopped distill wrote nothing"
    for key, members in samples.items():
        i = int(re.fullmatch(r"prompt number (\d+)", members["txt"].decode()).group(1))
        emb = torch.load(io.BytesIO(members["txt_emb.pth"]), weights_only=True)
        assert torch.equal(emb, torch.full((L, D), _value(i))), f"{key} (prompt {i}) holds another embedding"
        assert members == reference[key], f"{key} (prompt {i}) is not the sample the plan meant"

    # and the user is told: the prompts it could not read as planned failed, and the warning names them
    led = Ledger(out / ".shardsmith" / "ledger.sqlite")
    try:
        rows = {item_id: (status, detail) for _, item_id, status, detail in led.status_rows("kd_wds")}
    finally:
        led.close()
    assert len(rows) == N
    failed = {i: s for i, s in rows.items() if s[0] != "written"}
    assert failed, rows  # the rebuild moved or changed what the unsampled prompts' plan points at
    for item_id, (status, detail) in failed.items():
        assert status in ("failed:changed_since_plan", "failed:vanished"), (item_id, status, detail)
        assert "--overwrite" in detail and item_id in detail, detail
    warning = next((line for line in output.splitlines() if WARNING in line), None)
    assert warning is not None, output
    named = set(re.findall(r"pw/\d{5}\.tar/\d{6}", warning.split("; ")[0]))
    assert set(failed) <= named, (sorted(failed), warning)  # each one failed is a changed (or gone) item there
