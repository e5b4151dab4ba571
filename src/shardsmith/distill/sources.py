"""What ``shardsmith distill`` takes from a ``kind: wds`` prompt source (a prompt_wds / latent_wds folder).

Contract
- ``teacher_input(item, folder, shape, text)``: the :class:`~shardsmith.records.TeacherInput` of one
  planned item: ``shape`` (``distill.shape``) or, unset, the shape of the item's ``latent.pth`` in its
  source; with ``text == "source"`` the item's ``txt_emb.pth`` as a float32 ``[L, D]`` tensor. A
  missing or unreadable member is an :class:`~shardsmith.records.ItemError`
  (``failed:no_latent_shape`` / ``failed:no_text_embedding``) naming the shard and key. A member is read at
  the position the plan recorded only as the bytes the plan listed there (their sha256, ``meta["wds"]``):
  other bytes (the source rebuilt since the plan, e.g. with ``--overwrite``, its samples moved within or
  between shards) are ``failed:changed_since_plan``, a shard gone ``failed:vanished``, never another
  sample's embedding or shape sampled under this prompt.
- ``check_sources(recipe)``: before anything runs, a :class:`DistillSourceError` (exit 2) when
  ``distill.text: source`` (or ``distill.shape`` unset) names a source that is not a WebDataset folder,
  when ``distill.shape`` is unset and a source holds several buckets (a FastGen batch has one shape) or its
  first shard's samples hold no ``latent.pth`` (a prompt_wds folder: every prompt would fail), or
  when guidance needs a negative embedding and no source folder holds ``neg_prompt_emb.npy``.
- ``check_guidance(recipe)`` (called first by ``check_sources``, and by ``shardsmith distill`` before the
  build): a :class:`DistillSourceError` when ``distill.guidance`` is not a finite number of at most
  :data:`MAX_GUIDANCE` (``inf`` made every output NaN, written without a word).
- ``source_negative(recipe)``: ``(emb [L, D], None)`` from the first source folder holding
  ``neg_prompt_emb.npy``.
- ``negative_record(recipe)``: what guidance takes as the negative prompt, for the ledger and ``index.json``:
  None without guidance (``distill.guidance`` 1); ``{"origin": "source", "file", "sha256"}`` (the
  ``neg_prompt_emb.npy`` that :func:`source_negative` reads) with ``distill.text: source``; else
  ``{"origin": "distill.negative_prompt", "prompt"}``.
- ``settle_negative(recipe, ledger, root, output)`` (when the ``kd_wds`` output starts): records
  :func:`negative_record` in the ledger (:data:`NEGATIVE_KEY`) the first time; on a later run a source's
  ``neg_prompt_emb.npy`` with other bytes than recorded is a :class:`DistillSourceError` (exit 2) once a unit
  of the output is committed: the samples written before would hold the old negative embedding and the rest
  the new one (with none committed the new one is recorded: every sample is written with it). Returns the
  record.
- ``refuse_changed_negative(recipe, out, overwrite)`` (``shardsmith distill``, before the build and any model):
  the same refusal for an unfinished build in ``out`` (with ``overwrite``: for the unfinished rebuild beside it,
  which a re-run resumes); a complete build is left to the build's "sources changed" warning
  (:mod:`shardsmith.safety.source_changes`).
"""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import tarfile
from pathlib import Path

from shardsmith.errors import UserError
from shardsmith.formats.wds import LATENT, NEG_PROMPT_FILE, TEXT_EMB
from shardsmith.records import ItemError, PlannedItem, TeacherInput


class DistillSourceError(UserError):
    """A distill recipe whose sources cannot give what ``distill.text: source`` asks for."""


def _member(folder: str, item: PlannedItem, suffix: str):
    from shardsmith.loaders.pth_fast import load_pth_bytes
    from shardsmith.loaders.shard_reader import read_member
    from shardsmith.sources.wds import SHA256

    wds = item.meta.get("wds") or {}
    ref = wds.get(suffix)
    if ref is None:
        return None
    shard = Path(folder) / wds["shard"]
    planned = (wds.get(SHA256) or {}).get(suffix)
    try:
        fd = os.open(shard, os.O_RDONLY)
    except FileNotFoundError as exc:
        if planned is None:
            raise
        raise ItemError("vanished", f"{item.item_id}: {shard} was planned but is gone ({exc.strerror}); put it back "
                                    "to resume, or re-run with --overwrite to plan again") from None
    try:
        data = read_member(fd, tuple(ref), item.relpath, writable=True)
    except tarfile.ReadError:
        if planned is None:
            raise
        data = None  # (the shard ends before the planned position now)
    finally:
        os.close(fd)
    if planned is not None and (data is None or hashlib.sha256(data).hexdigest() != planned):
        raise ItemError("changed_since_plan", f"{item.item_id}: {shard} changed after it was planned (its bytes at "
                                              f"the planned position of {wds.get('key')}.{suffix} are not the planned "
                                              "ones: the source rebuilt?); re-run with --overwrite to plan again")
    return load_pth_bytes(data)


def teacher_input(item: PlannedItem, folder: str, shape: list[int] | None, text: str) -> TeacherInput:
    if shape is None:
        try:
            latent = _member(folder, item, LATENT)
        except ItemError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged member is this item's failure
            raise ItemError("no_latent_shape", f"{item.relpath}.{LATENT} cannot be read ({exc})") from None
        if latent is None:
            raise ItemError("no_latent_shape", f"{item.relpath} has no {LATENT} to take the sample shape from; set "
                                               "distill.shape or read prompts from a latent_wds source")
        shape = list(latent.shape)
    emb = None
    if text == "source":
        try:
            emb = _member(folder, item, TEXT_EMB)
        except ItemError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ItemError("no_text_embedding", f"{item.relpath}.{TEXT_EMB} cannot be read ({exc})") from None
        if emb is None:
            raise ItemError("no_text_embedding", f"{item.relpath} has no {TEXT_EMB} (distill.text: source); build the "
                                                 "source with models.text, or use distill.text: encode")
        emb = emb.float()
    return TeacherInput(tuple(int(d) for d in shape), emb)


def _first_sample_members(folder: Path) -> tuple[Path | None, set[str]]:
    """The first shard of the WebDataset ``folder`` that holds a sample, and the member suffixes of its samples
    (tar headers only); ``(None, set())`` when none can be read (the source's own checks say why)."""
    import tarfile as _tarfile

    from shardsmith.formats.tar import tar_members
    from shardsmith.formats.wds import list_shards, split_member

    try:
        names = list_shards(folder).names
    except OSError:
        return None, set()
    for name in names:
        try:
            members = tar_members(folder / name)
        except (OSError, _tarfile.TarError):
            continue
        suffixes = {parts[1] for parts in (split_member(m[0]) for m in members) if parts is not None}
        if suffixes:
            return folder / name, suffixes
    return None, set()


def _wds_folders(recipe) -> list[tuple[str, Path | None]]:
    from shardsmith.sources.base import is_shard_folder

    out = []
    for s in recipe.sources:
        p = Path(s.path)
        wds = s.kind == "wds" or (s.kind == "auto" and p.is_dir() and is_shard_folder(p))
        out.append((s.name, p if wds else None))
    return out


#: the largest classifier-free guidance scale taken (the scales in use run from 1 to about 20); a larger one
#: only amplifies the teacher's noise, up to inf and NaN outputs
MAX_GUIDANCE = 1000.0


def check_guidance(recipe) -> None:
    d = recipe.distill
    if d is None:
        return
    w = d.guidance
    if not (isinstance(w, (int, float)) and math.isfinite(w) and 0 <= w <= MAX_GUIDANCE):
        raise DistillSourceError(f"distill.guidance {w} (--guidance) must be a finite number from 0 to "
                                 f"{MAX_GUIDANCE:g}: each sample is u + w (c - u), which an infinite or huge "
                                 "w turns into NaN or inf; use 1 (the conditional model alone) or a scale such as 2-8")


def check_sources(recipe) -> None:
    d = recipe.distill
    if d is None:
        return
    check_guidance(recipe)
    folders = _wds_folders(recipe)
    if d.shape is None:
        from shardsmith.formats.wds import read_buckets_index

        for name, folder in folders:
            if folder is None:
                raise DistillSourceError(f"distill.shape is unset, and source {name!r} is not a latent_wds folder "
                                         "whose latent.pth could give each sample's shape; set distill.shape (e.g. "
                                         "[4, 32, 32]) or read prompts from a latent_wds folder")
            buckets = read_buckets_index(folder)
            if buckets and len(buckets) > 1:
                raise DistillSourceError(f"distill.shape is unset, and source {name!r} holds {len(buckets)} buckets "
                                         f"({', '.join(buckets)}): a FastGen batch has one shape; give one bucket's "
                                         f"folder per distill recipe (e.g. path: {folder / next(iter(buckets))}) or set "
                                         "distill.shape")
            shard, suffixes = _first_sample_members(folder / next(iter(buckets)) if buckets else folder)
            if shard is not None and LATENT not in suffixes:
                raise DistillSourceError(
                    f"distill.shape is unset, and source {name!r} holds no {LATENT} to take each sample's shape from "
                    f"(the samples of {shard} hold {', '.join(sorted(suffixes)) or 'no member'}: prompts only, as a "
                    "prompt_wds folder's); set distill.shape to the teacher's latent shape (e.g. [4, 32, 32]), or "
                    "read prompts from a latent_wds folder")
    if d.text != "source":
        return
    for name, folder in folders:
        if folder is None:
            raise DistillSourceError(f"distill.text is source, but source {name!r} is not a WebDataset folder of "
                                     "prompt_wds / latent_wds shards (its samples' txt_emb.pth are the embeddings); "
                                     "use such a folder, or distill.text: encode with models.text")
    from shardsmith.sources.wds import negative_file

    if d.guidance != 1.0 and not any(negative_file(f) is not None for _, f in folders):
        raise DistillSourceError(f"distill.guidance {d.guidance:g} needs the negative prompt's embedding, and with "
                                 f"distill.text: source no source folder holds {NEG_PROMPT_FILE}; build the source "
                                 "with a negative_prompt (prompt_wds / latent_wds write it), or set distill.guidance: 1, "
                                 "or use distill.text: encode")


def source_negative(recipe):
    from shardsmith.sources.wds import negative_embedding

    for _, folder in _wds_folders(recipe):
        if folder is not None:
            emb = negative_embedding(folder)
            if emb is not None:
                return emb, None
    raise DistillSourceError(f"no source folder holds {NEG_PROMPT_FILE} for classifier-free guidance")


#: the ledger's meta key of the negative prompt guidance takes (:func:`negative_record`)
NEGATIVE_KEY = "distill_negative"


def _file_sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def negative_record(recipe) -> dict | None:
    d = recipe.distill
    if d is None or d.guidance == 1.0:
        return None
    if d.text != "source":
        return {"origin": "distill.negative_prompt", "prompt": d.negative_prompt}
    from shardsmith.sources.wds import negative_file

    for _, folder in _wds_folders(recipe):
        f = negative_file(folder) if folder is not None else None
        if f is not None:
            return {"origin": "source", "file": str(f.resolve()), "sha256": _file_sha256(f)}
    return None  # (refused by check_sources before the build)


def _written(ledger_path: Path, output: str) -> int:
    """Samples in the units ``output`` has committed, in the ledger at ``ledger_path`` (read only)."""
    try:
        db = sqlite3.connect(f"{ledger_path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        # (the committed units: a unit's results may reach the results table only later)
        return db.execute("SELECT COALESCE(SUM(count), 0) FROM shards WHERE output=?", (output,)).fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        db.close()


def _changed_message(recipe, root: Path, old: dict, new: dict, written: int, fix: str) -> str:
    return (f"{new['file']}, the negative prompt's embedding that distill.text: source takes for guidance "
            f"{recipe.distill.guidance:g}, changed since this distill began in {root} (sha256 {old['sha256'][:12]}... "
            f"then, {str(new['sha256'])[:12]}... now): the {written} sample(s) written so far were sampled with the "
            "old one, and the rest would be sampled with the new one, two negative prompts in one dataset; "
            f"{fix}")


def _differs(old, new) -> bool:
    return (isinstance(old, dict) and old.get("origin") == "source" and new is not None
            and new.get("origin") == "source" and old.get("sha256") != new.get("sha256"))


def settle_negative(recipe, ledger, root: Path, output: str) -> dict | None:
    new = negative_record(recipe)
    if ledger is None or new is None:
        return new
    old = ledger.get_meta(NEGATIVE_KEY)
    if old is None:
        ledger.set_meta(NEGATIVE_KEY, new)
        return new
    if _differs(old, new):
        written = _written(Path(ledger.path), output) if ledger.path is not None else 0
        if not written:  # no unit committed: every sample is (re)written with the new one
            ledger.set_meta(NEGATIVE_KEY, new)
            return new
        raise DistillSourceError(_changed_message(
            recipe, root, old, new, written,
            "pass --overwrite to distil every prompt again with the new one, or put the old file back to resume"))
    return old


def refuse_changed_negative(recipe, out, overwrite: bool) -> None:
    from shardsmith import formats
    from shardsmith.plan.ledger import Ledger
    from shardsmith.recipe import KdWdsOutput
    from shardsmith.safety import swap

    new = negative_record(recipe)
    if new is None or new.get("origin") != "source":
        return
    out = Path(out)
    kd = next((o.name for o in recipe.outputs if isinstance(o, KdWdsOutput)), None)
    root = swap.next_sibling(out) if overwrite else out
    ledger_path = root / formats.LEDGER_FILE
    if not ledger_path.is_file():
        return
    from shardsmith.recipe import fingerprint

    try:
        old, done, fp = Ledger.peek(ledger_path, NEGATIVE_KEY, "complete", "fingerprint")
    except sqlite3.Error:
        return  # (the build says what is wrong with its ledger)
    if done or fp != fingerprint(recipe) or not _differs(old, new):
        return  # (a build of another recipe: the build's own refusal says so)
    fix = ("pass --overwrite to distil every prompt again with the new one, or put the old file back to resume"
           if not overwrite else
           f"{root} is the unfinished --overwrite rebuild of {out}, which this run would resume: delete {root} to "
           "start the rebuild afresh with the new one, or put the old file back to resume it")
    written = _written(ledger_path, kd)
    if written:  # (none committed: the resume writes every sample again, with the new one)
        raise DistillSourceError(_changed_message(recipe, root, old, new, written, fix))
