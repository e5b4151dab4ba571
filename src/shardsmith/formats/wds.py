"""The WebDataset layout (FastGen flavour), as written by the sinks and read by loaders, verify,
inspect and repair.

``NNNNN.tar`` shards directly in one folder, dot-free sample keys, member names
``<key>.<suffix>`` (webdataset splits a name at the first dot of its basename), and beside the
shards ``shard_count.json`` = ``{"00000.tar": N}``, ``ignore_index.json`` =
``{"00000.tar": [key, ...]}``, ``repair.json`` = ``{"repairs": [event, ...]}`` (one event per
shard a repair changed, appended across repairs; see ``verify.repair.RepairEvent``) and, for
latent outputs, ``neg_prompt_emb.npy``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from collections.abc import Iterable
from typing import Any, NamedTuple

from shardsmith.atomic import read_json
from shardsmith.errors import UserError
from shardsmith.formats.tar import member_bytes

SHARD_COUNT_FILE = "shard_count.json"
IGNORE_INDEX_FILE = "ignore_index.json"
REPAIR_FILE = "repair.json"
NEG_PROMPT_FILE = "neg_prompt_emb.npy"  # latent_wds: the negative prompt's embedding beside the shards
# the manifest key (beside ``neg_prompt_emb``, in ``outputs.NAME.files.SPLIT``) of that file's sha256
NEG_PROMPT_SHA_KEY = "neg_prompt_emb_sha256"
# a multi-bucket output: one WebDataset folder per bucket (``<bucket>/`` named ``WxHxF``, or ``audio_<ms>ms``
# for an audio-only dataset's durations, each with
# its shard_count.json) and this index beside them: {bucket: {dir, samples, shards, latent_shape}}
BUCKETS_INDEX_FILE = "buckets.json"
KD_INDEX_FILE = "index.json"  # kd_wds: path_timesteps, solver, teacher and every sample's seed (formats/kd.py)
SHARD_EXT = ".tar"
BACKUP_SUFFIX = ".orig"  # repair keeps a rewritten file's original bytes under its name plus this
#: files a WebDataset output folder holds beside its shards (repair's and latent outputs' included)
INDEX_FILES = (SHARD_COUNT_FILE, IGNORE_INDEX_FILE, REPAIR_FILE, NEG_PROMPT_FILE, BUCKETS_INDEX_FILE, KD_INDEX_FILE)

# member suffixes (FastGen's key_map values)
JPG, PNG, TXT, JSON, MP4 = "jpg", "png", "txt", "json", "mp4"
WAV, FLAC = "wav", "flac"  # video_wds with ``audio: wav | flac``: the clip's audio over the written frames
LATENT = "latent.pth"  # cached latents
TEXT_EMB = "txt_emb.pth"  # text-encoder embeddings
REF_LATENT = "ref_latent.pth"  # IC-LoRA: the reference's latents, cut with the target's geometry
SRC_LATENT = "src_latent.pth"  # image editing: the source image's latents
FIRST_FRAME_JPG = "first_frame.jpg"  # image-conditioned video: the target's first frame after its crop
FIRST_FRAME_LATENT = "first_frame_latent.pth"  # ... and its latents
MASK = "mask.pth"  # inpainting: the mask on the latent grid [F', H', W'] float32 0/1
REF_AUDIO_LATENT = "ref_audio_latent.pth"  # IC-LoRA with audio: the reference's audio latents [C, T, F]
AUDIO_MASK = "audio_mask.pth"  # audio inpainting: the mask on the audio latent's steps [T] float32 0/1
CAMERA = "camera.npy"  # camera-controlled video: [F, 20] float32 (extrinsics row-major, fx fy cx cy)
#: a partner's latent member in a latent_wds sample, by partner name
PARTNER_LATENTS = {"reference": REF_LATENT, "source": SRC_LATENT, "first_frame": FIRST_FRAME_LATENT}
SRC_JPG = "src.jpg"  # image editing (raw wds): the edit's source image, cut with the target's geometry


def source_member(ext: str) -> str:
    """The member of an edit pair's source image beside a target member of suffix ``ext``
    (``"jpg" -> "src.jpg"``): same format, same sample key."""
    return f"src.{ext}"


AUDIO_LATENT = "audio_latent.pth"  # cached audio latents [C, T, F] (float32, as the LTX trainer stores them)
NOISE = "noise.pth"  # KD pair: the noise a teacher trajectory started from
PATH = "path.pth"  # KD path: the teacher's trajectory

_META_RE = re.compile(r"__[^/]*__($|/)")  # webdataset's metadata members (``__key__``, ``__x__/y``)
_MEMBER_RE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]+)$")  # webdataset's base_plus_ext split
_KEY_BAD = re.compile(r"[^A-Za-z0-9_-]+")
MAX_KEY_LEN = 96

MemberRef = tuple[int, int]  # (data offset, size) of one member inside its shard


# ---------------------------------------------------------------------------- names

def shard_name(index: int) -> str:
    """``3 -> "00003.tar"``; refuses negative indices."""
    if index < 0:
        raise ValueError(f"shard index must be >= 0, got {index}")
    return f"{index:05d}.tar"


_AUDIO_BUCKET_RE = re.compile(r"audio_(\d+(?:p\d+)?)ms")


def audio_bucket(seconds: float) -> str:
    """The bucket of an audio-only sample cut to ``seconds`` (one of ``audio.durations``):
    ``4.0 -> "audio_4000ms"``, ``0.0125 -> "audio_12p5ms"`` (a name that is a folder and a Python identifier)."""
    ms = float(seconds) * 1000
    text = str(round(ms)) if abs(ms - round(ms)) < 1e-6 else f"{ms:.6f}".rstrip("0").replace(".", "p")
    return f"audio_{text}ms"


def is_audio_bucket(name: str) -> bool:
    """Whether ``name`` is an audio duration's bucket (:func:`audio_bucket`)."""
    return _AUDIO_BUCKET_RE.fullmatch(name) is not None


def bucket_frames(bucket: str) -> int:
    """The video frames of a sample of ``bucket``: ``F`` of ``WxHxF``; 0 for an audio duration's bucket."""
    return 0 if is_audio_bucket(bucket) else int(bucket.rsplit("x", 1)[1])


def is_bucket_folder(name: str) -> bool:
    """Whether ``name`` is a bucket folder's name of a multi-bucket output: ``WxHxF``, or an audio
    duration's (:func:`audio_bucket`)."""
    return re.fullmatch(r"\d+x\d+x\d+", name) is not None or is_audio_bucket(name)


def bucket_folder(bucket: str) -> str:
    """The folder of a bucket's shards in a multi-bucket output: the bucket itself (``WxHxF`` or
    ``audio_<ms>ms``)."""
    if not is_bucket_folder(bucket):
        raise ValueError(f"not a bucket: {bucket!r} (expected WxHxF or audio_<ms>ms)")
    return bucket


class BucketsIndexError(UserError, ValueError):
    """``buckets.json`` of a multi-bucket output that cannot be used as it is (not a JSON object of entries, an
    entry that is not ``{"dir": <a folder beside it>, "samples": <int>, ...}``): names the file, the entry and
    the fix. A :class:`~shardsmith.errors.UserError` (one ``error:`` line, exit 2, where a loader or a source
    reads the dataset; verify and inspect make it a failed check) and a ``ValueError``."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = path, what
        super().__init__(
            f"{path} is damaged: {what}. It lists each bucket of a multi-bucket output as "
            '{"WxHxF": {"dir": "WxHxF", "samples": N, ...}}, dir the name of the bucket\'s folder beside it (no '
            "path: nothing outside the dataset is read); restore it from a copy of the dataset, or correct the "
            "entry (a build names each bucket's folder after the bucket), or rebuild the output (the build's "
            "command with --overwrite)")


def _plain_child_name(name: Any) -> bool:
    """Whether ``name`` names a folder directly inside another: a non-empty string with no separator or NUL,
    not ``.`` / ``..``."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def read_buckets_index(folder: str | os.PathLike) -> dict[str, dict[str, Any]] | None:
    """``buckets.json`` of a multi-bucket output folder, or None for a one-folder dataset (no such file).

    The one reader of the file: every entry is checked, and each is returned as a copy whose ``dir`` is set
    (the bucket's own name when the entry has none, as a build names its folders) and whose ``samples`` is an
    int (0 when the entry has none). :class:`BucketsIndexError` (naming the entry) for a file that cannot be
    read or is not JSON, a bucket that is not a bucket's name (``WxHxF``, ``audio_<ms>ms``), an entry that is
    not an object, ``samples`` that is not a whole number >= 0, a ``dir`` that is not a plain child folder name
    (``../x``, ``a/b``, an absolute path: the dataset's shards never lie outside its folder) or that two
    buckets share."""
    path = Path(folder) / BUCKETS_INDEX_FILE
    if not path.is_file():
        return None
    try:
        raw = read_json(path)
    except OSError as exc:
        raise BucketsIndexError(path, f"it cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise BucketsIndexError(path, f"it is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise BucketsIndexError(path, f"it holds a JSON {type(raw).__name__}, not an object of buckets")
    index: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}  # dir -> the bucket whose folder it is
    for bucket, entry in raw.items():
        if not is_bucket_folder(bucket):
            raise BucketsIndexError(path, f"{bucket!r} is not a bucket (WxHxF, or audio_<ms>ms)")
        if not isinstance(entry, dict):
            raise BucketsIndexError(path, f"the entry of bucket {bucket} is a JSON {type(entry).__name__}, not an "
                                          "object")
        samples = entry.get("samples", 0)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise BucketsIndexError(path, f"bucket {bucket}: samples is {samples!r}, not a whole number >= 0")
        d = entry.get("dir", bucket)
        if not _plain_child_name(d):
            raise BucketsIndexError(path, f"bucket {bucket}: dir {d!r} is not the name of a folder beside "
                                          f"{BUCKETS_INDEX_FILE}")
        if d in owner:
            raise BucketsIndexError(path, f"buckets {owner[d]} and {bucket} both name the folder {d!r}")
        owner[d] = bucket
        index[bucket] = {**entry, "dir": d, "samples": samples}
    return index


def shard_index(name: str) -> int:
    """Inverse of :func:`shard_name`; raises ``ValueError`` for any other name."""
    m = re.fullmatch(r"(\d{5,})\.tar", name)
    if not m:
        raise ValueError(f"not a shard name: {name!r} (expected NNNNN.tar)")
    return int(m.group(1))


def is_shard_file_name(name: str) -> bool:
    """The one rule for what counts as a shard: a name ending in ``.tar``, any case (FastGen's
    local ``get_shards``); the caller checks that it is a regular file directly in the folder."""
    return name.lower().endswith(SHARD_EXT)


def is_numbered_shard(name: str) -> bool:
    """A shard name shardsmith could have written: ``<digits>.tar`` (lower-case suffix)."""
    return name.endswith(SHARD_EXT) and numeric_stem(name) is not None


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


def key_base(source_name: str | None, relpath: str, item_id: str) -> str:
    """The sample key the planner gives an item before uniqueness: ``<relpath without its
    suffix>`` (or the item id's part after the source), prefixed ``<source>_`` when a source name
    is given (a recipe of several sources, whose paths could collide), sanitised."""
    stem = without_suffix(relpath) if relpath else item_id.split("/", 1)[-1]
    return sanitize_key(f"{source_name}_{stem}" if source_name else stem)


def unique_key(base: str, item_id: str) -> str:
    """A collision-proof variant of ``base``: appends 8 hex chars of sha1(item_id)."""
    digest = hashlib.sha1(item_id.encode("utf-8")).hexdigest()[:8]
    return f"{base[: MAX_KEY_LEN - 9]}_{digest}"


def member_name(key: str, suffix: str) -> str:
    """Tar member name for one sample member; refuses keys that webdataset would split."""
    if "." in key or "/" in key:
        raise ValueError(f"sample key {key!r} contains '.' or '/', which splits the sample")
    return f"{key}.{suffix}"


def media_suffix(path: str) -> str:
    """The member suffix a media file is stored under: its extension in lower case, ``jpeg`` as
    ``jpg`` (webdataset's image decoders), ``bin`` without one."""
    ext = os.path.splitext(path)[1].lower().lstrip(".") or "bin"
    return JPG if ext == "jpeg" else ext


def split_member(name: str) -> tuple[str, str] | None:
    """webdataset's rule: ``"a/b.latent.pth" -> ("a/b", "latent.pth")``; None without a suffix.

    The key ends at the first dot of the basename, which is why keys must be dot-free.
    """
    m = _MEMBER_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


def is_metadata_member(name: str) -> bool:
    """webdataset's tar iterator skips these before grouping: ``__name__`` at the top level, or a
    name starting with a ``__...__`` component."""
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(_META_RE.match(name))


def group_members(members: list[tuple[str, int, int]]) -> list[tuple[str, dict[str, MemberRef]]]:
    """Consecutive ``(name, data offset, size)`` members with the same key ->
    ``[(key, {suffix: (offset, size)})]``, grouped as webdataset groups them (members without a
    suffix are skipped)."""
    split = split_member
    out: list[tuple[str, dict[str, MemberRef]]] = []
    key, cur = None, None
    for name, off, size in members:
        parts = split(name)
        if parts is None:
            continue
        k, suffix = parts
        if k != key:
            key, cur = k, {}
            out.append((k, cur))
        cur[suffix] = (off, size)
    return out


# ---------------------------------------------------------------------------- shard order and listing

def numeric_stem(name: str) -> int | None:
    """``"00012.tar"`` -> 12; None when the stem is not all digits."""
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


class ShardListing(NamedTuple):
    """The shards of a folder in FastGen order; ``unnumbered``: the stems that are not numeric
    (when there are any, the order is by name)."""

    names: list[str]
    unnumbered: list[str]


def list_shards(folder: str | Path) -> ShardListing:
    """Regular files directly inside ``folder`` whose name ends in ``.tar`` (any case), in FastGen
    order. Raises ``FileNotFoundError`` when ``folder`` is not a folder; an empty listing is the
    caller's to judge."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"WebDataset folder not found: {folder}")
    names = [p.name for p in folder.iterdir() if is_shard_file_name(p.name) and p.is_file()]
    ordered, numeric = sort_shard_names(names)
    unnumbered = [] if numeric else sorted(n[:-4] for n in names if numeric_stem(n) is None)
    return ShardListing(ordered, unnumbered)


# ---------------------------------------------------------------------------- index files

def load_index_file(path: Path) -> tuple[Any, str | None]:
    """``(parsed JSON, None)``; ``(None, None)`` when the file is absent; ``(None, error)`` when it
    is not JSON."""
    if not path.exists():
        return None, None
    try:
        return read_json(path), None
    except (OSError, ValueError) as e:
        return None, f"{path.name} is not valid JSON: {e}"


def load_ignore_index(folder: str | Path) -> tuple[dict[str, list[str]] | None, str | None]:
    """``ignore_index.json`` of ``folder`` as ``({shard: [key, ...]}, None)``; ``(None, None)``
    without one; ``(None, error)`` for a file that is not JSON or not of that shape."""
    data, err = load_index_file(Path(folder) / IGNORE_INDEX_FILE)
    if data is None:
        return None, err
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v) for k, v in data.items()
    ):
        return None, f"{IGNORE_INDEX_FILE} is not {{shard: [key, ...]}}"
    return data, None


def repair_log_document(events: list[dict[str, Any]]) -> dict[str, Any]:
    """``repair.json``'s content for its events (JSON-able dicts), oldest first."""
    return {"repairs": events}


def repair_log_events(data: Any) -> list[dict[str, Any]]:
    """The events of a parsed ``repair.json``; ``KeyError`` / ``TypeError`` when it is not
    ``{"repairs": [event, ...]}``."""
    return list(data["repairs"])


def read_ignore_index(folder: str | Path) -> dict[str, list[str]]:
    """``ignore_index.json`` of ``folder`` (``{}`` without one); raises ``ValueError`` for a file
    that :func:`load_ignore_index` refuses."""
    data, err = load_ignore_index(folder)
    if err:
        raise ValueError(f"{Path(folder) / IGNORE_INDEX_FILE}: {err}")
    return {k: list(v) for k, v in (data or {}).items()}


def load_shard_counts(folder: str | Path) -> tuple[dict[str, int] | None, str | None]:
    """``shard_count.json`` of ``folder`` as ``({shard: count}, None)``; ``(None, None)`` without
    one; ``(None, error)`` for a file that is not JSON or not ``{shard: int}``."""
    data, err = load_index_file(Path(folder) / SHARD_COUNT_FILE)
    if data is not None and not (isinstance(data, dict) and all(isinstance(v, int) for v in data.values())):
        return None, f"{SHARD_COUNT_FILE} is not {{shard: int}}"
    return data, err


def tar_bytes(sizes: Iterable[tuple[str, int]], key: str) -> int:
    """Upper bound of the bytes a sample adds to a tar, from its ``(suffix, size)`` members:
    header(s) + padded data per member (the shard-size bound that closes a shard)."""
    return sum(member_bytes(member_name(key, suffix), n) for suffix, n in sizes)


def sample_tar_bytes(members: dict[str, bytes], key: str) -> int:
    """:func:`tar_bytes` of a sample whose members exist."""
    return tar_bytes(((s, len(v)) for s, v in members.items()), key)
