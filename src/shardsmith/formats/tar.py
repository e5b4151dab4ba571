"""Tar arithmetic and header reading, shared by the shard writer, the loader, inspect and repair.

A tar is 512-byte blocks: a header block per member (three more for a PAX long-name record),
the member's data padded to whole blocks, and two zero blocks at the end (``tarfile`` pads the
archive to a 20-block record).

:func:`tar_members` lists a tar's regular-file members from their headers only. ``tarfile``
costs a lot of pure Python per member (TarInfo objects, pax dicts, checks for every field);
grouping members into samples needs only each member's name, data offset and size, so the
reader below parses just those from the headers (ustar, GNU longname ``L``, pax ``x`` path/size
records), verifies each header's checksum, and skips data without reading it (``os.pread`` of
the header blocks only). Anything it does not know (v7 headers without the ustar magic,
base-256 sizes, pax global headers, sparse files, chained extension headers, a truncated or
garbled archive, ...) makes it give up, and the tar is listed with ``tarfile`` instead, so the
result (and the error raised for a broken tar) is always what ``tarfile`` gives.
"""

from __future__ import annotations

import logging
import os
import tarfile
import zlib
from typing import Optional

from shardsmith.errors import UserError

log = logging.getLogger(__name__)

BLOCK = tarfile.BLOCKSIZE  # 512
ZERO_BLOCK = bytes(BLOCK)
END_BYTES = 20 * BLOCK  # worst case of end-of-archive blocks plus record padding
PAX_LONG_NAME_BYTES = 3 * BLOCK  # bound of what a PAX long-name header and record add
MAX_USTAR_NAME = 99  # longer member names need a PAX record
EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


def padded(n: int) -> int:
    """``n`` bytes of member data rounded up to whole blocks."""
    return -(-n // BLOCK) * BLOCK


def padding(n: int) -> int:
    """Zero bytes that follow ``n`` bytes of member data."""
    return -n % BLOCK


def member_bytes(name: str, size: int) -> int:
    """Upper bound of the bytes one regular-file member of ``size`` bytes takes in a PAX-format tar
    written by ``tarfile``: its header (plus, for a long name, a PAX header and record bounded by
    three blocks) and its padded data; exact for names of at most 99 bytes."""
    pax = PAX_LONG_NAME_BYTES if len(name) > MAX_USTAR_NAME else 0
    return pax + BLOCK + padded(size)


def tar_header_ok(block: bytes) -> bool:
    """True for a 512-byte tar header block whose checksum is valid (an all-zero block is the end
    marker, not a header)."""
    if len(block) != BLOCK or not block.strip(b"\0"):
        return False
    try:
        stored = tarfile.nti(block[148:156])
    except (tarfile.InvalidHeaderError, ValueError):
        return False
    return stored in tarfile.calc_chksums(block)


def tar_header_name(block: bytes) -> str | None:
    """The member name in a header block's name field (ustar prefix ignored), or None when it is not
    legible text; meant for damaged headers, whose other fields cannot be trusted."""
    raw = block[:100].split(b"\0", 1)[0]
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if name and name.isprintable() else None


# ---------------------------------------------------------------------------- fast header reader

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
        if not (w0 <= off and off + BLOCK <= w0 + len(win)):
            w0, win = off, pread(fd, _WINDOW, off)
            if len(win) < BLOCK:
                raise _Unusual("truncated header")
        i = off - w0
        hdr = win[i:i + BLOCK]
        if hdr == ZERO_BLOCK:
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
        data = off + BLOCK
        nxt = data + ((size + BLOCK - 1) // BLOCK) * BLOCK
        if typ in _FILE_TYPES:
            if pax is not None:
                if "size" in pax:
                    try:
                        size = int(pax["size"])
                    except ValueError:
                        raise _Unusual("bad pax size") from None
                    nxt = data + ((size + BLOCK - 1) // BLOCK) * BLOCK
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
            buf = win[i + BLOCK:i + BLOCK + size] if data + size <= w0 + len(win) else pread(fd, size, data)
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


class ShardUnreadable(UserError, tarfile.ReadError):
    """A shard ``tarfile`` cannot list (raised by ``loaders.shard_reader.shard_samples``) (truncated, empty, not a tar): names the shard and the way on
    (``shardsmith inspect`` says where it breaks, ``shardsmith repair`` keeps every intact sample).
    A :class:`~shardsmith.errors.UserError` (one ``error:`` line, exit 2, in the commands that read a
    dataset: scan, decode) and a ``tarfile.ReadError`` (what callers already catch)."""

    def __init__(self, path, why: str):
        self.path, self.why = os.fspath(path), why
        folder = os.path.dirname(self.path) or "."
        super().__init__(f"{self.path} is not a readable tar shard ({why}); shardsmith inspect {folder} says "
                         f"where it breaks, shardsmith repair {folder} keeps every intact sample")

    def __reduce__(self):  # rebuilt in the process it reaches (a DataLoader worker's error)
        return type(self), (self.path, self.why)


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
