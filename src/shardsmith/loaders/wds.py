"""WebDataset loader (FastGen flavour): ``NNNNN.tar`` shards in one folder, read inside a
torch ``IterableDataset`` and batched per worker. Shards are listed from their tar headers
by a small ustar/pax header reader (:func:`shardsmith.formats.tar.tar_members`; ``tarfile``
for anything unusual) and only the members a worker uses are read, with ``os.pread``.

The jobs live in their own modules: the config in :mod:`~shardsmith.loaders.wds_config`,
shard listing and reads in :mod:`~shardsmith.loaders.shard_reader`, the deterministic plan in
:mod:`~shardsmith.loaders.slots`, collation in :mod:`~shardsmith.loaders.collate`, the dataset
(both modes) in :mod:`~shardsmith.loaders.wds_dataset`; this module holds :class:`WdsLoader`
and the contract they share (below).

Two modes
---------
**Deterministic** (``deterministic=True``): one finite pass in a fixed global order, each
sample exactly once across ``world_size × num_workers`` rank-workers.

* Global order: shards sorted by ``int(stem)`` (by name, with a warning, when a stem is not
  numeric); inside a shard, samples in member order; keys listed in ``ignore_index.json``
  are removed before numbering. ``g`` is the index of a sample in that order, ``total`` the
  number of samples.
* Slots: ``S = world_size * max(num_workers, 1)`` slots; rank-worker ``(r, w)`` is slot
  ``s = r * max(num_workers, 1) + w`` (FastGen's ``offset = worker_id + num_workers·rank``).
* Resume: a pass started at ``start_index`` (taken modulo ``total``) covers samples
  ``g >= start_index`` and sample ``g`` goes to slot ``(g - start_index) % S``, so the
  sample at ``start_index`` is the very first sample of slot 0 (FastGen's
  ``slice(start + offset, ∞, S)``). Samples before ``start_index`` are not in this pass.
* :func:`~shardsmith.loaders.slots.plan_slots` computes, from ``shard_count.json`` alone, for each slot the list of
  ``(shard, skip_n)`` it must read: only shards that hold at least one of its samples, and
  ``skip_n`` = the number of (non-ignored) samples of that shard to pass over before the
  slot's first one; after it the slot takes every ``S``-th sample of the shard. Shards that
  end before ``start_index`` are never opened, and a skipped sample's bytes are never read
  (only the headers are).
* Every worker checks that the shard really holds the number of samples the plan assumed
  (count file minus ignored keys) and raises if not, so a stale count file cannot silently
  duplicate or lose samples.

**Training** (``deterministic=False``): every rank-worker draws shards uniformly with
replacement from its own RNG (seeded by ``seed``, rank and worker id), pushes samples into a
shuffle buffer of ``shuffle_size`` and yields forever. ``start_index`` is not used. The buffer
holds the samples' raw member bytes; a sample is decoded (and filtered) when it leaves the
buffer, and samples start leaving once ``SHUFFLE_INITIAL`` (100) are buffered, as in
webdataset's ``shuffle(size, initial=100)``.

Accounting
----------
Dropped samples (filter, missing member, decode error, a video clip with fewer than
``num_frames`` frames) are never silent: reasons are ``filter:<name>``,
``missing:<suffix>``, ``decode:<key>``, ``too_short:<key>``, ``mask_grid:<key>`` (a ``mask.pth`` that is
not 0/1 on its ``latent.pth``'s grid ``[F', H', W']``: ``formats.mask_grid``) and ``incomplete_batch``. Workers send
counters to the main process between the batches (every ``STATS_EVERY_BATCHES`` batches and
at the end of their pass) and :attr:`WdsLoader.stats` holds,
for the latest pass, ``samples`` and ``batches`` yielded, ``read`` (samples taken from the
shards), ``dropped`` ``{reason: n}`` with ``examples``, ``constant_fallback`` and
``shards_opened`` ``{"r<rank>w<worker>": [shard, ...]}``. For a finished deterministic
pass, ``read == samples + sum(dropped.values())``.

Batches
-------
``dict``: every ``key_map`` key collated (equal-shape tensors stacked; ``str`` -> ``list[str]``;
``int`` -> int64 tensor; ``float`` -> float64 tensor; dicts of tensors collated per entry;
anything else, including tensors of differing shapes, a ``list``), plus ``__key__`` and
``__shard__`` (``list[str]``), plus every ``files_map`` / ``presets_map`` constant repeated
per sample (tensor -> ``[B, ...]``, string -> ``list[str]``; with ``constants_as_views`` a
read-only broadcast view of the one constant tensor instead of a copy).

Video keys (members ``mp4``, ``webm``, ...; :mod:`shardsmith.loaders.video_decode`): with
``video_size``, ``[B, 3, num_frames, H, W]`` float32 in [-1, 1] plus FastGen's
``cropping_params`` (``<key>_cropping_params`` when several keys are videos): a dict of
int64 ``[B]`` tensors ``resize_w, resize_h, crop_x0, crop_y0, crop_w, crop_h``. Without
``video_size``: uint8 ``[T, H, W, 3]`` per sample (stacked when all clips share a size).
"""

from __future__ import annotations

import logging
import os
import tarfile
from pathlib import Path
from typing import Any, Iterator

import torch

from shardsmith.formats.wds import read_ignore_index
from shardsmith.loaders import decoders as dec
from shardsmith.loaders.collate import attach_constant_views
from shardsmith.loaders.shard_reader import list_shards, read_shard_counts, shard_samples
from shardsmith.loaders.slots import Slot, empty_slots, slot_sample_counts
from shardsmith.loaders.wds_config import PRESETS, WdsLoaderConfig, fastgen_files_root, files_ref, validated
from shardsmith.loaders.wds_dataset import MAX_EXAMPLES, WdsDataset, new_delta

log = logging.getLogger(__name__)


def _identity(x):
    return x


def _merge(stats: dict, delta: dict) -> None:
    stats["read"] += delta["read"]
    stats["constant_fallback"] += delta["constant_fallback"]
    for r, n in delta["dropped"].items():
        stats["dropped"][r] = stats["dropped"].get(r, 0) + n
    for r, ex in delta["examples"].items():
        lst = stats["examples"].setdefault(r, [])
        lst.extend(ex[: max(0, MAX_EXAMPLES - len(lst))])
    for s, names in delta["shards_opened"].items():
        stats["shards_opened"].setdefault(s, []).extend(names)


def _resolve_files(cfg: WdsLoaderConfig) -> dict[str, Any]:
    consts: dict[str, Any] = {}
    for key, p in cfg.files_map.items():
        path = cfg.constant_path(p)  # FastGen's rule: relative to the dirname of the shard path
        if not path.is_file():
            hint = ""
            if not os.path.isabs(p):
                beside = Path(cfg.shards) / Path(p).name
                root = cfg.files_root if cfg.files_root is not None else fastgen_files_root(cfg.shards)
                hint = (f"; relative paths resolve as FastGen resolves them, against {str(root) or '.'} "
                        "(the shard folder's parent unless the folder is written with a trailing '/')")
                if beside.is_file():
                    hint += f": for the file in the shard folder write {files_ref(cfg.shards, Path(p).name)!r}"
            raise FileNotFoundError(f"files_map[{key!r}]: constant file not found: {path}{hint}")
        try:
            consts[key] = dec.load_constant_file(path)
        except dec.UnsupportedMemberError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"files_map[{key!r}]: cannot load {path}: {type(e).__name__}: {e}") from e
    for key, name in cfg.presets_map.items():
        if key in consts:
            raise ValueError(f"{key!r} is in both files_map and presets_map")
        consts[key] = PRESETS[name]
    return consts


class WdsLoader:
    """Iterable over batches of a WebDataset folder (see the module docstring).

    ``len(loader)`` (deterministic mode only) is the number of batches THIS rank yields in a
    pass: the sum over its workers of ``n // batch_size`` (``ceil`` with ``partial=True``),
    ``n`` being the worker's planned samples. It is exact when nothing is dropped and an
    upper bound otherwise. Ranks may differ by one batch per worker.
    """

    def __init__(self, config: WdsLoaderConfig):
        self.config = cfg = validated(config)  # (a model_copy(update=...) skipped the checks: run them here)
        self.folder = Path(cfg.shards)
        self.shards = list_shards(self.folder)
        self.ignore = {k: v for k, v in read_ignore_index(self.folder).items() if k in self.shards}
        self.constants = _resolve_files(cfg)
        self.shard_counts = read_shard_counts(self.folder, self.shards) if cfg.deterministic else None
        self.dataset = WdsDataset(cfg, self.shards, self.constants, self.shard_counts, self.ignore)
        self.stats: dict = {}
        self._reset_stats()
        if cfg.deterministic:
            empty = [e for e in self.empty_slots() if e[0] == cfg.rank]
            counts = self.slot_counts()
            if empty:
                log.warning("rank %d: %d of its %d worker(s) get no sample: %s", cfg.rank, len(empty),
                            max(cfg.num_workers, 1), empty[0][2])
            if sum(n for (r, _), n in counts.items() if r == cfg.rank) == 0 and not cfg.allow_empty_rank:
                reason = empty[0][2] if empty else "no samples"
                raise ValueError(f"rank {cfg.rank} gets no sample in this pass ({reason}); the other ranks "
                                 f"would wait for it forever. Use fewer ranks/workers or allow_empty_rank=True")

    # ---------------------------------------------------------------- accounting
    def _reset_stats(self) -> None:
        self.stats = {"samples": 0, "batches": 0, **new_delta()}

    def slot_counts(self) -> dict[Slot, int]:
        """Planned samples per ``(rank, worker)`` for the whole world (deterministic mode)."""
        counts = self._counts()
        c = self.config
        return slot_sample_counts(counts, self.ignore, c.world_size, c.num_workers, c.start_index)

    def empty_slots(self) -> list[tuple[int, int, str]]:
        """``[(rank, worker, reason)]`` of rank-workers (whole world) that get no sample."""
        c = self.config
        return empty_slots(self._counts(), self.ignore, c.world_size, c.num_workers, c.start_index)

    def _counts(self) -> dict[str, int]:
        if self.shard_counts is None:
            self.shard_counts = read_shard_counts(self.folder, self.shards)
        return self.shard_counts

    def __len__(self) -> int:
        c = self.config
        if not c.deterministic:
            raise TypeError("a training (deterministic=False) WdsLoader is infinite and has no len()")
        n = 0
        for (r, _), k in self.slot_counts().items():
            if r == c.rank:
                n += -(-k // c.batch_size) if c.partial else k // c.batch_size
        return n

    # ---------------------------------------------------------------- iteration
    def _list_shared_shards(self) -> None:
        """Deterministic mode splits by sample, so each worker of this rank usually reads every
        shard and would list every shard's headers itself. When the workers' shard lists overlap
        (together more than 1.5x the distinct shards) the rank lists each shard once before
        forking them; the forked workers find the listings in the process's header cache
        (:mod:`shardsmith.loaders.shard_reader`; so does the next pass)."""
        c = self.config
        plan = self.dataset.plan or {}
        mine = [shards for (r, _), shards in plan.items() if r == c.rank]
        distinct = dict.fromkeys(s for shards in mine for s, _ in shards)
        if c.num_workers > 1 and sum(len(x) for x in mine) > 1.5 * len(distinct):
            for shard in distinct:
                try:
                    shard_samples(self.folder / shard)
                except (OSError, tarfile.TarError):
                    pass  # the worker that reads it reports the error, counted as usual

    def __iter__(self) -> Iterator[dict]:
        c = self.config
        self._reset_stats()
        if c.deterministic:
            self._list_shared_shards()
        kw: dict[str, Any] = {}
        if c.num_workers > 0:
            kw["prefetch_factor"] = 2
        dl = torch.utils.data.DataLoader(self.dataset, batch_size=None, num_workers=c.num_workers,
                                         collate_fn=_identity, shuffle=False, **kw)
        for item in dl:
            if "__stats__" in item:
                _merge(self.stats, item["__stats__"])
                continue
            self.stats["samples"] += len(item["__key__"])
            self.stats["batches"] += 1
            yield attach_constant_views(item, self.constants) if c.constants_as_views else item

    def __repr__(self) -> str:
        c = self.config
        return (f"WdsLoader({str(self.folder)!r}, shards={len(self.shards)}, deterministic={c.deterministic}, "
                f"rank={c.rank}/{c.world_size}, workers={c.num_workers}, batch_size={c.batch_size})")
