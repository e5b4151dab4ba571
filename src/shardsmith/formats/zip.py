"""The EDM / FastGen class-conditional ZIP layout.

Uncompressed, members ``{idx[:5]}/img{idx:08d}.png`` (EDM's ``dataset_tool``) and a
``dataset.json`` = ``{"labels": [[member, int], ...]}`` or ``{"labels": null}``.
"""

from __future__ import annotations

ZIP_LABELS_FILE = "dataset.json"
ZIP_EXT = ".zip"


def zip_member_name(index: int) -> str:
    """EDM dataset_tool layout: ``12 -> "00000/img00000012.png"``."""
    s = f"{index:08d}"
    return f"{s[:5]}/img{s}.png"


def is_zip_file_name(name: str) -> bool:
    """A dataset file is read as an EDM ZIP when its name ends in ``.zip`` (any case)."""
    return name.lower().endswith(ZIP_EXT)
