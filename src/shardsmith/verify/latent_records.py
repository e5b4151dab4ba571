"""Read back the cached latents of one split of a latent output, as ``decode`` needs them.

``latent_records(root, output, split, folder, member)`` yields ``(sample path, latents, facts, key)`` in
the output's order: from a ``.precomputed/`` tree, every ``.pt`` of ``folder`` (path order, by component)
with its dict as ``facts`` and ``key`` None (the path is the planned item's own: ``sample_rel``); from
``latent_wds`` shards, every sample holding ``member`` (only its ``json`` and that member are read, one
sample at a time) with its json as ``facts`` and its sample key as ``key``, the sample path being the
media path with ``.pt``. That path is not unique (``x.jpg`` and ``x.png`` both give ``x.pt``): what is
exact is the item id the json records (``facts["id"]``) and the sample key, both the ledger's.

A record that cannot be read is a damaged record, never an exception: a ``.pt`` of the tree that does not load
(``torch.load(weights_only=True)``) or holds no ``latents`` tensor; a sample whose ``json`` member is missing,
is not valid JSON (or is nested too deep to read: :func:`~shardsmith.atomic.loads_json`), is not an object
or records no media ``path``; a ``member`` that does not load as a tensor; a record whose ``facts`` lack one
of the numbers ``numbers`` names (``decode``: ``fps``). It is skipped and appended to
``damaged`` as ``{"file": the shard or .pt, "member": the member's name in its shard (None for a .pt),
"error": what is wrong}``; without a ``damaged`` list, :class:`DamagedRecord` (a user error naming the file
and member) is raised instead.
"""

from __future__ import annotations

import io
import math
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import torch

from shardsmith.atomic import loads_json
from shardsmith.errors import UserError
from shardsmith.formats import wds as wds_layout
from shardsmith.formats.precomputed import CACHE_EXT
from shardsmith.loaders.shard_reader import read_member, shard_samples


class DamagedRecord(UserError):
    """A latent record that cannot be read (see the module doc), named by its file and member."""


def damage_text(d: dict[str, Any]) -> str:
    """One damaged record as a line: ``FILE: member NAME: ERROR`` (``FILE: ERROR`` for a ``.pt``)."""
    return f"{d['file']}: member {d['member']}: {d['error']}" if d.get("member") else f"{d['file']}: {d['error']}"


def _damaged(damaged: list[dict[str, Any]] | None, file: Path, member: str | None, error: str) -> None:
    d = {"file": str(file), "member": member, "error": error[:300]}
    if damaged is None:
        raise DamagedRecord(f"{damage_text(d)} (shardsmith verify {file.parent} names every damaged record)")
    damaged.append(d)


def _tensor(data: bytes | memoryview | Path) -> torch.Tensor | dict | str:
    """The object in ``data`` (bytes, or a file), or why it does not load (a ``str``)."""
    try:
        return torch.load(data if isinstance(data, Path) else io.BytesIO(data), map_location="cpu",
                          weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every load failure is the finding, reported by name
        return f"does not load ({type(exc).__name__}: {exc})"


def _meta(fd: int, refs: dict, path: Path) -> dict[str, Any] | str:
    """A sample's json as a dict with a media ``path``, or what is wrong with it (a ``str``)."""
    if wds_layout.JSON not in refs:
        return "missing (the sample has no json member, which records its media path)"
    try:
        meta = loads_json(bytes(read_member(fd, refs[wds_layout.JSON], str(path))))
    except (tarfile.ReadError, OSError) as exc:
        return f"cannot be read ({exc})"
    except ValueError as exc:  # (not UTF-8, not JSON, nested too deep)
        return f"is not valid JSON ({exc})"
    if not isinstance(meta, dict):
        return f"holds a JSON {type(meta).__name__}, not an object"
    if not isinstance(meta.get("path"), str) or not meta["path"]:
        return "records no media path (no \"path\" string)"
    return meta


def _lacks(facts: dict[str, Any], numbers: tuple[str, ...]) -> str | None:
    """What is wrong when one of ``numbers`` is not a finite number in ``facts``, else None."""
    for name in numbers:
        v = facts.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"records no {name} (a number), but {v!r}"[:200]
    return None


def latent_records(root: Path, output: dict[str, Any], split: str, folder: str, member: str,
                   damaged: list[dict[str, Any]] | None = None, numbers: tuple[str, ...] = (),
                   ) -> Iterator[tuple[str, torch.Tensor, dict[str, Any], str | None]]:
    files = output["files"][split]
    base = root / files["dir"]
    if output["format"] == "precomputed":
        for p in sorted((base / folder).rglob(f"*{CACHE_EXT}")):
            d = _tensor(p)
            if isinstance(d, str):
                _damaged(damaged, p, None, d)
            elif not (isinstance(d, dict) and torch.is_tensor(d.get("latents"))):
                _damaged(damaged, p, None, f"holds no latents tensor (a {type(d).__name__}"
                         + (f" with keys {sorted(map(str, d))[:8]})" if isinstance(d, dict) else ")"))
            elif _lacks(d, numbers):
                _damaged(damaged, p, None, _lacks(d, numbers))
            else:
                yield p.relative_to(base / folder).as_posix(), d["latents"], d, None
        return
    for shard in files["shards"]:
        path = base / shard["name"]
        fd = os.open(path, os.O_RDONLY)
        try:
            for key, refs in shard_samples(path, fd):
                if member not in refs:
                    continue
                meta = _meta(fd, refs, path)
                if isinstance(meta, dict) and _lacks(meta, numbers):
                    meta = _lacks(meta, numbers)
                if isinstance(meta, str):
                    _damaged(damaged, path, f"{key}.{wds_layout.JSON}", meta)
                    continue
                try:
                    z = _tensor(read_member(fd, refs[member], str(path)))
                except (tarfile.ReadError, OSError) as exc:
                    z = f"cannot be read ({exc})"
                if not torch.is_tensor(z):
                    _damaged(damaged, path, f"{key}.{member}",
                             z if isinstance(z, str) else f"holds a {type(z).__name__}, not a tensor")
                    continue
                yield PurePosixPath(meta["path"]).with_suffix(CACHE_EXT).as_posix(), z, meta, key
        finally:
            os.close(fd)
