"""How inspect judges one tar member on its own, by webdataset's and the loader's rules.

- :func:`split_member`: ``(key, suffix)`` by webdataset's rule (from ``formats.wds``), ``(None, None)``
  for a member without a suffix.
- :func:`unsafe_reason`: why extracting or copying a member could touch something outside the
  dataset, or ``None``.
- :func:`skip_reason`: why webdataset's tar iterator skips a member before grouping, or ``None``.
- :func:`check_member`: the error decoding a member as the loader would for its suffix, or ``None``.

Nothing here writes to disk.
"""

from __future__ import annotations

import tarfile
import warnings

from shardsmith.formats import wds as wds_layout
from shardsmith.loaders import decoders


def split_member(name: str) -> tuple[str | None, str | None]:
    """(key, suffix) by webdataset's rule, ``(None, None)`` for a member without a suffix."""
    return wds_layout.split_member(name) or (None, None)


def unsafe_reason(info: tarfile.TarInfo) -> str | None:
    """Why extracting or copying member ``info`` could touch something outside the dataset (an
    absolute name, a ``..`` component, a link, a device or fifo), or ``None`` for a safe member."""
    if info.name.startswith("/"):
        return "absolute path"
    # a plain split, not PurePosixPath(...).parts: pathlib interns every part, and that churn makes the
    # interpreter resize its table of interned strings (a few MiB, held twice meanwhile) once enough
    # members were read: a jump in peak memory that only a large dataset shows
    if ".." in info.name.split("/"):
        return "path with '..' (outside the folder)"
    if info.issym():
        return f"symbolic link to {info.linkname}"
    if info.islnk():
        return f"hard link to {info.linkname}"
    if info.ischr() or info.isblk():
        return "device file"
    if info.isfifo():
        return "fifo"
    return None


def skip_reason(name: str, data: bytes | None) -> str | None:
    """Why webdataset's tar iterator skips a member before grouping, or ``None``."""
    if data is None:
        return "not a regular file"
    if wds_layout.is_metadata_member(name):
        return "metadata member"
    return None


def check_member(suffix: str, data: bytes) -> str | None:
    """Decode ``data`` exactly as the loader would for ``suffix``; return the error or ``None``.

    Suffixes the loader has no decoder for (unknown kinds) are not decoded. Video members are
    decoded frame by frame without keeping the frames (a long clip would not fit in memory as
    the loader's all-frames uint8 array).
    """
    try:
        decoders.check_supported(suffix)
    except decoders.UnsupportedMemberError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ext = decoders.last_ext(suffix)
            if ext in decoders.VIDEO_EXTS:
                from shardsmith.loaders.video_decode import count_decodable_frames

                count_decodable_frames(data)
            elif ext in decoders.IMAGE_EXTS:
                decoders.check_image(data)  # the loader's decode, without a tensor (nor torch)
            else:
                decoders.decode_member(suffix, data)
    except Exception as e:  # noqa: BLE001 - every decode failure is reported, not raised
        cause = e.__cause__ or e
        msg = str(cause).splitlines()[0] if str(cause) else ""
        return f"{type(cause).__name__}: {msg}"[:300]
    return None
