"""A fast writer of ``torch.save`` bytes for small records saved over and over.

Contract
- In: a CPU tensor, or a ``dict`` with ``str`` keys whose values are such tensors or
  ``int``/``float``/``str``/``bool``/``None`` (the ``.precomputed`` records). A tensor qualifies
  when it is a plain ``torch.Tensor`` (no subclass), dense, strided, contiguous, of a plain
  real dtype, starts its own storage and fills it exactly (``storage_offset() == 0``,
  ``nbytes == numel * itemsize``), has no ``requires_grad``, hooks, neg bit or Python
  attributes, and shares its storage with no other tensor of the record.
- Out: exactly the bytes ``torch.save(obj, io.BytesIO())`` writes, byte for byte (torch's save
  settings, ``torch.utils.serialization.config``, are part of the structure).
- Anything else (another type, a view into a larger storage, a non-contiguous tensor, str
  values that ``pickle`` could memoise against each other or against torch's own strings,
  CRCs turned off, ``skip_data``) goes to ``torch.save`` itself.

How: the bytes depend on the record's structure (key order, dtypes, shapes, strides, the
plain values) and on the tensors' raw bytes only through the storage records, their CRC32
fields and the last 20 digits of ``.data/serialization_id`` (a ``c10::hash_combine`` fold of
every record's CRC32, in write order). The first record of a structure is written with
``torch.save``; its zip is parsed into a template with those places blanked, which must
rebuild that very output before it is used (otherwise the structure always goes to
``torch.save``: this never returns bytes ``torch.save`` would not). Later records of the
structure copy the template, the tensors' bytes, and patch the CRCs and the digits.

Why: ``torch.save`` takes 60-90 us for a [4, 32, 32] latent, and its C++ zip writer releases and
re-takes the GIL several times per call, which costs milliseconds when other threads are busy.
This path takes ~7-9 us: a signature, one ``bytes.join`` and ``crc32`` (fed in chunks that keep
the GIL for small tensors).
"""

from __future__ import annotations

import ctypes
import io
import struct
import zlib
from typing import Any

import torch
from torch.utils.serialization import config as _config

from shardsmith.torch_zip import LOCAL, NotPlainZip, central_directory

_U32 = struct.Struct("<I")
_DESCRIPTOR = 0x08074B50  # "PK\x07\x08": a data descriptor (CRC, sizes) after a record's data
_ID = ".data/serialization_id"

_M64 = (1 << 64) - 1
_MAX_TEMPLATES = 256
# zlib.crc32 releases (and must re-take) the GIL on buffers over 5 KiB; up to _CRC_KEEP_GIL bytes
# we feed it chunks of _CRC_CHUNK so that it never does, beyond that the release is worth it
_CRC_CHUNK = 4096
_CRC_KEEP_GIL = 1 << 18

_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                     torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})
_PLAIN = frozenset({int, str, bool, type(None)})  # and float, keyed by its bits
# strings torch's pickler writes for a tensor (persistent id tag, location); a record's str equal
# to one of them, or to a storage key ("0", "1", ...), might be the same object, which pickle
# would memoise, so such records go to torch.save
_TORCH_STRS = frozenset({"storage", "cpu"})

# signature -> _Template, or None: "always torch.save"
_templates: dict[tuple, _Template | None] = {}
# approximate counters (not locked), for tests and curiosity
stats = {"hit": 0, "built": 0, "refused": 0, "fallback": 0}


class _Template:
    """torch.save's output cut into constant pieces and slots (None) for what varies."""

    __slots__ = ("parts", "tensors", "seed0", "post", "id_slot", "id_crc0", "id_crc_slots")

    def __init__(self, parts, tensors, seed0, post, id_slot, id_crc0, id_crc_slots):
        self.parts = parts  # list of bytes; slots are None
        self.tensors = tensors  # per non-empty storage: (tensor index, data slot, CRC slots, ctypes type)
        self.seed0 = seed0  # hash_combine fold of the CRCs written before the storages
        self.post = post  # CRCs of the records written after the storages
        self.id_slot = id_slot  # the last 20 digits of the serialization id
        self.id_crc0 = id_crc0  # crc32 of its first 20 digits
        self.id_crc_slots = id_crc_slots


def _combine(seed: int, v: int) -> int:
    """``c10::hash_combine`` on a 64-bit ``size_t``."""
    return (seed ^ ((v + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2)) & _M64)) & _M64


def _tensor_sig(t: torch.Tensor) -> tuple | None:
    if (not t.is_cpu or t.layout is not torch.strided or t.dtype not in _DTYPES or t.requires_grad
            or t.is_nested or t.is_neg() or t._backward_hooks or t.__dict__ or t.storage_offset()
            or not t.is_contiguous()):
        return None
    return (t.dtype, t.shape, t.stride())


def _signature(obj: Any) -> tuple[tuple, list[torch.Tensor]] | None:
    """What fixes every byte but the storages' (and their CRCs), and the tensors in save order."""
    if type(obj) is torch.Tensor:
        sig = _tensor_sig(obj)
        if sig is None:
            return None
        tensors = [obj]
    elif type(obj) is dict:
        tensors, parts = [], []
        for k, v in obj.items():
            if type(k) is not str:
                return None
            tv = type(v)
            if tv is torch.Tensor:
                ts = _tensor_sig(v)
                if ts is None:
                    return None
                tensors.append(v)
                parts.append((k, ts))
            elif tv is float:  # by its bits: -0.0 == 0.0, nan != nan
                parts.append((k, float, struct.pack("<d", v)))
            elif tv in _PLAIN:
                parts.append((k, tv, v))
            else:
                return None
        sig = tuple(parts)
    else:
        return None
    if len(tensors) == 1:
        t = tensors[0]
        if t.untyped_storage().nbytes() != t.numel() * t.element_size():
            return None  # a view into a larger storage
    else:
        seen = set()
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes() != t.numel() * t.element_size() or s._cdata in seen:
                return None
            seen.add(s._cdata)
    if torch.serialization._serialization_tls.skip_data:
        return None
    # torch.save's settings (crc32 on/off, storage alignment): any change is another structure
    return (type(obj), _config.get_hash(), sig), tensors


def _strs_ok(obj: Any) -> bool:
    """No str of the record can be the same object as another one it pickles (a function of the
    signature, so checked when a template is built)."""
    if type(obj) is not dict:
        return True
    strs = list(obj) + [v for v in obj.values() if type(v) is str]
    return len(set(strs)) == len(strs) and _TORCH_STRS.isdisjoint(strs) and not any(s.isdigit() for s in strs)


def _crc(view: memoryview) -> int:
    n = len(view)
    if n > _CRC_KEEP_GIL:
        return zlib.crc32(view)
    crc = 0
    for i in range(0, n, _CRC_CHUNK):
        crc = zlib.crc32(view[i:i + _CRC_CHUNK], crc)
    return crc


def _render(tpl: _Template, tensors: list[torch.Tensor]) -> bytes:
    return _render_at(tpl, [t.data_ptr() for t in tensors])


def _render_at(tpl: _Template, addresses: list[int]) -> bytes:
    """The template filled with the storages' bytes found at ``addresses`` (one per tensor)."""
    parts = tpl.parts.copy()
    seed = tpl.seed0
    for i, data_slot, crc_slots, ctype in tpl.tensors:
        src = ctype.from_address(addresses[i])
        parts[data_slot] = src
        crc = _crc(memoryview(src))
        packed = _U32.pack(crc)
        for s in crc_slots:
            parts[s] = packed
        seed = _combine(seed, crc)
    for crc in tpl.post:
        seed = _combine(seed, crc)
    digits = b"%020d" % seed
    parts[tpl.id_slot] = digits
    packed = _U32.pack(zlib.crc32(digits, tpl.id_crc0))
    for s in tpl.id_crc_slots:
        parts[s] = packed
    return b"".join(parts)


def _build(data: bytes, tensors: list[torch.Tensor]) -> _Template | None:
    """The template of ``data`` (torch.save's bytes), or None where it is not the plain layout."""
    try:
        records, cd_off = central_directory(data)
    except NotPlainZip:
        return None
    # (local offset, name, crc, size, central crc position)
    recs = [(r.local, r.name.decode("ascii"), r.crc, r.size, r.cd_crc_pos) for r in records]
    recs.sort()  # write order
    prefix = recs[0][1].split("/", 1)[0] + "/"
    cuts = []  # (position, length, what): the bytes that vary
    storages, fold, id_crc0 = {}, [], None  # fold: the hash_combine inputs, in write order
    for local, name, crc, size, cd_crc in recs:
        lsig, _need, flags, _method, _t, _dt, lcrc, _cs, _us, lnlen, lxlen = LOCAL.unpack_from(data, local)
        start = local + 30 + lnlen + lxlen
        end = start + size
        if lsig != 0x04034B50 or not name.startswith(prefix) or zlib.crc32(data[start:end]) != crc:
            return None
        if flags & 8:  # CRC in a data descriptor after the data (the local header's is 0)
            if (lcrc != 0 or end + 16 > cd_off or _U32.unpack_from(data, end)[0] != _DESCRIPTOR
                    or _U32.unpack_from(data, end + 4)[0] != crc):
                return None
            crc_pos = (cd_crc, end + 4)
        else:  # CRC in the local header (torch writes empty records so)
            if lcrc != crc or end > cd_off:
                return None
            crc_pos = (cd_crc, local + 14)
        rest = name[len(prefix):]
        if rest.startswith("data/") and rest[5:].isdigit():
            i = int(rest[5:])
            if i in storages or i >= len(tensors) or rest[5:] != str(i):
                return None
            t = tensors[i]
            if size != t.numel() * t.element_size():
                return None
            storages[i] = size
            if size:  # an empty record is constant (CRC 0) and left out of the fold
                fold.append(i)
                cuts.append((start, size, ("data", i)))
                cuts.extend((p, 4, ("crc", i)) for p in crc_pos)
        elif rest == _ID:
            if id_crc0 is not None or size != 40 or not data[start:end].isdigit():
                return None
            id_crc0 = zlib.crc32(data[start:start + 20])
            cuts.append((start + 20, 20, ("id",)))
            cuts.extend((p, 4, ("idcrc",)) for p in crc_pos)
        elif size:
            fold.append(("const", crc))
    if id_crc0 is None or len(storages) != len(tensors):
        return None
    # the non-empty storages must be written back to back, in key order
    stored = [i for i in range(len(tensors)) if storages[i]]
    first = next((j for j, c in enumerate(fold) if type(c) is int), len(fold))
    after = fold[first + len(stored):]
    if fold[first:first + len(stored)] != stored or any(type(c) is int for c in after):
        return None
    seed0 = 0
    for _c, crc in fold[:first]:
        seed0 = _combine(seed0, crc)
    post = tuple(crc for _c, crc in after)

    cuts.sort()
    parts, slots, at = [], {}, 0
    for p, n, what in cuts:
        if p < at:
            return None  # overlapping places
        parts.append(data[at:p])
        slots.setdefault(what, []).append(len(parts))
        parts.append(None)
        at = p + n
    parts.append(data[at:])
    storage_slots = tuple((i, slots[("data", i)][0], tuple(slots[("crc", i)]), ctypes.c_ubyte * storages[i])
                          for i in stored)
    return _Template(parts, storage_slots, seed0, post, slots[("id",)][0], id_crc0, tuple(slots[("idcrc",)]))


def _torch_save(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def pt_bytes_fast(obj: Any) -> bytes:
    """``torch.save(obj)``'s bytes; from a checked template after the first record of a structure."""
    found = _signature(obj)
    if found is None:
        stats["fallback"] += 1
        return _torch_save(obj)
    sig, tensors = found
    tpl = _templates.get(sig, False)
    if tpl:
        stats["hit"] += 1
        return _render(tpl, tensors)
    data = _torch_save(obj)
    if tpl is None:  # refused before
        stats["fallback"] += 1
        return data
    try:
        tpl = _build(data, tensors) if _strs_ok(obj) else None
        # the check: with every varying byte cut out, the template must give back torch.save's output
        if tpl is not None and _render(tpl, tensors) != data:
            tpl = None
    except Exception:  # a layout this parser does not follow: torch.save for this structure
        tpl = None
    if len(_templates) >= _MAX_TEMPLATES:
        _templates.clear()
    _templates[sig] = tpl
    stats["built" if tpl is not None else "refused"] += 1
    return data


def pt_bytes_rows(batch: torch.Tensor) -> list[bytes]:
    """``[pt_bytes_fast(batch[i].clone()) for i in range(len(batch))]``: ``torch.save``'s bytes of
    each row as a tensor of its own, but rendered straight from the batch's memory with one
    template, without making a tensor per row (each one a torch call that gives up the GIL, which
    costs milliseconds a batch when other threads want it). A batch that is not a contiguous CPU
    tensor of a plain dtype, or a row structure that has no template, goes row by row."""
    n = batch.shape[0] if batch.dim() else 0
    if n == 0:
        return []
    first = batch[0].clone()
    out = [pt_bytes_fast(first)]
    found = _signature(first)
    tpl = _templates.get(found[0]) if found is not None else None
    if (not tpl or type(batch) is not torch.Tensor or not batch.is_cpu or not batch.is_contiguous()
            or batch.is_neg() or batch.is_conj() or batch.dtype not in _DTYPES):
        return out + [pt_bytes_fast(batch[i].clone()) for i in range(1, n)]
    step = first.numel() * first.element_size()
    base = batch.data_ptr()
    out += [_render_at(tpl, [base + i * step]) for i in range(1, n)]
    stats["hit"] += n - 1
    return out
