"""WebDataset loader (FastGen flavour): ``NNNNN.tar`` shards in one folder, read inside a
torch ``IterableDataset`` and batched per worker. Shards are listed from their tar headers
by a small ustar/pax header reader (:func:`tar_members`; ``tarfile`` for anything unusual)
and only the members a worker uses are read, with ``os.pread``.

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
* :func:`plan_slots` computes, from ``shard_count.json`` alone, for each slot the list of
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
``missing:<suffix>``, ``decode:<key>``, ``too_short:<key>`` and ``incomplete_batch``. Workers send
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

import json
import logging
import os
import re
import tarfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shardsmith import formats
from shardsmith.formats import IGNORE_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.loaders import decoders as dec

log = logging.getLogger(__name__)

PRESETS: dict[str, str] = {
    "empty_string": "",
    # Wan 2.1's default negative prompt (sample_neg_prompt in the Wan configs)
    "neg_prompt_wan": (
        "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，"
        "低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，"
        "形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
    ),
    # Cosmos-Predict's default negative prompt
    "neg_prompt_cosmos": (
        "The video captures a series of frames showing ugly scenes, static with no motion, motion "
        "blur, over-saturation, shaky footage, low resolution, grainy texture, pixelated images, "
        "poorly lit areas, underexposed and overexposed scenes, poor color balance, washed out "
        "colors, choppy sequences, jerky movements, low frame rate, artifacting, color banding, "
        "unnatural transitions, outdated special effects, fake elements, unconvincing visuals, "
        "poorly edited content, jump cuts, visual noise, and flickering. Overall, the video is of "
        "poor quality."
    ),
}

FILTERS = ("score", "empty_keys")
MAX_EXAMPLES = 5
SHUFFLE_INITIAL = 100  # training: samples buffered before the first one leaves (webdataset's default)
STATS_EVERY_BATCHES = 16  # a worker sends its counters every this many batches ...
STATS_EVERY_S = 2.0  # ... or after this many seconds, and at the end of its pass

Slot = tuple[int, int]


# ============================================================================ config

class WdsLoaderConfig(BaseModel):
    """Everything the loader needs; ``config.model_copy(update={...})`` makes variants."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    shards: Path
    key_map: dict[str, str] = Field(default_factory=lambda: {"real": "jpg", "condition": "txt"})
    files_map: dict[str, str] = Field(default_factory=dict)
    presets_map: dict[str, str] = Field(default_factory=dict)
    filters: dict[str, dict[str, Any]] = Field(default_factory=dict)
    batch_size: int = Field(1, ge=1)
    num_workers: int = Field(0, ge=0)
    deterministic: bool = False
    shuffle_size: int = Field(1000, ge=0)
    seed: int = 0
    start_index: int = Field(0, ge=0)
    rank: Optional[int] = None  # None: torch.distributed rank if initialised, else 0
    world_size: Optional[int] = None  # None: torch.distributed world size if initialised, else 1
    partial: bool = False
    image_size: Optional[Union[int, tuple[int, int]]] = None
    # video members (mp4, webm, ...): the first ``num_frames`` frames (FastGen's
    # ``sequence_length``), each resized to cover ``video_size`` and centre-cropped, as float32
    # [3, T, H, W] in [-1, 1]; without ``video_size``, uint8 [T, H, W, 3]. ``video_size`` is
    # an int (square) or (H, W) like ``image_size``; FastGen's ``img_size`` is (W, H)
    num_frames: Optional[int] = Field(None, ge=1)
    video_size: Optional[Union[int, tuple[int, int]]] = None
    strict: bool = False  # True: a decode error raises instead of being counted and dropped
    # True: files_map / presets_map tensors reach each batch as a read-only broadcast view
    # (``constant.expand(B, ...)``, no copy, attached in the main process) instead of a [B, ...]
    # copy made in the worker and sent through shared memory. ``verify`` uses it: a repeated
    # float32 [77, 2048] negative embedding is 40 MB of copies per batch of 64. Leave it off for
    # training if the trainer writes into batch tensors in place.
    constants_as_views: bool = False
    allow_empty_rank: bool = False  # False: a rank with no sample at all raises at construction

    @field_validator("key_map")
    @classmethod
    def _keys(cls, v):
        if not v:
            raise ValueError("key_map must map at least one batch key to a member suffix")
        for k, s in v.items():
            if k.startswith("__"):
                raise ValueError(f"batch key {k!r}: names starting with '__' are reserved")
            if not s or s.startswith(".") or "/" in s:
                raise ValueError(f"key_map[{k!r}] = {s!r} is not a member suffix like 'jpg' or 'latent.pth'")
            dec.check_supported(s)
        return v

    @field_validator("video_size")
    @classmethod
    def _video_size(cls, v):
        if v is None:
            return v
        sides = (v,) if isinstance(v, int) else tuple(v)
        if any(isinstance(x, bool) or int(x) < 1 for x in sides):
            raise ValueError(f"video_size must be a positive int (square) or (height, width) of positive "
                             f"ints, got {v!r}")
        return v

    @field_validator("presets_map")
    @classmethod
    def _presets(cls, v):
        for k, name in v.items():
            if name not in PRESETS:
                raise ValueError(f"presets_map[{k!r}] = {name!r}: unknown preset; known: {sorted(PRESETS)}")
        return v

    @field_validator("filters")
    @classmethod
    def _filters(cls, v):
        for name, kw in v.items():
            if name not in FILTERS:
                raise ValueError(f"unknown filter {name!r}; known: {list(FILTERS)}")
            allowed = {"score": {"threshold", "score_key"}, "empty_keys": {"keys"}}[name]
            bad = set(kw or {}) - allowed
            if bad:
                raise ValueError(f"filter {name!r}: unknown options {sorted(bad)}; allowed {sorted(allowed)}")
        return v

    @model_validator(mode="after")
    def _video(self):
        videos = video_keys(self.key_map)
        if videos and self.num_frames is None:
            k = videos[0]
            raise ValueError(f"key_map[{k!r}] = {self.key_map[k]!r} is a video member: set num_frames (frames "
                             "taken from the start of each clip, FastGen's sequence_length; the 'video' preset "
                             "uses 81) and usually video_size (H, W)")
        taken = set(self.key_map) | set(self.files_map) | set(self.presets_map)
        for k, ck in cropping_keys(self).items():
            if ck in taken:
                raise ValueError(f"batch key {ck!r} holds the cropping_params of video key {k!r}; rename the "
                                 f"other {ck!r} key")
        return self

    @model_validator(mode="after")
    def _ranks(self):
        if self.rank is None or self.world_size is None:
            r, w = _dist_rank_world()
            self.rank = r if self.rank is None else self.rank
            self.world_size = w if self.world_size is None else self.world_size
        if self.world_size < 1 or not (0 <= self.rank < self.world_size):
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        return self


def video_keys(key_map: dict[str, str]) -> list[str]:
    """Batch keys whose member is a video (decoded with ``num_frames`` / ``video_size``)."""
    return [k for k, s in key_map.items() if dec.last_ext(s) in dec.VIDEO_EXTS]


def cropping_keys(cfg: "WdsLoaderConfig") -> dict[str, str]:
    """``{video batch key: batch key of its cropping_params}`` when ``video_size`` is set: FastGen
    names it ``cropping_params``, or ``<key>_cropping_params`` when there are several video keys."""
    if cfg.video_size is None:
        return {}
    keys = video_keys(cfg.key_map)
    return {k: ("cropping_params" if len(keys) == 1 else f"{k}_cropping_params") for k in keys}


def _dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist  # noqa: PLC0415

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return 0, 1


# ============================================================================ shard folder

def sort_shard_names(names) -> list[str]:
    """FastGen order (see :func:`shardsmith.formats.sort_shard_names`), warning when not numeric."""
    ordered, numeric = formats.sort_shard_names(names)
    if not numeric:
        log.warning("shard names are not all numeric (NNNNN.tar); sorting them by name")
    return ordered


def list_shards(folder) -> list[str]:
    """Regular ``*.tar`` files (any case) directly inside ``folder``, in loader order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"WebDataset folder not found: {folder}")
    names = [p.name for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(".tar")]
    if not names:
        raise ValueError(f"no .tar shards directly inside {folder}")
    return sort_shard_names(names)


# ---------------------------------------------------------------------------- fast tar headers
#
# ``tarfile`` costs ~50 us of pure Python per member (TarInfo objects, pax dicts, checks for
# every field). Grouping members into samples needs only each member's name, data offset and
# size, so the reader below parses just those from the 512-byte headers (ustar, GNU longname
# ``L``, pax ``x`` path/size records), verifies each header's checksum, and skips data
# without reading it (``os.pread`` of the header blocks only). Anything it does not know
# (v7 headers without the ustar magic, base-256 sizes, pax global headers, sparse files,
# chained extension headers, a truncated or garbled archive, ...) makes it give up, and the
# shard is listed with ``tarfile`` instead, so the result (and the error raised for a broken
# shard) is always what ``tarfile`` gives.

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_CHK_SPACES = b" " * 8
_FILE_TYPES = (b"0", b"\0", b"7")
_NODATA_TYPES = (b"1", b"2", b"5")  # hard link, symlink, directory: no data blocks follow
_WINDOW = 8192


class _Unusual(Exception):
    """The fast header reader met something it does not handle: use ``tarfile``."""


def _nts(b: bytes) -> str:
    i = b.find(0)
    if i >= 0:
        b = b[:i]
    return b.decode("utf-8", "surrogateescape")


def _octal(b: bytes) -> int:
    if b[0] & 0x80:
        raise _Unusual("base-256 number")
    i = b.find(0)
    if i >= 0:
        b = b[:i]
    b = b.strip()
    try:
        return int(b, 8) if b else 0
    except ValueError:
        raise _Unusual("bad octal field") from None


def _pax_records(buf: bytes) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    pos, n = 0, len(buf)
    while pos < n and buf[pos] != 0:
        sp = buf.find(b" ", pos, pos + 24)
        if sp < 0:
            raise _Unusual("bad pax record")
        try:
            length = int(buf[pos:sp])
        except ValueError:
            raise _Unusual("bad pax record") from None
        end = pos + length
        if length <= 0 or end > n or buf[end - 1] != 0x0A:
            raise _Unusual("bad pax record")
        k, eq, v = buf[sp + 1:end - 1].partition(b"=")
        if not eq:
            raise _Unusual("bad pax record")
        out[k.decode("ascii", "replace")] = v
        pos = end
    return out


def _scan_fast(fd: int, file_size: int) -> list[tuple[str, int, int]]:
    """``[(name, data_offset, size)]`` of the regular-file members, from the headers only."""
    pread = os.pread
    out: list[tuple[str, int, int]] = []
    win, w0 = b"", 0  # a window of the file, to read small consecutive headers in one call
    off = 0
    long_name: Optional[str] = None
    pax: Optional[dict[str, bytes]] = None
    long_link = False  # a GNU longlink 'K' header (a link target name) is pending
    while True:
        if off >= file_size:
            if off == 0 or long_name is not None or pax is not None or long_link:
                raise _Unusual("empty or truncated archive")
            return out  # tarfile, too, ends quietly at EOF on a block boundary
        if not (w0 <= off and off + _BLOCK <= w0 + len(win)):
            w0, win = off, pread(fd, _WINDOW, off)
            if len(win) < _BLOCK:
                raise _Unusual("truncated header")
        i = off - w0
        hdr = win[i:i + _BLOCK]
        if hdr == _ZERO_BLOCK:
            if long_name is not None or pax is not None or long_link:
                raise _Unusual("extension header without a member")
            return out
        # checksum: unsigned sum of the header with the checksum field as spaces. adler32's
        # low half is 1 + that sum mod 65521, so compare modulo 65521
        try:  # the usual "0012345\0 " form, without the helper's overhead
            c = hdr[148:156]
            chk = int(c[:c.find(0)] if 0 in c else c, 8)
        except ValueError:
            chk = _octal(hdr[148:156])
        if (zlib.adler32(hdr[:148] + _CHK_SPACES + hdr[156:]) & 0xFFFF) != (1 + chk) % 65521:
            raise _Unusual("checksum mismatch")
        magic = hdr[257:263]
        if magic != b"ustar\0" and magic != b"ustar ":
            raise _Unusual("not a ustar header")
        typ = hdr[156:157]
        try:
            c = hdr[124:136]
            size = int(c[:c.find(0)] if 0 in c else c, 8)
        except ValueError:
            size = _octal(hdr[124:136])
        data = off + _BLOCK
        nxt = data + ((size + _BLOCK - 1) // _BLOCK) * _BLOCK
        if typ in _FILE_TYPES:
            if pax is not None:
                if "size" in pax:
                    try:
                        size = int(pax["size"])
                    except ValueError:
                        raise _Unusual("bad pax size") from None
                    nxt = data + ((size + _BLOCK - 1) // _BLOCK) * _BLOCK
                if "path" in pax:
                    try:
                        name = pax["path"].decode("utf-8").rstrip("/")
                    except UnicodeDecodeError:
                        raise _Unusual("pax path not utf-8") from None
                    if long_name is not None:
                        raise _Unusual("both a GNU longname and a pax path")
                    long_name = name
            if long_name is not None:
                name = long_name
            else:
                name = _nts(hdr[0:100])
                prefix = hdr[345:500]
                if prefix[0]:
                    name = _nts(prefix) + "/" + name
            if typ == b"\0" and _nts(hdr[0:100]).endswith("/"):
                nxt = data  # tarfile reads this as a directory: no data blocks
            else:
                if nxt > file_size:
                    raise _Unusual("truncated member data")
                out.append((name, data, size))
            long_name, pax, long_link = None, None, False
        elif typ in _NODATA_TYPES:
            if pax is not None and "size" in pax:
                raise _Unusual("pax size on a member without data")
            long_name, pax, long_link = None, None, False
            nxt = data
        elif typ == b"K":
            if long_link or nxt > file_size:
                raise _Unusual("chained or truncated longlink header")
            long_link = True
        elif typ == b"L" or typ == b"x":
            if long_name is not None or pax is not None:
                raise _Unusual("chained extension headers")
            if nxt > file_size:
                raise _Unusual("truncated extension header")
            buf = win[i + _BLOCK:i + _BLOCK + size] if data + size <= w0 + len(win) else pread(fd, size, data)
            if len(buf) != size:
                raise _Unusual("truncated extension header")
            if typ == b"L":
                long_name = _nts(buf)
            else:
                pax = _pax_records(buf)
                if any(k.startswith("GNU.sparse") or k == "hdrcharset" for k in pax):
                    raise _Unusual("sparse member or pax hdrcharset")
        else:
            raise _Unusual(f"member type {typ!r}")
        off = nxt


def _scan_tarfile(path) -> list[tuple[str, int, int]]:
    with tarfile.open(path, "r:") as tf:
        return [(info.name, info.offset_data, info.size) for info in tf if info.isfile()]


def tar_members(path, fd: Optional[int] = None) -> list[tuple[str, int, int]]:
    """``[(name, data_offset, size)]`` of the regular-file members of a tar, in order, read
    from the headers only (data is skipped). Same result as listing the ``isfile()`` members
    with ``tarfile``; a shard the fast reader does not understand is listed with ``tarfile``
    (which also raises the usual ``tarfile.ReadError`` for a broken one)."""
    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY)
    try:
        try:
            return _scan_fast(fd, os.fstat(fd).st_size)
        except _Unusual as e:
            log.debug("%s: %s; listing it with tarfile", path, e)
    finally:
        if own:
            os.close(fd)
    return _scan_tarfile(path)


MemberRef = tuple[int, int]  # (data offset, size)


def group_samples(members: list[tuple[str, int, int]]) -> list[tuple[str, dict[str, MemberRef]]]:
    """Consecutive members with the same key -> ``[(key, {suffix: (offset, size)})]``, grouped as
    webdataset groups them (members without a suffix are skipped)."""
    split = formats.split_member
    out: list[tuple[str, dict[str, MemberRef]]] = []
    key, cur = None, None
    for name, off, size in members:
        parts = split(name)
        if parts is None:
            continue
        k, suffix = parts
        if k != key:
            key, cur = k, {}
            out.append((k, cur))
        cur[suffix] = (off, size)
    return out


class _MemberIndex:
    """Listings of shards already scanned in this process, kept compact (one bytes object of
    names and one int64 array of offsets and sizes per shard: no per-member Python objects, so
    forked DataLoader workers share the pages instead of copying them on reference counting).
    Keyed by path, inode, size and mtime: a shard that changed is scanned again. At most
    ``MAX_BYTES`` in all; beyond that shards are simply not remembered."""

    MAX_BYTES = 128 << 20

    def __init__(self) -> None:
        self.entries: dict[tuple, tuple[bytes, np.ndarray]] = {}
        self.nbytes = 0

    @staticmethod
    def key(path, st: os.stat_result) -> tuple:
        return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def get(self, key: tuple) -> Optional[list[tuple[str, int, int]]]:
        hit = self.entries.get(key)
        if hit is None:
            return None
        names, nums = hit
        return list(zip(names.decode("utf-8", "surrogateescape").split("\0"), nums[0].tolist(),
                        nums[1].tolist())) if len(nums[0]) else []

    def put(self, key: tuple, members: list[tuple[str, int, int]]) -> None:
        if any("\0" in n for n, _, _ in members):
            return
        names = "\0".join(n for n, _, _ in members).encode("utf-8", "surrogateescape")
        nums = np.array([[o for _, o, _ in members], [z for _, _, z in members]], dtype=np.int64).reshape(2, -1)
        size = len(names) + nums.nbytes
        if self.nbytes + size <= self.MAX_BYTES:
            self.entries[key] = (names, nums)
            self.nbytes += size


_INDEX = _MemberIndex()


def shard_samples(path, fd: Optional[int] = None) -> list[tuple[str, dict[str, MemberRef]]]:
    """The samples of one shard, ``[(key, {suffix: (data offset, size)})]``, headers only.
    A shard listed before in this process (or in the process this one was forked from) is
    not read again unless it changed (see :class:`_MemberIndex`)."""
    key = _MemberIndex.key(path, os.fstat(fd) if fd is not None else os.stat(path))
    members = _INDEX.get(key)
    if members is None:
        members = tar_members(path, fd)
        _INDEX.put(key, members)
    return group_samples(members)


def read_member(fd: int, ref: MemberRef, where: str = "", writable: bool = False) -> bytes | memoryview:
    """The member's bytes; ``writable=True`` reads them into fresh writable memory (a writable
    ``memoryview``, not zero-filled first: the read overwrites all of it) that a tensor can then
    use as its memory without another copy (``.pth`` members)."""
    off, size = ref
    if writable and size:
        data = np.empty(size, np.uint8).data  # bytearray(size) would first zero it: ~25 % slower reads
        if os.preadv(fd, [data], off) != size:
            raise tarfile.ReadError(f"unexpected end of data{' in ' + where if where else ''}")
        return data
    data = os.pread(fd, size, off) if size else b""
    if len(data) != size:
        raise tarfile.ReadError(f"unexpected end of data{' in ' + where if where else ''}")
    return data


def count_tar_samples(path) -> int:
    """Number of samples in one shard, from the tar headers only."""
    return len(shard_samples(path))


def read_shard_counts(folder, shards: list[str]) -> dict[str, int]:
    """Counts from ``shard_count.json``; shards it lacks (or the whole file, when absent)
    are counted once from their tar headers, with a logged warning."""
    folder = Path(folder)
    path = folder / SHARD_COUNT_FILE
    counts: dict[str, int] = {}
    if path.is_file():
        data = json.loads(path.read_text())
        counts = {k: int(v) for k, v in data.items() if k in shards}
        extra = sorted(set(data) - set(shards))
        if extra:
            log.warning("%s lists %d shard(s) not in %s (ignored): %s", path, len(extra), folder, extra[:5])
        missing = [s for s in shards if s not in counts]
        if missing:
            log.warning("%s lacks %d shard(s); counting their samples from the tar headers: %s",
                        path, len(missing), missing[:5])
    else:
        missing = list(shards)
        log.warning("%s has no %s (not written by shardsmith?); counting samples of %d shard(s) "
                    "from their tar headers once", folder, SHARD_COUNT_FILE, len(missing))
    for s in missing:
        counts[s] = count_tar_samples(folder / s)
    return {s: counts[s] for s in shards}


def read_ignore_index(folder) -> dict[str, list[str]]:
    path = Path(folder) / IGNORE_INDEX_FILE
    if not path.is_file():
        return {}
    return {k: list(v) for k, v in json.loads(path.read_text()).items()}


# ============================================================================ the plan (pure)

def _table(shard_counts: dict[str, int], ignore: dict[str, list[str]]) -> list[tuple[str, int, int]]:
    """``[(shard, effective_count, global_offset)]`` in loader order."""
    rows, off = [], 0
    for s in sort_shard_names(shard_counts):
        n = int(shard_counts[s]) - len(set(ignore.get(s, ())))
        if n < 0:
            raise ValueError(f"{IGNORE_INDEX_FILE} ignores more keys in {s} than {SHARD_COUNT_FILE} counts")
        rows.append((s, n, off))
        off += n
    return rows


def plan_slots(shard_counts: dict[str, int], ignore: dict[str, list[str]], world: int, workers: int,
               start_index: int = 0) -> dict[Slot, list[tuple[str, int]]]:
    """Pure: ``{(rank, worker): [(shard, skip_n), ...]}`` for every rank-worker.

    ``workers=0`` (loading in the main process) counts as one worker, ``0``. Sample ``g``
    (global, after ignores, see the module docstring) with ``g >= start_index % total``
    goes to slot ``(g - start) % S`` with ``S = world * max(workers, 1)`` and slot
    ``rank * max(workers, 1) + worker``. A slot's list holds only shards with at least one
    of its samples; ``skip_n`` non-ignored samples of that shard are passed over, then
    every ``S``-th is taken. Empty slots get an empty list (see :func:`empty_slots`).
    """
    if world < 1 or workers < 0 or start_index < 0:
        raise ValueError(f"need world >= 1, workers >= 0, start_index >= 0 (got {world}, {workers}, {start_index})")
    nw = max(workers, 1)
    n_slots = world * nw
    rows = _table(shard_counts, ignore)
    total = sum(n for _, n, _ in rows)
    plan: dict[Slot, list[tuple[str, int]]] = {(r, w): [] for r in range(world) for w in range(nw)}
    if total == 0:
        return plan
    start = start_index % total
    for shard, n, off in rows:
        lo, hi = max(off, start), off + n
        if lo >= hi:
            continue
        for s in range(n_slots):
            g0 = lo + (s - (lo - start)) % n_slots
            if g0 < hi:
                plan[divmod(s, nw)].append((shard, g0 - off))
    return plan


def slot_sample_counts(shard_counts, ignore, world, workers, start_index=0) -> dict[Slot, int]:
    """Pure: how many samples each slot gets in a pass (before any drop)."""
    nw = max(workers, 1)
    n_slots = world * nw
    eff = {s: n for s, n, _ in _table(shard_counts, ignore)}
    plan = plan_slots(shard_counts, ignore, world, workers, start_index)
    return {slot: sum(-(-(eff[sh] - skip) // n_slots) for sh, skip in lst) for slot, lst in plan.items()}


def fastgen_validation_empty(n_shards: int, world: int, workers: int) -> int:
    """Rank-workers left without a shard by FastGen's validation split (``train=False``):
    shard ``i`` goes to rank ``i % world``, then webdataset's ``split_by_worker`` deals that
    rank's shards to its workers; each empty one raises "No samples found" there."""
    world, workers = max(1, world), max(1, workers)
    return sum(max(0, workers - len(range(r, n_shards, world))) for r in range(world))


def empty_slots(shard_counts, ignore, world, workers, start_index=0) -> list[tuple[int, int, str]]:
    """Pure: ``[(rank, worker, reason)]`` for every rank-worker that gets no sample, e.g.
    ``(2, 1, "3 shards, 9 samples for 16 rank-workers")``."""
    rows = _table(shard_counts, ignore)
    total = sum(n for _, n, _ in rows)
    n_slots = world * max(workers, 1)
    remaining = total - (start_index % total) if total else 0
    reason = f"{len(rows)} shards, {remaining} samples for {n_slots} rank-workers"
    if total and start_index % total:
        reason += f" (resuming at sample {start_index % total} of {total})"
    counts = slot_sample_counts(shard_counts, ignore, world, workers, start_index)
    return [(r, w, reason) for (r, w), n in sorted(counts.items()) if n == 0]


# ============================================================================ collation

def _batch_out(like: torch.Tensor, shape: tuple[int, ...]) -> Optional[torch.Tensor]:
    """In a DataLoader worker: an empty tensor in shared memory to stack a batch into, so the
    batch crosses to the main process without another copy (what ``default_collate`` does).
    Elsewhere ``None`` (ordinary memory)."""
    if torch.utils.data.get_worker_info() is None or like.device.type != "cpu":
        return None
    numel = 1
    for d in shape:
        numel *= d
    storage = like._typed_storage()._new_shared(numel, device=like.device)
    return like.new(storage).resize_(*shape)


class ScratchBuffers:
    """Stack batches into the same buffers every time (one per key, shape and dtype): for a
    consumer that is done with a batch before asking for the next (``verify`` recording the
    contract inside the worker). Fresh memory costs a page fault per 4 KiB page on first touch:
    11.7 GB of SDXL-size latents is 2.9 M faults."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}

    def __call__(self, key: str, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        k = (key, shape, like.dtype)
        buf = self.buffers.get(k)
        if buf is None:
            buf = self.buffers[k] = torch.empty(shape, dtype=like.dtype)
        return buf


def _collate_values(values: list, key: str = "", scratch: Optional[ScratchBuffers] = None) -> Any:
    v0 = values[0]
    if isinstance(v0, np.ndarray):
        values = [torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for v in values]
        v0 = values[0]
    if isinstance(v0, torch.Tensor):
        if all(isinstance(v, torch.Tensor) and v.shape == v0.shape and v.dtype == v0.dtype for v in values):
            shape = (len(values), *v0.shape)
            out = scratch(key, v0, shape) if scratch is not None else _batch_out(v0, shape)
            return torch.stack(values, out=out)
        return list(values)
    if isinstance(v0, bool):
        return list(values)
    if isinstance(v0, int) and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.int64)
    if isinstance(v0, float) and all(isinstance(v, (int, float)) for v in values):
        return torch.tensor(values, dtype=torch.float64)
    if (isinstance(v0, dict) and v0 and all(isinstance(v, dict) and v.keys() == v0.keys() for v in values)
            and all(isinstance(x, (torch.Tensor, np.ndarray, int, float)) for v in values for x in v.values())):
        return {k: _collate_values([v[k] for v in values], f"{key}/{k}", scratch) for k in v0}
    return list(values)


def _repeat_constant(value: Any, n: int, copy: bool = True) -> Any:
    """A constant repeated ``n`` times: tensors as ``[n, ...]`` (a copy, in shared memory inside a
    worker; with ``copy=False`` a broadcast view of the one tensor), strings as a list."""
    if isinstance(value, torch.Tensor):
        view = value.unsqueeze(0).expand(n, *value.shape)
        if not copy:
            return view
        out = _batch_out(value, (n, *value.shape))
        return view.contiguous() if out is None else out.copy_(view)
    if isinstance(value, dict):
        return {k: _repeat_constant(v, n, copy) for k, v in value.items()}
    return [value] * n


def attach_constant_views(batch: dict, constants: dict[str, Any]) -> dict:
    """Add every constant not already in ``batch`` as a ``[B, ...]`` broadcast view (no copy)."""
    n = len(batch["__key__"])
    for k, v in constants.items():
        if k not in batch:
            batch[k] = _repeat_constant(v, n, copy=False)
    return batch


def collate_samples(samples: list[dict], keys: list[str], constants: dict[str, Any],
                    scratch: Optional[ScratchBuffers] = None) -> dict:
    """One batch from decoded samples (see the module docstring for the rules). ``scratch``:
    stack into reused buffers (the batch is only valid until the next call)."""
    batch: dict[str, Any] = {k: _collate_values([s[k] for s in samples], k, scratch) for k in keys}
    for k, v in constants.items():
        if k not in batch:
            batch[k] = _repeat_constant(v, len(samples))
    batch["__key__"] = [s["__key__"] for s in samples]
    batch["__shard__"] = [s["__shard__"] for s in samples]
    return batch


# ============================================================================ dataset

class _Drop(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _new_delta() -> dict:
    return {"read": 0, "dropped": {}, "examples": {}, "constant_fallback": 0, "shards_opened": {}}


class WdsDataset(torch.utils.data.IterableDataset):
    """Yields collated batches (and ``{"__stats__": delta}`` records that :class:`WdsLoader`
    consumes: one every ``STATS_EVERY_BATCHES`` batches or ``STATS_EVERY_S`` seconds, and one at
    the end of a pass). Use :class:`WdsLoader` unless you bring your own DataLoader (then pass
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
            self.effective = {s: n for s, n, _ in _table(shard_counts, ignore)}
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
        need = list(config.key_map.values()) + (["json"] if "score" in config.filters else [])
        self._need = tuple(dict.fromkeys(need))

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
            raw = data.get("json")
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
        return sample

    def _count_drop(self, shard: str, key: str, d: _Drop) -> None:
        dl = self._delta
        dl["dropped"][d.reason] = dl["dropped"].get(d.reason, 0) + 1
        ex = dl["examples"].setdefault(d.reason, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(f"{shard}/{key}: {d.detail}")

    def _take_delta(self) -> dict:
        d, self._delta = self._delta, _new_delta()
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
        self._delta = _new_delta()
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


# ============================================================================ loader

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
    folder = Path(cfg.shards)
    for key, p in cfg.files_map.items():
        path = Path(p).expanduser()
        if not path.is_absolute():
            path = folder / path
        if not path.is_file():
            raise FileNotFoundError(
                f"files_map[{key!r}]: constant file not found: {path} (relative paths resolve against "
                f"the shard folder {folder})")
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
        self.config = cfg = config.model_copy(deep=True)
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
        self.stats = {"samples": 0, "batches": 0, **_new_delta()}

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
        forking them; the forked workers find the listings in :data:`_INDEX` (and so does the
        next pass)."""
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
