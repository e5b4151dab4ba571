"""Streaming a tar member by member, in order, past damaged headers.

:func:`iter_members` yields a :class:`Member` per member read intact and a :class:`Damage` per
header tarfile could not read; reading resumes at the next block whose header checksum is valid
(``formats.tar``), so a bad header costs one member, not the rest of the file. Where reading
stopped for good (a member cut short, no valid header after a damaged one, a missing
end-of-archive marker) is left in the caller's ``state``. Nothing here writes to disk.
"""

from __future__ import annotations

import tarfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from shardsmith.formats.tar import BLOCK, EXTENDED_TYPES, tar_header_name, tar_header_ok


@dataclass
class Member:
    """A member read intact: its header and its data (None for a non-regular member)."""

    info: tarfile.TarInfo
    data: bytes | None


@dataclass(frozen=True)
class Damage:
    """A header tarfile could not read, at byte ``offset``. Reading resumed at ``resume`` (the next
    block whose header checksum is valid), or never (None). ``name``: the member name still legible
    in the header; ``extended``: it looks like a PAX / GNU long-name header, whose member (read at
    ``resume``) lost its real name with it."""

    offset: int
    resume: int | None
    name: str | None
    extended: bool


_SCAN_CHUNK = 1 << 20  # bytes read at a time while looking for the next header (whole blocks)


def _next_header(f, start: int) -> int | None:
    """Offset of the first block at or after ``start`` (in whole blocks) whose header checksum is valid."""
    pos = start
    f.seek(pos)
    while chunk := f.read(_SCAN_CHUNK):
        for i in range(0, len(chunk) - BLOCK + 1, BLOCK):
            if tar_header_ok(chunk[i:i + BLOCK]):
                return pos + i
        pos += len(chunk)
    return None


def _members_from(f, pos: int, state: dict[str, Any]) -> Generator[Member, None, int]:
    """The members from byte ``pos`` on, until tarfile stops; returns the offset of the header it
    stopped at. A member cut short sets ``state["error"]`` and ends the file."""
    f.seek(pos)
    try:
        tar = tarfile.TarFile(fileobj=f, mode="r")
    except tarfile.ReadError:
        return pos
    while True:
        try:
            ti = tar.next()
        except tarfile.ReadError:
            return tar.offset
        if ti is None:
            return tar.offset
        data = None
        if ti.isreg():
            try:
                data = tar.extractfile(ti).read()
                if len(data) != ti.size:
                    raise tarfile.ReadError("unexpected end of data")
            except (tarfile.ReadError, EOFError, OSError) as e:
                size = state["file_size"]
                state["error"] = {
                    "kind": "truncated member",
                    "detail": f"{type(e).__name__}: {e}",
                    "member": ti.name,
                    "member_header_offset": ti.offset,
                    "member_size": ti.size,
                    "member_bytes_available": max(0, size - ti.offset_data),
                    "break_offset": size,
                }
                return size
        state["intact_members"] += 1
        state["intact_bytes"] = tar.offset  # tarfile has moved past the member's data
        yield Member(ti, data)
        tar.members = []


def _stop_error(block: bytes, stop: int, state: dict[str, Any]) -> dict[str, Any]:
    """``state["error"]`` for a file whose bytes at ``stop`` are not a whole header block."""
    size = state["file_size"]
    if state["intact_members"] or stop:
        return {"kind": "missing end-of-archive marker",
                "detail": f"file ends {size - stop} bytes after the last intact member",
                "member": None, "break_offset": size}
    return {"kind": "unreadable header", "detail": "the file is too short to be a tar" if block else "empty file",
            "member": None, "break_offset": 0}


def iter_members(path: Path, state: dict[str, Any]) -> Iterator[Member | Damage]:
    """Stream the members of ``path`` in order, resynchronising past damaged headers.

    Yields a :class:`Member` per member read intact and a :class:`Damage` per header that could not
    be read; reading goes on at the next block whose header checksum is valid. On exit ``state``
    holds ``intact_members``, ``intact_bytes`` (end of the last intact member), ``file_size`` and
    ``error``: None, or where reading stopped for good (a member cut short, a damaged header no
    valid one follows, a file that ends without its end-of-archive marker).
    """
    size = path.stat().st_size
    state.update(intact_members=0, intact_bytes=0, file_size=size, error=None)
    with open(path, "rb") as f:
        pos = 0
        while True:
            stop = yield from _members_from(f, pos, state)
            if state["error"] is not None:
                return
            f.seek(stop)
            block = f.read(BLOCK)
            if len(block) < BLOCK:
                state["error"] = _stop_error(block, stop, state)
                return
            if not block.strip(b"\0"):
                return  # the end-of-archive marker
            resume = _next_header(f, stop + BLOCK)
            extended = not tar_header_ok(block) and block[156:157] in EXTENDED_TYPES
            yield Damage(stop, resume, tar_header_name(block), extended)
            if resume is None:
                state["error"] = {"kind": "unreadable header",
                                  "detail": "no valid tar header follows the damaged one",
                                  "member": None, "break_offset": stop}
                return
            pos = resume
