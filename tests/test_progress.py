"""Progress bars with totals (issue 16): the build's plan task shows n/N from the listed items, model
loading is a spinner naming what loads and where, verify counts the samples the ranks read, and
nothing is drawn when stderr is not a terminal or with quiet."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.progress import Progress
from shardsmith.recipe import recipe_from_dict


def _terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=140)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress") / "photos"
    real_photos(root, 9, seed=1, min_side=64, max_side=96)
    return root


@pytest.fixture(scope="module")
def built(photos, tmp_path_factory):
    console = _terminal()
    out = tmp_path_factory.mktemp("progress_out") / "out"
    build(recipe_from_dict({"sources": [{"path": str(photos)}],
                            "outputs": [{"format": "wds", "samples_per_shard": 3}]}), out, console=console, workers=1)
    return out, console


def test_the_build_plan_task_has_the_listed_total(built):
    _, console = built
    text = console.file.getvalue()
    last_plan_row = [r for r in text.split("\r") if "plan" in r][-1]
    assert "9/9" in last_plan_row and "100%" in last_plan_row


def test_no_bars_when_stderr_is_not_a_terminal_or_quiet():
    plain = Console(file=io.StringIO(), force_terminal=False)
    p = Progress(console=plain)
    assert not p.bars
    with p.task("work", total=3) as tick:
        tick()
        tick()
    p.say("a message")
    assert plain.file.getvalue() == "a message\n"
    assert p.history == [{"label": "work", "total": 3, "completed": 2, "spin": False}]
    q = Progress(quiet=True, console=_terminal())
    with q.spin("loading"):
        pass
    assert q.console.file.getvalue() == "" and q.history == []


def test_a_spinner_shows_what_loads_and_the_time():
    console = _terminal()
    p = Progress(console=console)
    with p.spin("load models: vae ltx on cpu"):
        pass
    assert "load models: vae ltx on cpu" in console.file.getvalue() and "0:00:0" in console.file.getvalue()
    assert p.history[0]["spin"] is True


def test_verify_counts_every_sample_the_ranks_read(built):
    from shardsmith.verify.runner import verify

    out, _ = built
    console = _terminal()
    p = Progress(console=console)
    rep = verify(out / "wds", world=2, workers=1, batch_size=2, progress=p)
    assert rep["ok"], rep
    (task,) = [h for h in p.history if h["label"].startswith("verify")]
    assert task["total"] == task["completed"] == 9
    assert "9/9" in console.file.getvalue()


def test_repair_shows_a_bar_over_the_shards_it_scans(built):
    from shardsmith.verify.repair import repair_wds

    out, _ = built
    console = _terminal()
    p = Progress(console=console)
    rep = repair_wds(out / "wds", dry_run=True, progress=p)
    assert not rep["errors"]
    (task,) = [h for h in p.history if h["label"].startswith("scan shards")]
    assert task["total"] == task["completed"] == 3  # 9 photos, 3 per shard
    assert "3/3" in console.file.getvalue()


def test_inspecting_a_precomputed_tree_for_register_shows_a_bar_over_its_files(tmp_path):
    import torch

    from shardsmith.verify.precomputed_inspect import inspect_precomputed

    tree = tmp_path / ".precomputed"
    for d in ("latents", "conditions"):
        (tree / d).mkdir(parents=True)
        for i in range(3):
            rec = {"latents": torch.zeros(4, 1, 2, 2)} if d == "latents" else \
                {"video_prompt_embeds": torch.zeros(5, 8), "prompt_attention_mask": torch.ones(5, dtype=torch.int64)}
            torch.save(rec, tree / d / f"c{i}.pt")
    console = _terminal()
    p = Progress(console=console)
    rep = inspect_precomputed(tree, progress=p)
    assert rep["samples"] == 3
    (task,) = p.history
    assert task["total"] == task["completed"] == 6 and "6/6" in console.file.getvalue()
