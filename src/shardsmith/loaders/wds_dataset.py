"""The torch ``IterableDataset`` behind :class:`~shardsmith.loaders.wds.WdsLoader`: one
rank-worker's stream of collated batches in deterministic or training mode, with drop
accounting sent as ``{"__stats__": delta}`` records (rules in :mod:`shardsmith.loaders.wds`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from shardsmith.formats import wds as wds_layout
from shardsmith.formats.mask_grid import audio_mask_problem, mask_grid_problem
from shardsmith.formats.wds import IGNORE_INDEX_FILE, SHARD_COUNT_FILE, MemberRef
from shardsmith.loaders import decoders as dec
from shardsmith.loaders.collate import ScratchBuffers, collate_samples
from shardsmith.loaders.shard_reader import read_member, shard_samples
from shardsmith.loaders.slots import Slot, plan_slots, shard_table
from shardsmith.loaders.wds_config import WdsLoaderConfig, cropping_keys

MAX_EXAMPLES = 5
SHUFFLE_INITIAL = 100  # training: samples buffered before the first one leaves (webdataset's default)
STATS_EVERY_BATCHES = 16  # a worker sends its counters every this many batches ...
STATS_EVERY_S = 2.0  # ... or after this many seconds, and at the end of its pass


class _Drop(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def mask_grid_keys(key_map: dict[str, str]) -> list[tuple[str, str | None]]:
    """``[(batch key of a mask.pth member, batch key of the latent.pth member or None)]``: a latent sample's
    inpainting mask (``mask.pth``) must be 0/1 on its latent's grid and an audio mask (``audio_mask.pth``) 0/1
    on its audio latent's steps (``formats.mask_grid``); one that is not is dropped as
    ``mask_grid:<key>``, naming both shapes, instead of reaching a batch that misplaces it."""
    latent = next((k for k, s in key_map.items() if s == wds_layout.LATENT), None)
    audio = next((k for k, s in key_map.items() if s == wds_layout.AUDIO_LATENT), None)
    return ([(k, latent) for k, s in key_map.items() if s == wds_layout.MASK]
            + [(k, audio) for k, s in key_map.items() if s == wds_layout.AUDIO_MASK])


def new_delta() -> dict:
    return {"read": 0, "dropped": {}, "examples": {}, "constant_fallback": 0, "shards_opened": {}}


class WdsDataset(torch.utils.data.IterableDataset):
    """Yields collated batches (and ``{"__stats__": delta}`` records that :class:`~shardsmith.loaders.wds.WdsLoader`
    consumes: one every ``STATS_EVERY_BATCHES`` batches or ``STATS_EVERY_S`` seconds, and one at
    the end of a pass). Use :class:`~shardsmith.loaders.wds.WdsLoader` unless you bring your own DataLoader (then pass
    ``batch_size=None`` and handle the ``__stats__`` records)."""

    def __init__(self, config: WdsLoaderConfig, shards: list[str], constants: dict[str, Any],
                 shard_counts: Optional[dict[str, int]], ignore: dict[str, list[str]]):
        super().__init__()
        self.cfg = config
        self.folder = Path(config.shards)
        self.shards = shards
        self.constants = constants
        self.ignore = {k: frozenset(v) for k, v in ignore.items()}
        self.shard_counts = shard_counts
        self.plan: Optional[dict[Slot, list[tuple[str, int]]]] = None
        self.effective: dict[str, int] = {}
        if config.deterministic:
            assert shard_counts is not None
            self.plan = plan_slots(shard_counts, ignore, config.world_size, config.num_workers, config.start_index)
            self.effective = {s: n for s, n, _ in shard_table(shard_counts, ignore)}
        self._crop_keys = cropping_keys(config)
        self._keys = list(config.key_map) + list(self._crop_keys.values())
        # constants repeated into each batch here (the loader attaches views instead when asked)
        self._batch_constants = {} if config.constants_as_views else constants
        # called on each collated batch, in the worker, before it is sent (``verify`` folds the
        # batch contract there); returns what is sent instead. Must keep ``__key__``/``__shard__``.
        # A hook that keeps nothing of the batch may set ``reuses_batch = True``: batches are then
        # stacked into the same buffers each time (no fresh memory per batch)
        self.batch_hook: Optional[Callable[[dict], dict]] = None
        self._scratch: Optional[ScratchBuffers] = None
        need = list(config.key_map.values()) + ([wds_layout.JSON] if "score" in config.filters else [])
        self._need = tuple(dict.fromkeys(need))
        self._mask_grids = mask_grid_keys(config.key_map)

    # ---------------------------------------------------------------- one sample
    def _read_members(self, fd: int, shard: str, key: str, members: dict[str, MemberRef]) -> dict[str, bytes]:
        """The bytes of the members this loader uses (key_map suffixes, ``json`` for the score
        filter); other members are never read."""
        return {s: read_member(fd, members[s], f"{shard}/{key}.{s}", dec.last_ext(s) in ("pth", "pt"))
                for s in self._need if s in members}

    def _filter(self, members: dict[str, MemberRef], data: dict[str, bytes]) -> None:
        f = self.cfg.filters
        if "empty_keys" in f:
            for k in (f["empty_keys"] or {}).get("keys", []):
                suffix = self.cfg.key_map.get(k, k)
                ref = members.get(suffix)
                if ref is not None and ref[1] == 0:
                    raise _Drop("filter:empty_keys", f"member '.{suffix}' is empty")
        if "score" in f:
            kw = f["score"] or {}
            threshold, score_key = float(kw.get("threshold", 5.0)), kw.get("score_key", "score")
            raw = data.get(wds_layout.JSON)
            if raw is not None:
                try:
                    meta = json.loads(raw.decode("utf-8"))
                except Exception as e:  # noqa: BLE001
                    raise _Drop("filter:score", f"unreadable json member: {e}") from e
                if isinstance(meta, dict) and score_key in meta and float(meta[score_key]) < threshold:
                    raise _Drop("filter:score", f"{score_key}={meta[score_key]} < {threshold}")

    def _decode(self, shard: str, key: str, members: dict[str, MemberRef], data: dict[str, bytes]) -> dict:
        self._filter(members, data)
        sample: dict[str, Any] = {"__key__": key, "__shard__": shard}
        for bkey, suffix in self.cfg.key_map.items():
            raw = data.get(suffix)
            if raw is None:
                if bkey in self.constants:
                    sample[bkey] = self.constants[bkey]
                    if bkey in self._crop_keys:
                        sample[self._crop_keys[bkey]] = None  # a constant was not cropped
                    self._delta["constant_fallback"] += 1
                    continue
                raise _Drop(f"missing:{suffix}", f"no '.{suffix}' member")
            try:
                if bkey in self._crop_keys:
                    clip = dec.decode_video(raw, self.cfg.num_frames, self.cfg.video_size)
                    sample[bkey], sample[self._crop_keys[bkey]] = clip.frames, clip.cropping_params
                else:
                    sample[bkey] = dec.decode_member(suffix, raw, image_size=self.cfg.image_size,
                                                     num_frames=self.cfg.num_frames, video_size=self.cfg.video_size)
            except dec.MemberDecodeError as e:
                if self.cfg.strict:
                    raise type(e)(f"{shard}/{key}.{suffix}: {e}") from e
                raise _Drop(f"{e.reason}:{bkey}", str(e)) from e
        for mkey, lkey in self._mask_grids:
            rule = audio_mask_problem if self.cfg.key_map[mkey] == wds_layout.AUDIO_MASK else mask_grid_problem
            why = rule(sample.get(mkey), sample.get(lkey) if lkey is not None else None)
            if why:
                raise _Drop(f"mask_grid:{mkey}", why)
        return sample

    def _count_drop(self, shard: str, key: str, d: _Drop) -> None:
        dl = self._delta
        dl["dropped"][d.reason] = dl["dropped"].get(d.reason, 0) + 1
        ex = dl["examples"].setdefault(d.reason, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(f"{shard}/{key}: {d.detail}")

    def _take_delta(self) -> dict:
        d, self._delta = self._delta, new_delta()
        return d

    def _has_delta(self) -> bool:
        d = self._delta
        return bool(d["read"] or d["dropped"] or d["constant_fallback"] or d["shards_opened"])

    def _open(self, shard: str, slot_name: str) -> tuple[int, list[tuple[str, dict[str, MemberRef]]]]:
        """Open a shard: ``(fd, samples)``, samples from its headers only. Close ``fd``."""
        self._delta["shards_opened"].setdefault(slot_name, []).append(shard)
        path = self.folder / shard
        fd = os.open(path, os.O_RDONLY)
        try:
            return fd, shard_samples(path, fd)
        except BaseException:
            os.close(fd)
            raise

    # ---------------------------------------------------------------- iteration
    def _collate(self, buf: list[dict]) -> dict:
        scratch = None
        if getattr(self.batch_hook, "reuses_batch", False):
            scratch = self._scratch = self._scratch or ScratchBuffers()
        batch = collate_samples(buf, self._keys, self._batch_constants, scratch)
        return batch if self.batch_hook is None else self.batch_hook(batch)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        n_workers = info.num_workers if info is not None else 0
        if self.cfg.deterministic and max(n_workers, 1) != max(self.cfg.num_workers, 1):
            raise RuntimeError(f"the deterministic plan is for num_workers={self.cfg.num_workers} but this "
                               f"DataLoader runs {n_workers} workers; use the same number in both")
        self._delta = new_delta()
        slot_name = f"r{self.cfg.rank}w{worker}"
        gen = self._iter_deterministic(worker, slot_name) if self.cfg.deterministic else \
            self._iter_training(worker, slot_name)
        bs = self.cfg.batch_size
        buf: list[dict] = []
        # counters go out as separate records, but only every STATS_EVERY_BATCHES batches (or
        # STATS_EVERY_S seconds) and at the end, not before every batch
        since, last = 0, time.monotonic()
        for sample in gen:
            buf.append(sample)
            if len(buf) == bs:
                since += 1
                if since >= STATS_EVERY_BATCHES or time.monotonic() - last >= STATS_EVERY_S:
                    if self._has_delta():
                        yield {"__stats__": self._take_delta()}
                    since, last = 0, time.monotonic()
                yield self._collate(buf)
                buf = []
        if buf and self.cfg.partial:
            yield self._collate(buf)
            buf = []
        elif buf:
            # the incomplete last batch is not yielded (partial=False): counted, not silent
            self._delta["dropped"]["incomplete_batch"] = self._delta["dropped"].get("incomplete_batch", 0) + len(buf)
        if self._has_delta():
            yield {"__stats__": self._take_delta()}

    def _iter_deterministic(self, worker: int, slot_name: str):
        n_slots = self.cfg.world_size * max(self.cfg.num_workers, 1)
        for shard, skip in self.plan[(self.cfg.rank, worker)]:
            ignored = self.ignore.get(shard, frozenset())
            fd, samples = self._open(shard, slot_name)
            try:
                if ignored:
                    samples = [s for s in samples if s[0] not in ignored]
                if len(samples) != self.effective[shard]:
                    raise RuntimeError(
                        f"{shard}: {SHARD_COUNT_FILE} minus {IGNORE_INDEX_FILE} says {self.effective[shard]} "
                        f"samples but the shard holds {len(samples)}; the index files are stale or list keys "
                        f"that are not in the shard (rebuild them with `shardsmith repair`) - refusing to load "
                        f"a wrong split")
                for key, members in samples[skip::n_slots]:
                    self._delta["read"] += 1
                    try:
                        yield self._decode(shard, key, members, self._read_members(fd, shard, key, members))
                    except _Drop as d:
                        self._count_drop(shard, key, d)
            finally:
                os.close(fd)

    def _iter_raw(self, rng: np.random.Generator, worker: int, slot_name: str, state: dict):
        """Training: ``(shard, key, members, data)`` of undecoded samples from shards drawn with
        replacement, forever. ``data`` holds only the members the loader uses."""
        empty_streak = 0
        while True:
            shard = self.shards[int(rng.integers(len(self.shards)))]
            ignored = self.ignore.get(shard, frozenset())
            got = 0
            fd, samples = self._open(shard, slot_name)
            try:
                for key, members in samples:
                    if key in ignored:
                        continue
                    self._delta["read"] += 1
                    got += 1
                    yield shard, key, members, self._read_members(fd, shard, key, members)
            finally:
                os.close(fd)
            empty_streak = 0 if got else empty_streak + 1
            if state["accepted"] == 0 and empty_streak > max(20, 3 * len(self.shards)):
                raise RuntimeError(
                    f"training loader r{self.cfg.rank}w{worker}: {empty_streak} shard draws gave no sample "
                    f"(dropped: {self._delta['dropped']}); check the shards and {IGNORE_INDEX_FILE}")

    def _iter_training(self, worker: int, slot_name: str):
        """Shuffle buffer of RAW samples (webdataset's ``shuffle(size, initial=...)``): samples
        are decoded (and filtered, and drops counted) when they leave the buffer, and the first
        ones leave once ``SHUFFLE_INITIAL`` are buffered; until the buffer is full, two samples
        are read for each one that leaves."""
        rng = np.random.default_rng([self.cfg.seed, self.cfg.rank, worker])
        size = self.cfg.shuffle_size
        state = {"accepted": 0, "failed": 0}
        give_up = max(1000, 20, 3 * len(self.shards))

        def decode(item) -> Optional[dict]:
            shard, key, members, data = item
            try:
                sample = self._decode(shard, key, members, data)
            except _Drop as d:
                self._count_drop(shard, key, d)
                state["failed"] += 1
                if state["accepted"] == 0 and state["failed"] >= give_up:
                    raise RuntimeError(
                        f"training loader r{self.cfg.rank}w{worker}: {state['failed']} samples read and none "
                        f"passed (dropped: {self._delta['dropped']}); check key_map and filters") from None
                return None
            state["accepted"] += 1
            return sample

        raw = self._iter_raw(rng, worker, slot_name, state)
        if size <= 1:
            for item in raw:
                sample = decode(item)
                if sample is not None:
                    yield sample
            return
        initial = min(SHUFFLE_INITIAL, size)
        buf: list = []
        for item in raw:
            buf.append(item)
            if len(buf) < size:
                buf.append(next(raw))
            if len(buf) >= initial:
                j = int(rng.integers(len(buf)))
                buf[j], buf[-1] = buf[-1], buf[j]
                sample = decode(buf.pop())
                if sample is not None:
                    yield sample

