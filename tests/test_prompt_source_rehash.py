"""A re-run's check of its sources hashes again only the prompt-dataset shards modified since the plan began
(00227fd listed the sha256 of every ``txt_emb.pth`` / ``latent.pth`` on each listing: a finished distill re-run
to be told "nothing to do" read every embedding again, terabytes for a large T5 prompt set). A plan still hashes
every member; a shard rewritten after the plan is hashed and compared."""

from __future__ import annotations

import os
import time

import shardsmith.sources.wds as wds_mod
from shardsmith.recipe import recipe_from_dict
from shardsmith.sources.base import open_sources
from test_distill_rebuilt_prompt_source import _prompt_wds


def _listed(folder, hash_after, monkeypatch) -> tuple[int, list]:
    calls = []
    real = wds_mod._sha256_of
    monkeypatch.setattr(wds_mod, "_sha256_of", lambda *a: calls.append(a[2]) or real(*a))
    [(_, items)] = open_sources(recipe_from_dict({"sources": [{"path": str(folder), "kind": "wds"}],
                                                  "outputs": [{"format": "wds"}]}))
    items.__self__.hash_after = hash_after
    got = list(items())
    return len(calls), got


def test_only_shards_modified_since_the_plan_are_hashed_again(tmp_path, monkeypatch):
    folder = _prompt_wds(tmp_path / "pw")  # 12 prompts, 3 a shard
    n, planned = _listed(folder, None, monkeypatch)  # as a plan lists them
    assert n == 12 and all(wds_mod.SHA256 in it.meta["wds"] for it in planned)
    began = time.time() + 1
    n, _ = _listed(folder, began, monkeypatch)  # nothing modified since: nothing hashed
    assert n == 0
    shard = folder / "00001.tar"
    os.utime(shard, (began + 5, began + 5))  # rewritten after the plan began
    n, again = _listed(folder, began, monkeypatch)
    assert n == 3 and [it.item_id for it in again if wds_mod.SHA256 in it.meta["wds"]] == \
        [it.item_id for it in planned if it.meta["wds"]["shard"] == "00001.tar"]
