"""Class-conditional ZIP loader (EDM / FastGen ``ImageFolderDataset`` semantics).

Contract
- Members: every image (``png jpg jpeg webp bmp``) or ``.npy`` file in the archive, sorted by
  name; all must share one shape (checked on read, with the member named in the error).
- Labels: ``dataset.json`` ``{"labels": [[path, int], ...]}`` -> one-hot float32 of size
  ``label_dim`` (default ``max(label)+1`` as EDM does); ``null`` labels -> a size-0 vector.
- Item: ``{"real": float32 CHW (uint8 images /127.5-1, npy as stored), "condition": one-hot,
  "neg_condition": zeros like condition, "idx": int64}``.
- ``xflip`` doubles the dataset as EDM does: index ``n + i`` is member ``i`` mirrored.
- Each worker process opens its own ``ZipFile`` (EDM's shared handle is why FastGen pins
  ``num_workers=1``: more workers gave ``BadZipFile``).
- :class:`InfiniteSampler` starts at ``start_idx + rank``, steps by ``world_size`` and
  re-permutes each epoch with ``RandomState(seed + epoch)``, so a run resumed at
  ``start_idx = images_seen`` continues exactly where it stopped.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Iterator

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardsmith.errors import UserError
from shardsmith.formats.zip import ZIP_LABELS_FILE, is_sample_member, read_labels


class ZipUnreadable(UserError, ValueError):
    """An EDM ZIP that cannot be read (not a ZIP, truncated, a ``dataset.json`` that is not the labels
    table): names the file and the fix (one ``error:`` line, exit 2)."""


def _open_members(path: str) -> tuple[list[str], list | None]:
    """The sample members of the ZIP at ``path`` (sorted) and its ``dataset.json`` labels, or
    :class:`ZipUnreadable` saying what is wrong with which file."""
    try:
        with zipfile.ZipFile(path) as z:
            members = sorted(n for n in z.namelist() if is_sample_member(n))
            try:
                labels = read_labels(z)
            except (ValueError, AttributeError) as exc:  # bad JSON / bad UTF-8 / not an object
                where = (f" (line {exc.lineno}, column {exc.colno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError)
                         else f" ({exc})")
                raise ZipUnreadable(f"{path}: its {ZIP_LABELS_FILE} is not a labels table "
                                    f'{{"labels": [[path, id], ...]}}{where}; rebuild the ZIP (shardsmith build) '
                                    "or fix that member") from None
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise ZipUnreadable(f"{path}: its {ZIP_LABELS_FILE} cannot be read ({exc}); the ZIP is damaged: "
                                    "rebuild it (shardsmith build)") from None
    except (zipfile.BadZipFile, EOFError) as exc:
        raise ZipUnreadable(f"{path} is not a readable ZIP (truncated, or not a ZIP at all: {exc}); rebuild it "
                            "(shardsmith build) or copy it again") from None
    if labels is not None and not (isinstance(labels, list) and all(
            isinstance(r, (list, tuple)) and len(r) == 2 for r in labels)):
        raise ZipUnreadable(f"{path}: its {ZIP_LABELS_FILE} labels are not [[path, id], ...] rows; rebuild the "
                            "ZIP (shardsmith build) or fix that member")
    return members, labels


class ZipImageDataset(torch.utils.data.Dataset):
    def __init__(self, path: str | os.PathLike, *, use_labels: bool = True, label_dim: int | None = None,
                 xflip: bool = False):
        self.path = str(path)
        self._zip: zipfile.ZipFile | None = None
        self._pid = None
        self.members, labels = _open_members(self.path)
        if not self.members:
            raise ValueError(f"{self.path} holds no images or .npy arrays")
        labels = labels if use_labels else None
        if labels is not None:
            table = {p: int(c) for p, c in labels}
            missing = [m for m in self.members if m not in table]
            if missing:
                raise ValueError(f"{self.path}: dataset.json has no label for {missing[:3]} "
                                 f"({len(missing)} member(s)); rebuild the ZIP or pass use_labels=False")
            self.labels = np.array([table[m] for m in self.members], dtype=np.int64)
            self.label_dim = label_dim if label_dim is not None else int(self.labels.max()) + 1
            if self.labels.min() < 0 or self.labels.max() >= self.label_dim:
                raise ValueError(f"{self.path}: labels span {self.labels.min()}..{self.labels.max()}, "
                                 f"outside label_dim={self.label_dim}")
        else:
            self.labels, self.label_dim = None, 0
        self.xflip = xflip
        self.shape = tuple(self._load(0).shape)

    def _file(self) -> zipfile.ZipFile:
        if self._zip is None or self._pid != os.getpid():
            self._zip, self._pid = zipfile.ZipFile(self.path), os.getpid()
        return self._zip

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_zip"] = d["_pid"] = None
        return d

    def _load(self, i: int) -> np.ndarray:
        name = self.members[i]
        data = self._file().read(name)
        if name.endswith(".npy"):
            arr = np.load(io.BytesIO(data), allow_pickle=False)
            return arr.reshape(-1, *arr.shape[-2:])
        img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        return img.transpose(2, 0, 1)

    def __len__(self) -> int:
        return len(self.members) * (2 if self.xflip else 1)

    def __getitem__(self, index: int) -> dict:
        i, flip = index % len(self.members), index >= len(self.members)
        arr = self._load(i)
        if tuple(arr.shape) != self.shape:
            raise ValueError(f"{self.path}: {self.members[i]} has shape {tuple(arr.shape)}, expected {self.shape}; "
                             "every member of the ZIP must share one shape")
        real = torch.from_numpy(np.ascontiguousarray(arr))
        real = real.float() / 127.5 - 1 if real.dtype == torch.uint8 else real.float()
        if flip:
            real = real.flip(-1)
        cond = torch.zeros(self.label_dim, dtype=torch.float32)
        if self.labels is not None:
            cond[self.labels[i]] = 1
        return {"real": real, "condition": cond, "neg_condition": torch.zeros_like(cond),
                "idx": torch.tensor(index, dtype=torch.int64)}


class InfiniteSampler(torch.utils.data.Sampler):
    """EDM's infinite sampler: global position ``start_idx + rank``, step ``world_size``."""

    def __init__(self, n: int, *, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0,
                 start_idx: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.n, self.rank, self.world, self.shuffle, self.seed, self.start = n, rank, world_size, shuffle, seed, start_idx

    def order(self, epoch: int) -> np.ndarray:
        idx = np.arange(self.n)
        if self.shuffle:
            np.random.RandomState(self.seed + epoch).shuffle(idx)
        return idx

    def __iter__(self) -> Iterator[int]:
        pos = self.start + self.rank
        epoch, order = pos // self.n, self.order(pos // self.n)
        while True:
            e = pos // self.n
            if e != epoch:
                epoch, order = e, self.order(e)
            yield int(order[pos % self.n])
            pos += self.world


class ZipLoaderConfig(BaseModel):
    """Typed, copyable config of :func:`zip_loader` (``config.model_copy(update={...})``)."""

    model_config = ConfigDict(extra="forbid")

    path: Path
    batch_size: int = Field(32, ge=1)
    rank: int = Field(0, ge=0)
    world_size: int = Field(1, ge=1)
    num_workers: int = Field(2, ge=0)
    seed: int = 0
    start_idx: int = Field(0, ge=0)
    shuffle: bool = True
    use_labels: bool = True
    xflip: bool = False

    @model_validator(mode="after")
    def _ranks(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        return self

    def build(self) -> torch.utils.data.DataLoader:
        # validated again: a model_copy(update=...) of this config skipped the checks
        return zip_loader(**type(self).model_validate(self.model_dump()).model_dump())


def zip_loader(path: str | os.PathLike, *, batch_size: int, rank: int = 0, world_size: int = 1,
               num_workers: int = 2, seed: int = 0, start_idx: int = 0, shuffle: bool = True,
               use_labels: bool = True, xflip: bool = False) -> torch.utils.data.DataLoader:
    """An infinite DataLoader over an EDM ZIP; resume with ``start_idx = images seen so far``."""
    ds = ZipImageDataset(path, use_labels=use_labels, xflip=xflip)
    sampler = InfiniteSampler(len(ds), rank=rank, world_size=world_size, shuffle=shuffle, seed=seed,
                              start_idx=start_idx)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                                       prefetch_factor=2 if num_workers else None,
                                       persistent_workers=num_workers > 0)
