"""Worker results whose large arrays travel through shared memory instead of the pool's one pipe.

Why: a process pool sends every result back through one pipe, one worker at a time (the others wait
for its write lock) and one reader thread; a chunk of decoded audio or pixels is megabytes, copied
four times on the way (pickle, pipe write, pipe read, unpickle).

Contract
- ``ResultFolder.create()``: a folder of this process in ``/dev/shm`` (None where there is no tmpfs
  there with :data:`MIN_FREE` bytes free: results then travel as before). Folders left by a build that
  was killed (``shardsmith-results-<pid>-*`` of a process that is gone) are removed first: they hold
  only this module's files.
- ``pack(obj, folder)`` (a worker): ``obj`` pickled with protocol 5; every buffer of at least
  :data:`OUT_OF_BAND` bytes (a contiguous numpy array) goes into one file of ``folder``, the rest of
  the pickle (small) travels in the returned :class:`Packed`. Nothing large, or the file cannot be
  written (tmpfs full): the whole pickle travels in the :class:`Packed` and no file is left.
- ``unpack(packed)`` (the caller): the object again, its arrays mapped from the file (no copy), which
  is unlinked at once; its memory goes back when the last array is gone. The mapping's pages are
  entered in one call (``MAP_POPULATE`` where the platform has it), not faulted in one at a time when
  the arrays are first read by a process whose other threads fault and map memory meanwhile. Arrays
  are writable. The arrays of one chunk share its file: an item still queued (a bucket that fills
  slowly) keeps its chunk-mates' bytes mapped with its own (up to a chunk's memory per such item, where
  unpickled arrays held only their own; a heavy item, a clip, travels alone).
- ``ResultFolder.close()`` removes the folder and anything never unpacked.
"""

from __future__ import annotations

import mmap
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path("/dev/shm")
PREFIX = "shardsmith-results-"
OUT_OF_BAND = 16 * 1024  # smaller buffers stay in the pickle
MIN_FREE = 1 << 30  # a tmpfs with less free (a container's default 64 MB /dev/shm) is not used
ALIGN = 64
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # (Linux)


@dataclass
class Packed:
    """A pickled result: ``data`` (protocol 5) and, with ``path``, the file holding its out-of-band
    buffers at ``spans`` (offset, bytes)."""

    data: bytes
    path: str | None = None
    size: int = 0
    spans: tuple[tuple[int, int], ...] = ()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(root: Path) -> None:
    """Remove the result folders of processes that are gone (a build killed with ``kill -9``)."""
    for d in root.glob(PREFIX + "*"):
        pid = d.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


class ResultFolder:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, root: Path = ROOT) -> "ResultFolder | None":
        try:
            st = os.statvfs(root)
            if not root.is_dir() or st.f_bavail * st.f_frsize < MIN_FREE:
                return None
            _sweep(root)
            return cls(Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)))
        except OSError:
            return None

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


_count = [0]


def pack(obj: Any, folder: str | None) -> Packed:
    bufs: list[memoryview] = []

    def take(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if folder is None or raw.nbytes < OUT_OF_BAND:
            return True  # in band
        bufs.append(raw)
        return False

    data = pickle.dumps(obj, protocol=5, buffer_callback=take)
    if not bufs:
        return Packed(data)
    spans, off = [], 0
    for b in bufs:
        spans.append((off, b.nbytes))
        off += -(-b.nbytes // ALIGN) * ALIGN
    _count[0] += 1
    path = os.path.join(folder, f"{os.getpid()}-{_count[0]}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            for (o, _), b in zip(spans, bufs):
                done = 0
                while done < b.nbytes:
                    done += os.pwrite(fd, b[done:], o + done)
            os.ftruncate(fd, off)
        finally:
            os.close(fd)
    except OSError:  # tmpfs full, folder gone: the pickle carries everything
        try:
            os.unlink(path)
        except OSError:
            pass
        return Packed(pickle.dumps(obj, protocol=5))
    return Packed(data, path, off, tuple(spans))


def unpack(p: Packed) -> Any:
    if p.path is None:
        return pickle.loads(p.data)
    fd = os.open(p.path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, p.size, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)
        os.unlink(p.path)
    view = memoryview(mm)
    return pickle.loads(p.data, buffers=[view[o:o + n] for o, n in p.spans])
