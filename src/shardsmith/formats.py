"""Format knowledge shared by the sinks (writers) and the loaders/verifiers (readers).

WebDataset (FastGen flavour): ``NNNNN.tar`` shards directly in one folder, dot-free sample
keys, member names ``<key>.<suffix>``, ``shard_count.json`` = ``{"00000.tar": N}``,
``ignore_index.json`` = ``{"00000.tar": [key, ...]}``, ``repair.json`` = ``{"repairs": [event, ...]}``
(one event per shard a repair changed, appended across repairs; see ``verify.repair.RepairEvent``).

EDM class-conditional ZIP: uncompressed, members ``{idx[:5]}/img{idx:08d}.png`` and a
``dataset.json`` = ``{"labels": [[path, int], ...]}`` or ``{"labels": null}``.
"""

from __future__ import annotations

import hashlib
import re
import tarfile

SHARD_COUNT_FILE = "shard_count.json"
IGNORE_INDEX_FILE = "ignore_index.json"
REPAIR_FILE = "repair.json"
NEG_PROMPT_FILE = "neg_prompt_emb.npy"  # latent_wds: the negative prompt's embedding beside the shards
PRECOMPUTED_STAMP = "shardsmith.json"  # .precomputed/: the encoders and buckets its caches were made with
HOLDOUT_DIR = "holdout"  # the held-out split's outputs, below the build folder
MANIFEST_FILE = "manifest.json"
LEDGER_FILE = ".shardsmith/ledger.sqlite"
STATE_DIR = ".shardsmith"
LOCK_FILE = ".shardsmith/lock"  # fcntl.flock, held by a build or repair for its whole life
ZIP_LABELS_FILE = "dataset.json"

#: member suffixes the webdataset default decoders understand for images
IMAGE_SUFFIXES = ("jpg", "png", "webp")

_MEMBER_RE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]+)$")  # webdataset's base_plus_ext split
_KEY_BAD = re.compile(r"[^A-Za-z0-9_-]+")
MAX_KEY_LEN = 96


def shard_name(index: int) -> str:
    """``3 -> "00003.tar"``; refuses negative indices."""
    if index < 0:
        raise ValueError(f"shard index must be >= 0, got {index}")
    return f"{index:05d}.tar"


def shard_index(name: str) -> int:
    """Inverse of :func:`shard_name`; raises ``ValueError`` for any other name."""
    m = re.fullmatch(r"(\d{5,})\.tar", name)
    if not m:
        raise ValueError(f"not a shard name: {name!r} (expected NNNNN.tar)")
    return int(m.group(1))


def sanitize_key(text: str) -> str:
    """Turn a relative path (without extension) into a dot-free WebDataset key.

    Anything outside ``[A-Za-z0-9_-]`` becomes ``_``; the result is never empty and at most
    ``MAX_KEY_LEN`` characters. Uniqueness is the caller's job (see :func:`unique_key`).
    """
    key = _KEY_BAD.sub("_", text).strip("_")
    if not key:
        key = "item"
    return key[:MAX_KEY_LEN]


def without_suffix(path: str) -> str:
    """``path`` (``/``-separated) without its last name's suffix, exactly as
    ``str(PurePosixPath(path).with_suffix(""))`` but on the string (the planner calls it per item):
    ``"a/b.c.jpg"`` -> ``"a/b.c"``; a leading or trailing dot is not a suffix (``".x"``, ``"a."``)."""
    name = path.rpartition("/")[2]
    dot = name.rfind(".")
    return path[:len(path) - len(name) + dot] if 0 < dot < len(name) - 1 else path


def key_base(source_name: str, relpath: str, item_id: str) -> str:
    """The sample key the planner gives an item before uniqueness: ``<source>_<relpath without
    its suffix>`` (or the item id's part after the source), sanitised."""
    stem = without_suffix(relpath) if relpath else item_id.split("/", 1)[-1]
    return sanitize_key(f"{source_name}_{stem}")


def unique_key(base: str, item_id: str) -> str:
    """A collision-proof variant of ``base``: appends 8 hex chars of sha1(item_id)."""
    digest = hashlib.sha1(item_id.encode("utf-8")).hexdigest()[:8]
    return f"{base[: MAX_KEY_LEN - 9]}_{digest}"


def member_name(key: str, suffix: str) -> str:
    """Tar member name for one sample member; refuses keys that webdataset would split."""
    if "." in key or "/" in key:
        raise ValueError(f"sample key {key!r} contains '.' or '/', which splits the sample")
    return f"{key}.{suffix}"


def zip_member_name(index: int) -> str:
    """EDM dataset_tool layout: ``12 -> "00000/img00000012.png"``."""
    s = f"{index:08d}"
    return f"{s[:5]}/img{s}.png"


def split_member(name: str) -> tuple[str, str] | None:
    """webdataset's rule: ``"a/b.latent.pth" -> ("a/b", "latent.pth")``; None without a suffix.

    The key ends at the first dot of the basename, which is why keys must be dot-free.
    """
    m = _MEMBER_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


def numeric_stem(name: str) -> int | None:
    stem = name[:-4] if name.lower().endswith(".tar") else name
    return int(stem) if stem.isdigit() else None


def sort_shard_names(names) -> tuple[list[str], bool]:
    """FastGen's shard order: by ``int(stem)`` when every stem is numeric, else by name.

    Returns (sorted names, whether the order was numeric).
    """
    names = list(names)
    if all(numeric_stem(n) is not None for n in names):
        return sorted(names, key=lambda n: (numeric_stem(n), n)), True
    return sorted(names), False


def tar_header_ok(block: bytes) -> bool:
    """True for a 512-byte tar header block whose checksum is valid (an all-zero block is the end
    marker, not a header)."""
    if len(block) != tarfile.BLOCKSIZE or not block.strip(b"\0"):
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
