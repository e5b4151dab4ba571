"""The EDM / FastGen class-conditional ZIP layout.

Uncompressed, members ``{idx[:5]}/img{idx:08d}.png`` (EDM's ``dataset_tool``; readers also take
other image suffixes and ``.npy`` arrays) with fixed timestamps, and a ``dataset.json`` =
``{"labels": [[member, int], ...]}`` or ``{"labels": null}``. The latent ZIP (EDM2 / FastGen's
``imagenet_256_sd.zip``) is the same layout with members ``{idx[:5]}/img-mean-std-{idx:08d}.npy``:
float32 ``[2C, H/f, W/f]``, the VAE posterior's mean then its std.
"""

from __future__ import annotations

import json
import zipfile
from typing import Any

from shardsmith.atomic import loads_json

ZIP_LABELS_FILE = "dataset.json"
ZIP_EXT = ".zip"
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
ARRAY_EXT = ".npy"
_DATE = (1980, 1, 1, 0, 0, 0)
ZIP_FORMATS = ("zip", "latent_zip")  # the output formats written as one ZIP file (their ``path``)
LATENT_MEMBER = "npy"  # a latent ZIP sample's one member (its suffix): the .npy bytes


def zip_member_name(index: int) -> str:
    """EDM dataset_tool layout: ``12 -> "00000/img00000012.png"``."""
    s = f"{index:08d}"
    return f"{s[:5]}/img{s}.png"


def latent_zip_member_name(index: int) -> str:
    """EDM2 latent layout (FastGen's ``imagenet_256_sd.zip``): ``12 -> "00000/img-mean-std-00000012.npy"``."""
    s = f"{index:08d}"
    return f"{s[:5]}/img-mean-std-{s}{ARRAY_EXT}"


def is_zip_file_name(name: str) -> bool:
    """A dataset file is read as an EDM ZIP when its name ends in ``.zip`` (any case)."""
    return name.lower().endswith(ZIP_EXT)


def is_sample_member(name: str) -> bool:
    """A member a reader takes as one sample: an image or a ``.npy`` array (any case)."""
    return name.lower().endswith(IMAGE_EXTS + (ARRAY_EXT,))


def zip_entry(name: str) -> zipfile.ZipInfo:
    """The entry of one member as shardsmith writes it: stored, dated 1980-01-01, mode 0644."""
    zi = zipfile.ZipInfo(name, date_time=_DATE)
    zi.compress_type = zipfile.ZIP_STORED
    zi.create_system = 3
    zi.external_attr = 0o644 << 16
    return zi


def labels_document(rows: list[list[Any]] | None) -> str:
    """``dataset.json``'s text for ``[[member, label], ...]`` (``None``: an unlabelled dataset)."""
    return json.dumps({"labels": rows})


def read_labels(zf: zipfile.ZipFile) -> list[list[Any]] | None:
    """The ``labels`` rows of an open ZIP's ``dataset.json``; None without the file or labels."""
    if ZIP_LABELS_FILE not in zf.namelist():
        return None
    return (loads_json(zf.read(ZIP_LABELS_FILE)) or {}).get("labels")
