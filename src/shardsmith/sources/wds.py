"""A WebDataset folder as a prompt source: a ``prompt_wds`` or ``latent_wds`` dataset (``kind: wds``).

Contract
- The folder's ``NNNNN.tar`` shards (a bucketed ``latent_wds`` output: each bucket folder's of
  ``buckets.json``, in its order) are listed in loader order from their tar headers only; every
  sample is one captions-only item: id ``<source>/<shard>/<key>``, its caption the UTF-8 ``txt``
  member or, without one (latent_wds), its ``json``'s ``caption`` (read at listing time), no media
  (planned ``ok`` with kind ``text``).
- ``meta["wds"]``: the shard (relative to the source folder) and the data offset and size of its
  ``txt_emb.pth`` and ``latent.pth`` members when present: what ``shardsmith distill`` reads later
  (precomputed embeddings, the latent shape that defines the sample's) without scanning the shard
  again; and ``meta["wds"]["sha256"]``, the sha256 of each of those members' bytes as listed (the plan
  stores it: a resume reads the planned position only while it still holds the planned bytes, see
  :func:`shardsmith.distill.sources.teacher_input`; a member that cannot be read has none).
  :func:`member_refs` is what of ``meta["wds"]`` says where those bytes are and what they were. With
  ``hash_after`` set (a re-run's check of its sources: the plan's start), only shards modified after it are
  hashed; the others' samples list no sha256 (their bytes are as planned; a distill's read checks them anyway).
- A sample without a ``txt`` member or whose ``txt`` is not UTF-8 is ``failed:no_caption`` /
  ``failed:caption_not_utf8`` naming the shard and key; samples listed in ``ignore_index.json`` are
  left out. A folder without shards is a :class:`~shardsmith.sources.base.SourceError`.
- A sample whose key is not valid UTF-8 (a tar member name of other bytes) is ``failed:name_not_utf8``, its id
  spelled with ``\\xNN`` for each such byte; a source folder whose path is not UTF-8 is refused.
- ``neg_prompt_emb.npy`` beside the shards (what ``prompt_wds`` / ``latent_wds`` write; for one bucket's
  folder, beside its output's ``buckets.json``) is the source's negative prompt embedding
  (:func:`negative_embedding`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from shardsmith.atomic import loads_json
from shardsmith.formats.wds import (BUCKETS_INDEX_FILE, JSON, LATENT, NEG_PROMPT_FILE, TEXT_EMB, TXT, bucket_folder,
                                    read_buckets_index, read_ignore_index)
from shardsmith.records import NO_CAPTION, Item, SourceInfo
from shardsmith.sources.base import SourceError, refuse_root_not_utf8, shown, utf8_ok
from shardsmith.sources.paths import NAME_NOT_UTF8

KEPT_MEMBERS = (TEXT_EMB, LATENT)
#: ``meta["wds"]`` key of the kept members' sha256 (``{member: hex}``)
SHA256 = "sha256"


def member_refs(wds: dict | None) -> dict | None:
    """What of a sample's ``meta["wds"]`` identifies the bytes a distill reads: the kept members' positions and,
    where listed, their sha256; None for an item that is not a WebDataset sample."""
    if not isinstance(wds, dict):
        return None
    return {k: wds[k] for k in (*KEPT_MEMBERS, SHA256) if k in wds}


def _sha256_of(fd: int, ref, where: str) -> str | None:
    import hashlib
    import tarfile

    from shardsmith.loaders.shard_reader import read_member

    try:
        return hashlib.sha256(read_member(fd, ref, where)).hexdigest()
    except (OSError, tarfile.ReadError):
        return None  # (unreadable now: the distill's own read of it fails and says why)


class WdsSource:
    def __init__(self, index: int, spec, exclude: list[Path]):
        from shardsmith.loaders.shard_reader import list_shards

        self.root, self.spec = Path(spec.path), spec
        refuse_root_not_utf8(spec, self.root)
        buckets = read_buckets_index(self.root) if self.root.is_dir() else None
        folders = [""] if buckets is None else [bucket_folder(b) for b in buckets]
        self.shards: list[str] = []  # relative to the source folder
        self.ignored: dict[str, list[str]] = {}
        for sub in folders:
            folder = self.root / sub if sub else self.root
            try:
                names = list_shards(folder)
                ignored = read_ignore_index(folder)
            except (OSError, ValueError) as exc:
                raise SourceError(f"source {spec.name!r}: {folder} holds no WebDataset shards to read prompts from "
                                  f"({exc}); give a prompt_wds or latent_wds folder, or kind: folder / table") from None
            rel = (lambda n: f"{sub}/{n}") if sub else (lambda n: n)
            self.shards += [rel(n) for n in names]
            self.ignored.update({rel(n): v for n, v in ignored.items()})
        self.info = SourceInfo(index=index, name=spec.name, path=str(self.root), kind="wds",
                               origin=spec.origin, license=spec.license)
        #: list the members' sha256 only in shards modified after this POSIX time (None: in every shard, as a plan
        #: does); a re-run's check of its sources sets it to the plan's start (safety/source_changes.py)
        self.hash_after: float | None = None

    def _hashed(self, shard: str) -> bool:
        if self.hash_after is None:
            return True
        try:
            return os.stat(self.root / shard).st_mtime > self.hash_after
        except OSError:
            return True

    def _samples(self) -> Iterator[tuple[str, str, dict]]:
        from shardsmith.loaders.shard_reader import shard_samples

        for shard in self.shards:
            skip = set(self.ignored.get(shard, []))
            for key, refs in shard_samples(self.root / shard):
                if key not in skip:
                    yield shard, key, refs

    def count(self) -> int:
        return sum(1 for _ in self._samples())

    def items(self) -> Iterator[Item]:
        from shardsmith.loaders.shard_reader import read_member

        fds: dict[str, int] = {}

        def fd_of(shard: str) -> int:
            if shard not in fds:
                fds[shard] = os.open(self.root / shard, os.O_RDONLY)
            return fds[shard]

        try:
            for shard, key, refs in self._samples():
                rel = f"{shard}/{key}"
                meta = {"wds": {"shard": shard, "key": key,
                                **{m: list(refs[m]) for m in KEPT_MEMBERS if m in refs}}}
                caption, error = None, None
                kept = [m for m in KEPT_MEMBERS if m in refs]
                if kept and utf8_ok(key) and self._hashed(shard):  # what a distill reads, to read it later only as it is
                    shas = {m: _sha256_of(fd_of(shard), refs[m], f"{rel}.{m}") for m in kept}
                    meta["wds"][SHA256] = {m: h for m, h in shas.items() if h is not None}
                member = TXT if TXT in refs else JSON if JSON in refs else None
                if not utf8_ok(key):
                    rel, meta["wds"]["key"] = shown(rel), shown(key)
                    error = (NAME_NOT_UTF8, f"{rel}: the sample key is not valid UTF-8 (\\xNN marks each byte that "
                             "is not), and no dataset format, manifest or ledger can hold it; rename its members to "
                             "UTF-8 names")
                elif member is None:
                    error = (NO_CAPTION, f"{rel} has neither a {TXT} nor a {JSON} member: no prompt to sample")
                else:
                    caption, error = _caption(bytes(read_member(fd_of(shard), refs[member], rel)), f"{rel}.{member}",
                                              member == JSON)
                yield Item(item_id=f"{self.spec.name}/{rel}", source=self.info.index, path="", relpath=rel,
                           caption=caption, meta=meta, error=error)
        finally:
            for fd in fds.values():
                os.close(fd)


def _caption(raw: bytes, where: str, in_json: bool) -> tuple[str | None, tuple[str, str] | None]:
    """A sample's prompt: its ``txt`` member, or the ``caption`` of its ``json`` (latent_wds writes no
    ``txt``); ``(caption, None)`` or ``(None, (reason, detail))``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, ("caption_not_utf8", f"{where} is not UTF-8 (byte {exc.start})")
    if in_json:
        try:
            meta = loads_json(text)
        except ValueError:
            return None, (NO_CAPTION, f"{where} is not JSON, and the sample has no {TXT} member")
        text = meta.get("caption") if isinstance(meta, dict) else None
        if not isinstance(text, str):
            return None, (NO_CAPTION, f"{where} has no caption, and the sample has no {TXT} member")
    text = text.strip()
    return (text, None) if text else (None, (NO_CAPTION, f"{where}: the prompt is empty"))


def negative_file(folder: str | os.PathLike) -> Path | None:
    """Where a source folder's ``neg_prompt_emb.npy`` is, or None."""
    folder = Path(folder)
    for where in (folder, folder.parent if (folder.parent / BUCKETS_INDEX_FILE).is_file() else None):
        if where is not None and (where / NEG_PROMPT_FILE).is_file():
            return where / NEG_PROMPT_FILE
    return None


def negative_embedding(folder: str | os.PathLike):
    """The float32 ``[L, D]`` tensor of ``neg_prompt_emb.npy`` beside a source's shards (for one bucket's
    folder of a bucketed output: beside its ``buckets.json``), or None."""
    path = negative_file(folder)
    if path is None:
        return None
    import numpy as np
    import torch

    return torch.from_numpy(np.load(path, allow_pickle=False).astype("float32"))
