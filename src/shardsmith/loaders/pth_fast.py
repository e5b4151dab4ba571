"""A fast, safe reader for the common case of ``torch.save`` bytes.

Contract
- In: the bytes of a file written by ``torch.save`` (zip format, PyTorch >= 1.6).
- Out: the same Python value ``torch.load(..., weights_only=True)`` returns, for the common
  case: tensors (dense, strided, any of the plain dtypes) inside dicts, lists, tuples and
  plain values. Every tensor has writable memory: a copy of its storage when given ``bytes``
  (or a read-only view), the given memory itself (no copy; the caller hands it over) when given
  a ``bytearray`` or a writable ``memoryview``.
- Anything else (a global outside the small allow-list below, compressed or zip64 records,
  big-endian data, tensors with hooks, metadata or ``requires_grad``, sizes that do not add
  up) raises :class:`NotFast`; :func:`load_pth_bytes` then hands the bytes to
  ``torch.load(weights_only=True)``, which decides. So nothing here widens what may be
  loaded: the allow-list is a subset of what ``weights_only`` accepts, and no pickled
  callable is ever called.

Why: ``torch.load`` spends ~0.5 ms per small member opening the archive and setting up its
unpickler; for latent shards of small tensors that is most of a loader's (and verify's) time.
This reader parses the zip's local headers with ``struct`` and unpickles with the C unpickler.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from typing import Any

import torch

from shardsmith.torch_zip import LOCAL, NotPlainZip, central_directory


_DTYPES = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}

_ITEMSIZE = {dt: torch.empty((), dtype=dt).element_size() for dt in _DTYPES.values()}


class NotFast(Exception):
    """These bytes are not the plain case this reader handles; use ``torch.load``."""


class _Storage:
    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


class _Zip:
    """The records of a ``torch.save`` zip (:mod:`shardsmith.torch_zip`); a record's bytes are
    located on demand."""

    def __init__(self, data: memoryview):
        self.data = data
        n = len(data)
        lay = _LAYOUTS.get(n)
        if lay is not None:  # same length as an earlier member: is it the same directory?
            cd_off, masked, crc_pos, entries = lay
            if _without_crcs(data, cd_off, crc_pos) == masked:
                self.cd_off, self.entries = cd_off, entries
                return
        try:
            records, self.cd_off = central_directory(data)
        except NotPlainZip as exc:
            raise NotFast(str(exc)) from None
        self.entries: dict[bytes, tuple[int, int]] = {r.name: (r.local, r.size) for r in records}
        if len(_LAYOUTS) < _MAX_PLANS or n in _LAYOUTS:
            crc_pos = tuple(r.cd_crc_pos - self.cd_off for r in records)
            _LAYOUTS[n] = (self.cd_off, _without_crcs(data, self.cd_off, crc_pos), crc_pos, self.entries)

    def get(self, name: bytes) -> memoryview | None:
        hit = self.entries.get(name)
        if hit is None:
            return None
        local, size = hit
        lsig, *_rest, lnlen, lxlen = LOCAL.unpack_from(self.data, local)
        start = local + 30 + lnlen + lxlen
        if lsig != 0x04034B50 or start + size > self.cd_off:
            raise NotFast("bad local header")
        return self.data[start:start + size]


def _without_crcs(data: memoryview, cd_off: int, crc_pos: tuple[int, ...]) -> bytearray:
    """The central directory and its end record (``data[cd_off:]``) with the CRC32s at ``crc_pos`` zeroed."""
    cd = bytearray(data[cd_off:])
    for p in crc_pos:
        cd[p:p + 4] = b"\0\0\0\0"
    return cd


def _rebuild_tensor(storage, offset, size, stride, requires_grad, hooks, metadata=None):
    if requires_grad or hooks or metadata:
        raise NotFast("tensor with requires_grad, hooks or metadata")
    base, _dtype = storage
    last = offset + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else offset - 1
    if offset < 0 or last >= base.numel() or any(st < 0 for st in stride):
        raise NotFast("tensor view outside its storage")
    return base.as_strided(tuple(size), tuple(stride), offset)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, records: _Zip, prefix: bytes, owned: bool):
        super().__init__(file)
        self._owned = owned
        self._records = records
        self._prefix = prefix
        self._cache: dict[str, tuple[torch.Tensor, torch.dtype]] = {}

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch" and name in _DTYPES:
            return _Storage(_DTYPES[name])
        raise NotFast(f"global {module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Storage)):
            raise NotFast("unknown persistent id")
        _, stype, key, _location, numel = pid
        got = self._cache.get(key)
        if got is None:
            raw = self._records.get(self._prefix + b"data/" + str(key).encode())
            dtype = stype.dtype
            if raw is None or len(raw) != numel * _ITEMSIZE[dtype]:
                raise NotFast("storage size mismatch")
            # writable memory for the tensor, like torch.load's: the caller's bytearray itself
            # (no copy), else a copy of the read-only bytes
            buf = raw if self._owned else bytearray(raw)
            base = torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)
            got = self._cache[key] = (base, dtype)
        return got


def load_fast(data: bytes | bytearray | memoryview) -> Any:
    """Load ``torch.save`` bytes through the fast path; :class:`NotFast` when it does not apply."""
    mv = memoryview(data)
    if len(mv) < 4 or bytes(mv[:4]) != b"PK\x03\x04":
        raise NotFast("not a zip-format torch.save file")
    records = _Zip(mv)
    pkl = next((n for n in records.entries if n.endswith(b"/data.pkl") and n.count(b"/") == 1), None)
    if pkl is None:
        raise NotFast("no data.pkl record")
    prefix = pkl[: -len(b"data.pkl")]
    order = records.get(prefix + b"byteorder")
    if order is not None and bytes(order) != b"little":
        raise NotFast("big-endian data")
    owned = isinstance(data, (bytearray, memoryview)) and not mv.readonly  # handed over: no copy
    pickled = records.get(pkl)
    plan_key = (prefix, bytes(pickled))
    plan = _PLANS.get(plan_key)
    if plan is not None:  # the same pickle as an earlier member: one tensor, rebuilt without unpickling
        key, dtype, numel, offset, size, stride = plan
        raw = records.get(prefix + b"data/" + key)
        if raw is None or len(raw) != numel * _ITEMSIZE[dtype]:
            raise NotFast("storage size mismatch")
        buf = raw if owned else bytearray(raw)
        base = torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)
        return base.as_strided(size, stride, offset)
    up = _Unpickler(io.BytesIO(pickled), records, prefix, owned)
    out = up.load()
    if type(out) is torch.Tensor and len(up._cache) == 1 and len(_PLANS) < _MAX_PLANS:
        (key, (base, dtype)), = up._cache.items()
        _PLANS[plan_key] = (str(key).encode(), dtype, base.numel(), out.storage_offset(), tuple(out.shape),
                            tuple(out.stride()))
    return out


# pickle bytes -> how to rebuild the single tensor they describe. Latent shards hold thousands
# of members with byte-identical pickles (same shape, dtype and record names; only the data
# differs), so after the first only the zip directory is compared (see _LAYOUTS)
_PLANS: dict[tuple[bytes, bytes], tuple[bytes, torch.dtype, int, int, tuple, tuple]] = {}
_MAX_PLANS = 256

# member length -> its central directory (from its offset to the end) with the records' CRC32s
# zeroed, and the records it lists. Members of a latent shard have the same length and the same
# directory but for the CRCs (the data differs): one bytes comparison of a few hundred bytes
# stands for the walk, and proves the same records at the same offsets with the same sizes
_LAYOUTS: dict[int, tuple[int, bytearray, tuple[int, ...], dict[bytes, tuple[int, int]]]] = {}


def load_pth_bytes(data) -> Any:
    """``torch.load(weights_only=True)`` semantics, through :func:`load_fast` when it applies."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return load_fast(data)
        except NotFast:
            pass
        except (pickle.UnpicklingError, EOFError, ValueError, struct.error, UnicodeDecodeError,
                IndexError, TypeError, RuntimeError):
            pass  # damaged bytes: torch.load gives the authoritative error
        data = io.BytesIO(bytes(data))
    return torch.load(data, map_location="cpu", weights_only=True)
