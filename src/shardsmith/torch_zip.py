"""The container of ``torch.save`` files: an uncompressed zip, read through its central
directory (torch writes record sizes there, not in the local headers).

Contract
- ``central_directory(data)`` -> ``(records, cd_off)``: every record of the archive in
  central-directory order, each with its name, local-header offset, size, CRC32 and where that
  CRC sits in the central directory. Raises :class:`NotPlainZip` for anything but the plain
  layout: a zip comment or truncation, zip64, a compressed record.
- ``LOCAL``: the 30-byte local file header struct (callers locate a record's bytes with it).

Used by the fast ``.pth`` reader (``loaders.pth_fast``) and the fast writer (``sinks.pt_write``).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

EOCD = struct.Struct("<IHHHHIIH")  # end of central directory, 22 bytes
CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory entry, 46 bytes
LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header, 30 bytes


class NotPlainZip(Exception):
    """Not the plain uncompressed, non-zip64 layout ``torch.save`` writes."""


class Record(NamedTuple):
    name: bytes
    local: int  # offset of the local file header
    size: int
    crc: int
    cd_crc_pos: int  # offset of this record's CRC32 in the central directory


def central_directory(data) -> tuple[list[Record], int]:
    """The records of ``data`` (bytes or a memoryview) and the central directory's offset."""
    eocd = len(data) - EOCD.size
    if eocd < 0 or EOCD.unpack_from(data, eocd)[0] != 0x06054B50:
        raise NotPlainZip("no plain end-of-central-directory record (zip comment or truncated)")
    _sig, _disk, _cd_disk, _n_here, count, _cd_size, cd_off, _clen = EOCD.unpack_from(data, eocd)
    if cd_off == 0xFFFFFFFF or count == 0xFFFF or cd_off > eocd:
        raise NotPlainZip("zip64 archive")
    records = []
    pos = cd_off
    unpack = CENTRAL.unpack_from
    for _ in range(count):
        if pos + 46 > eocd:
            raise NotPlainZip("truncated central directory")
        (sig, _made, _need, _flags, method, _t, _d, crc, csize, usize, nlen, xlen, clen,
         _dk, _ia, _ea, local) = unpack(data, pos)
        if sig != 0x02014B50 or method != 0 or csize != usize or 0xFFFFFFFF in (csize, local):
            raise NotPlainZip("compressed or zip64 record")
        records.append(Record(bytes(data[pos + 46:pos + 46 + nlen]), local, csize, crc, pos + 16))
        pos += 46 + nlen + xlen + clen
    return records, cd_off
