"""Bucket-aware loading of a multi-bucket WebDataset output (``buckets.json`` beside one folder
per bucket, :mod:`shardsmith.sinks.bucketed_wds`): every batch holds samples of one bucket, so it
stacks.

Contract (deterministic mode, ``deterministic=True``)
- ``S = world_size * max(num_workers, 1)`` rank-workers, batch size ``B``. A *round* is one batch
  from every rank-worker, all of one bucket: ``B * S`` samples of it. Bucket ``b`` with ``n_b``
  samples gives ``R_b = n_b // (B * S)`` rounds; its last ``n_b - R_b * B * S`` samples are not in
  the pass (every rank then takes the same number of batches, so none waits for another); they
  are counted in ``stats["dropped"]["bucket_remainder"]`` and :meth:`remainders` says which.
- The schedule is the list of rounds, bucket ``b`` ``R_b`` times, shuffled by
  ``random.Random(seed)``: the same on every rank. Round ``k`` of bucket ``b`` reads that bucket's
  samples ``[j * B * S, (j + 1) * B * S)`` (``j`` = the rounds of ``b`` before ``k``) exactly as a
  one-bucket loader deals them (slot ``s`` takes every ``S``-th): each sample at most once per pass.
- Resume: ``start_index`` counts the samples the whole world has consumed in this pass; it must
  be a multiple of ``B * S`` (a round boundary: a ``ValueError`` says the nearest ones); the pass
  goes on from round ``start_index // (B * S)``, giving exactly the batches an uninterrupted pass
  gives from there.
- ``len(loader)``: the batches this rank yields: ``(rounds left) * max(num_workers, 1)``.

Training mode (``deterministic=False``): each step draws a bucket with probability proportional
to its samples, from ``random.Random(seed)`` (the same bucket on every rank), and takes the next
batch of that bucket's endless shuffled loader.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.formats.wds import read_buckets_index
from shardsmith.loaders.wds import WdsLoader
from shardsmith.loaders.wds_config import WdsLoaderConfig, validated


def is_bucketed(folder: str | Path) -> bool:
    """Whether ``folder`` is a multi-bucket output (it holds ``buckets.json``)."""
    return read_buckets_index(folder) is not None


class BucketedWdsLoader:
    """Iterable over one-bucket batches of a multi-bucket output (see the module contract)."""

    def __init__(self, config: WdsLoaderConfig):
        self.config = cfg = validated(config)  # (a model_copy(update=...) skipped the checks: run them here)
        self.folder = Path(cfg.shards)
        index = read_buckets_index(self.folder)
        if index is None:
            raise ValueError(f"{self.folder} holds no buckets.json: not a multi-bucket output")
        # relative constant files resolve against this folder, as FastGen resolves them against the
        # dirname of each bucket's datatag (the same folder)
        files = {k: p if Path(p).is_absolute() else str(self.folder / p) for k, p in cfg.files_map.items()}
        self.buckets = sorted(b for b, e in index.items() if e.get("samples", 0) > 0)
        self.index = index
        self._files = files
        self.loaders: dict[str, WdsLoader] = {b: self._loader(b, 0) for b in self.buckets}
        self.workers = max(cfg.num_workers, 1)
        self.round = cfg.batch_size * cfg.world_size * self.workers
        self.samples = {b: sum(ld.slot_counts().values()) for b, ld in self.loaders.items()} \
            if cfg.deterministic else {b: index[b]["samples"] for b in self.buckets}
        self.schedule = self._schedule() if cfg.deterministic else []
        if cfg.deterministic and cfg.start_index:
            if cfg.start_index % self.round:
                lo = cfg.start_index - cfg.start_index % self.round
                raise ValueError(f"start_index {cfg.start_index} is not a round boundary of this multi-bucket "
                                 f"pass (rounds of batch_size x world_size x workers = {self.round} samples); "
                                 f"resume from {lo} or {lo + self.round}")
            done = self.schedule[:cfg.start_index // self.round]
            self.loaders = {b: self._loader(b, done.count(b) * self.round) for b in self.buckets}
        self.stats: dict[str, Any] = {}

    def _loader(self, bucket: str, start: int) -> WdsLoader:
        sub = self.config.model_copy(update={"shards": self.folder / self.index[bucket]["dir"],
                                             "files_map": self._files, "start_index": start,
                                             "allow_empty_rank": True})
        # a bucket too small for every rank-worker is expected here: its samples are counted in
        # remainders(), not warned about once per bucket
        wds_log = logging.getLogger("shardsmith.loaders.wds")
        level = wds_log.level
        wds_log.setLevel(logging.ERROR)
        try:
            return WdsLoader(sub)
        finally:
            wds_log.setLevel(level)

    def _schedule(self) -> list[str]:
        rounds = [b for b in self.buckets for _ in range(self.samples[b] // self.round)]
        random.Random(self.config.seed).shuffle(rounds)
        return rounds

    def remainders(self) -> dict[str, int]:
        """Per bucket, the samples a deterministic pass leaves out (they do not fill a round)."""
        return {b: self.samples[b] - (self.samples[b] // self.round) * self.round for b in self.buckets}

    def __len__(self) -> int:
        if not self.config.deterministic:
            raise TypeError("a training (deterministic=False) loader is infinite and has no len()")
        return (len(self.schedule) - self.config.start_index // self.round) * self.workers

    def _merge_stats(self) -> None:
        st: dict[str, Any] = {"samples": 0, "batches": 0, "read": 0, "dropped": {}, "examples": {},
                              "constant_fallback": 0, "shards_opened": {}, "buckets": {}}
        for b, ld in self.loaders.items():
            s = ld.stats
            st["buckets"][b] = {"samples": s.get("samples", 0), "batches": s.get("batches", 0)}
            for k in ("samples", "batches", "read", "constant_fallback"):
                st[k] += s.get(k, 0)
            for r, n in s.get("dropped", {}).items():
                st["dropped"][r] = st["dropped"].get(r, 0) + n
            for r, ex in s.get("examples", {}).items():
                st["examples"].setdefault(r, []).extend(ex)
            for slot, names in s.get("shards_opened", {}).items():
                st["shards_opened"].setdefault(slot, []).extend(f"{self.loaders[b].folder.name}/{n}" for n in names)
        if self.config.deterministic:
            left = sum(self.remainders().values())
            if left:
                st["dropped"]["bucket_remainder"] = left
        self.stats = st

    def __iter__(self) -> Iterator[dict]:
        if not self.config.deterministic:
            yield from self._iter_training()
            return
        start = self.config.start_index // self.round
        last = {b: i for i, b in enumerate(self.schedule)}
        iters: dict[str, Iterator[dict]] = {}
        try:
            for i, b in enumerate(self.schedule[start:], start):
                if b not in iters:
                    iters[b] = iter(self.loaders[b])
                for _ in range(self.workers):
                    yield next(iters[b])
                if last[b] == i:  # the bucket's last round: stop its workers now
                    iters.pop(b).close()
                self._merge_stats()
        finally:
            for it in iters.values():
                it.close()
            self._merge_stats()

    def _iter_training(self) -> Iterator[dict]:
        rng = random.Random(self.config.seed)
        weights = [self.samples[b] for b in self.buckets]
        iters = {b: iter(ld) for b, ld in self.loaders.items()}
        try:
            while True:
                b = rng.choices(self.buckets, weights)[0]
                yield next(iters[b])
        finally:
            for it in iters.values():
                it.close()
