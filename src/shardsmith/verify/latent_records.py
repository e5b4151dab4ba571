"""Read back the cached latents of one split of a latent output, as ``decode`` needs them.

``latent_records(root, output, split, folder, member)`` yields ``(sample path, latents, facts, key)`` in
the output's order: from a ``.precomputed/`` tree, every ``.pt`` of ``folder`` (path order, by component)
with its dict as ``facts`` and ``key`` None (the path is the planned item's own: ``sample_rel``); from
``latent_wds`` shards, every sample holding ``member`` (only its ``json`` and that member are read, one
sample at a time) with its json as ``facts`` and its sample key as ``key``, the sample path being the
media path with ``.pt``. That path is not unique (``x.jpg`` and ``x.png`` both give ``x.pt``): what is
exact is the item id the json records (``facts["id"]``) and the sample key, both the ledger's.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import torch

from shardsmith.formats import wds as wds_layout
from shardsmith.formats.precomputed import CACHE_EXT
from shardsmith.loaders.shard_reader import read_member, shard_samples


def latent_records(root: Path, output: dict[str, Any], split: str, folder: str,
                   member: str) -> Iterator[tuple[str, torch.Tensor, dict[str, Any], str | None]]:
    files = output["files"][split]
    base = root / files["dir"]
    if output["format"] == "precomputed":
        for p in sorted((base / folder).rglob(f"*{CACHE_EXT}")):
            d = torch.load(p, map_location="cpu", weights_only=True)
            yield p.relative_to(base / folder).as_posix(), d["latents"], d, None
        return
    for shard in files["shards"]:
        path = base / shard["name"]
        fd = os.open(path, os.O_RDONLY)
        try:
            for key, refs in shard_samples(path, fd):
                if member not in refs:
                    continue
                meta = json.loads(read_member(fd, refs[wds_layout.JSON], str(path)))
                z = torch.load(io.BytesIO(read_member(fd, refs[member], str(path))), map_location="cpu",
                               weights_only=True)
                yield PurePosixPath(meta["path"]).with_suffix(CACHE_EXT).as_posix(), z, meta, key
        finally:
            os.close(fd)
