"""Probe one item once: sha256 of its bytes, size, media kind and (for images) header facts,
for the target and for every partner role (mask, source, reference ...) of the item.

Images are opened, not decoded (decoding is the transform's job); an empty file, a non-image
or a decompression bomb fails here for every output at once. An item its source refused
(outside its folder, a link loop ...) is never opened, and no detail quotes a file's bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from shardsmith.records import NO_CAPTION, TARGET, TEXT_KIND, Item, ItemError, MediaRef

AUDIO_ROLE = "audio"
from shardsmith.sources import paths
from shardsmith.sources.base import media_kind
from shardsmith.transform.image import identify


@dataclass
class Probe:
    sha256: str | None = None
    size_bytes: int | None = None
    kind: str = "other"
    width: int | None = None
    height: int | None = None
    image_format: str | None = None
    mode: str | None = None
    status: str = "ok"
    detail: str | None = None
    media: dict[str, MediaRef] = field(default_factory=dict)  # role -> probed file, the target first


def read_and_hash(path: str, keep: bool) -> tuple[bytes | None, str, int]:
    """(bytes if ``keep`` else None, sha256 hex, size). Large non-kept files stream in 1 MiB chunks.
    Raises :class:`~shardsmith.sources.paths.NotRegularFile` for anything but a regular file (links followed)."""
    if keep:
        with paths.open_regular(path) as f:
            data = f.read()
        return data, hashlib.sha256(data).hexdigest(), len(data)
    h, n = hashlib.sha256(), 0
    with paths.open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return None, h.hexdigest(), n


def read_failure(item: Item, exc: OSError) -> tuple[str, str]:
    """``(status, detail)`` for a listed file that could not be read: ``failed:vanished`` when it
    is gone since the listing, ``failed:symlink_loop``, else ``failed:unreadable``. The detail
    names the file and the OS reason, never any of its bytes."""
    if isinstance(exc, paths.NotRegularFile):
        return paths.status_of(paths.NOT_REGULAR), paths.not_regular_error(f"{item.item_id}: {item.path}", exc.what)[1]
    reason = paths.read_error_reason(exc.errno)
    why = exc.strerror or str(exc) or type(exc).__name__
    if reason == "vanished":
        return f"failed:{reason}", (f"{item.item_id}: {item.path} was listed but is gone ({why}); "
                                    "re-run once the folder is stable")
    return f"failed:{reason}", f"{item.item_id}: cannot read {item.path} ({why})"


def probe_item(item: Item, max_pixels: int, audio: bool = False,
               mode: tuple[str, tuple[str, ...]] | None = None) -> Probe:
    """Probe one item: its target as the flat fields, then every partner role (only while the
    item is still ok), each role's facts in ``media``. A source verdict that leaves no bytes to
    read (:data:`paths.NO_BYTES`) is returned without opening the file; any other source verdict
    wins after the target's bytes are hashed. An item with no media (a captions-only row) has
    kind ``text``, opens nothing and is ``ok`` (``failed:no_caption`` when its caption is empty).
    A partner that cannot be read is ``failed:<role>_<reason>``. With ``mode`` (its name and the
    target kinds it takes), a target of another kind is ``skipped:unsupported_kind_<kind>``, unopened."""
    if not item.media and not item.path and (item.error is None or item.error[0] == NO_CAPTION):
        pr = Probe(kind=TEXT_KIND)
        if mode is not None:
            pr.status = f"skipped:unsupported_kind_{TEXT_KIND}"
            pr.detail = f"{item.item_id} is a caption without media, and mode {mode[0]} takes {' and '.join(mode[1])}"
            return pr
        if item.error is not None:
            pr.status, pr.detail = paths.status_of(item.error[0]), item.error[1]
        return pr
    pr = Probe(kind=media_kind(item.relpath or item.path))
    if mode is not None and pr.kind not in mode[1] and not (item.error and item.error[0] in paths.NO_BYTES):
        name, kinds = mode
        pr.status = f"skipped:unsupported_kind_{pr.kind}"
        pr.detail = (f"{item.item_id} is {pr.kind} media, and mode {name} takes {' and '.join(kinds)} targets; "
                     "limit the sources to those, or choose another mode")
        return pr
    _target(item, pr, max_pixels)
    target = item.media.get(TARGET)
    if target is not None:
        pr.media[TARGET] = MediaRef(target.path, target.relpath, pr.kind, pr.size_bytes, pr.sha256, pr.width,
                                    pr.height, pr.image_format, pr.mode)
    for role, ref in item.media.items():
        if role == TARGET or pr.status != "ok":
            continue
        pr.media[role], failure = probe_partner(item, role, ref, max_pixels)
        if failure is not None:
            pr.status, pr.detail = failure
    if audio and pr.status == "ok":
        probe_audio_of(item, pr)
    return pr


def probe_audio_of(item: Item, pr: Probe) -> None:
    """Record on the ref the item's audio comes from (its ``audio`` partner, else a clip or audio
    target) what its first audio stream is, or why it has none (``{"none": reason}``). Facts only:
    whether an item without audio fails is each output's decision (an output without audio takes it)."""
    from shardsmith.transform.audio import probe_audio

    role = AUDIO_ROLE if AUDIO_ROLE in pr.media else TARGET
    ref = pr.media.get(role)
    if ref is None or ref.kind not in ("video", "audio"):
        return
    try:
        ref.audio = probe_audio(ref.path, item.item_id).to_json()
    except ItemError as e:
        ref.audio = {"none": e.reason}


def _target(item: Item, pr: Probe, max_pixels: int) -> None:
    if item.error is not None and item.error[0] in paths.NO_BYTES:
        pr.status, pr.detail = paths.status_of(item.error[0]), item.error[1]
        return
    try:
        data, pr.sha256, pr.size_bytes = read_and_hash(item.path, keep=pr.kind == "image")
    except OSError as exc:
        pr.status, pr.detail = read_failure(item, exc)
        return
    if item.error is not None:
        pr.status, pr.detail = paths.status_of(item.error[0]), item.error[1]
        return
    if pr.kind == "image":
        try:
            img = identify(data, name=item.item_id, max_pixels=max_pixels)
            pr.width, pr.height = img.size
            pr.image_format, pr.mode = img.format, img.mode
        except ItemError as e:
            pr.status, pr.detail = e.status, e.detail


def probe_partner(item: Item, role: str, ref: MediaRef, max_pixels: int) -> tuple[MediaRef, tuple[str, str] | None]:
    """``(ref with its probed facts, failure)``: the same probe as the target's (bytes hashed, an
    image's header screened). ``failure`` is ``(failed:<role>_<reason>, detail)`` naming the item,
    the role and the file, or None."""
    kind = media_kind(ref.relpath or ref.path)
    out = MediaRef(ref.path, ref.relpath, kind)
    try:
        data, out.sha256, out.size_bytes = read_and_hash(ref.path, keep=kind == "image")
    except paths.NotRegularFile as exc:
        return out, (f"failed:{role}_{paths.NOT_REGULAR}",
                     paths.not_regular_error(f"{item.item_id}: its {role} {ref.path}", exc.what)[1])
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return out, (f"failed:{role}_{paths.read_error_reason(exc.errno)}",
                     f"{item.item_id}: cannot read its {role} {ref.path} ({why})")
    if kind == "image":
        try:
            img = identify(data, name=f"{item.item_id}: its {role} {ref.relpath}", max_pixels=max_pixels)
        except ItemError as e:
            return out, (f"failed:{role}_{e.reason}", e.detail)
        out.width, out.height = img.size
        out.image_format, out.mode = img.format, img.mode
    return out, None
