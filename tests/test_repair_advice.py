"""``repair --from-source`` of a ``.precomputed/`` tree gives advice that is true.

Before: "repair it without --from-source, then resume the build to re-encode what was moved". A finished
build re-run as it was is "complete; nothing to do": no resume re-encodes the files the repair moved. What
puts them back is the build's command again with ``--overwrite`` (the tree is rebuilt from the sources beside
the old one and swapped in), which the message now says, naming the build folder; for a tree no shardsmith
build holds, the tool that wrote it. The end-to-end test proves the advice on a real build.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from test_cli_mistakes import assert_message, invoke, run


def _tree(root: Path) -> Path:
    """A small ``.precomputed/`` tree (one sample) under ``root``."""
    pre = root / ".precomputed"
    for d in ("latents", "conditions"):
        (pre / d).mkdir(parents=True)
    torch.save({"latents": torch.zeros(4, 1, 8, 8), "num_frames": 1, "height": 8, "width": 8, "fps": 1.0},
               pre / "latents" / "a.pt")
    torch.save({"video_prompt_embeds": torch.zeros(4, 8), "prompt_attention_mask": torch.ones(4, dtype=torch.int64)},
               pre / "conditions" / "a.pt")
    return pre


def test_from_source_on_a_build_tree_says_rebuild_with_overwrite_not_resume(tmp_path):
    root = tmp_path / "out"
    pre = _tree(root)
    (root / "manifest.json").write_text(json.dumps({"outputs": {}}))
    code, said = invoke("repair", pre, "--from-source")
    assert_message(code, said, "--from-source rebuilds WebDataset shards", f"shardsmith repair {pre} without it",
                   f"--out {root.resolve()} --overwrite", "Without --overwrite the re-run finds the build complete")
    assert "resume" not in said and "re-encode" not in said, said
    assert sorted(p.name for p in (pre / "latents").iterdir()) == ["a.pt"]  # nothing moved


def test_from_source_on_a_tree_of_no_build_says_the_tool_that_wrote_it(tmp_path):
    pre = _tree(tmp_path / "lone")
    code, said = invoke("repair", pre, "--from-source")
    assert_message(code, said, "--from-source rebuilds WebDataset shards", "with the tool that wrote the tree")
    assert "--overwrite" not in said and "resume" not in said, said


@pytest.mark.slow
def test_the_advice_is_true_overwrite_puts_the_moved_files_back_and_a_plain_rerun_does_not(tmp_path):
    from media_factory import real_photos

    real_photos(tmp_path / "src", 3, seed=5, min_side=40, max_side=90)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "sources": [{"path": str(tmp_path / "src")}], "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu"},
        "outputs": [{"format": "precomputed", "latent_dtype": "float32"}]}))
    out = tmp_path / "out"
    r = run("build", tmp_path / "r.yaml", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    pre = out / ".precomputed"
    built = {p.relative_to(pre).as_posix(): p.read_bytes() for p in sorted(pre.rglob("*.pt"))}
    victim = sorted((pre / "latents").glob("*.pt"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated: repair moves it and its condition away

    r = run("repair", pre, "--from-source")
    assert r.returncode == 2 and "--overwrite" in r.stderr, r.stderr
    r = run("repair", pre)
    assert r.returncode == 0, r.stdout + r.stderr
    moved = set(built) - {p.relative_to(pre).as_posix() for p in pre.rglob("*.pt")}
    assert moved == {f"latents/{victim.name}", f"conditions/{victim.name}"}

    r = run("build", tmp_path / "r.yaml", "--out", out, "-q")  # what "resume" would do: nothing
    assert r.returncode == 0, r.stderr
    assert not (pre / "latents" / victim.name).exists()

    quarantine = out / ".shardsmith" / "quarantine"
    kept = {p.relative_to(quarantine).as_posix(): p.read_bytes() for p in sorted(quarantine.rglob("*")) if p.is_file()}
    assert sum(k.endswith(".pt") for k in kept) == 2 and built[f"latents/{victim.name}"][:100] in kept.values()
    r = run("build", tmp_path / "r.yaml", "--out", out, "--overwrite", "-q")  # what the message says
    assert r.returncode == 0, r.stderr
    assert {p.relative_to(pre).as_posix(): p.read_bytes() for p in sorted(pre.rglob("*.pt"))} == built
    # the files repair moved are the user's: carried into the rebuilt folder, byte for byte (were deleted)
    assert {p.relative_to(quarantine).as_posix(): p.read_bytes() for p in sorted(quarantine.rglob("*"))
            if p.is_file()} == kept
