"""``decode``: latents back to pictures with the VAE the build recorded, and round-trip PSNR.

Contract
- In: a shardsmith build folder (with ``manifest.json`` and its ledger), an output name
  (default: the first latent output), a destination folder, a sample limit.
- Out: one PNG (1 latent frame) or MP4 (at the stored fps) per sample, mirroring the sample's
  path, plus ``decode_report.json``: per sample its PSNR against the source media after the
  same bucket resize/crop the build applied, and the mean.
- Each latent is paired with its own planned item exactly (:class:`Samples`): a ``.precomputed/`` file by
  its path (the item's ``sample_rel``), a ``latent_wds`` sample by the item id its json records (else its
  sample key); both are unique in the plan, where a media path with its suffix swapped is not (``x.jpg``
  and ``x.png`` are both ``x.pt``). A sample is named by its item's ``sample_rel`` in both formats
  (``x.png`` planned after ``x.jpg``: ``x_<8 hex>.png``), so no decoded file replaces another; its report
  row gives the item id it was compared with (``id``, None for a sample the ledger does not hold).
- The VAE is rebuilt from the manifest's provenance: ``from_pretrained`` for real weights,
  the same seeded architecture for random weights — then the report says the pictures are
  meaningless and PSNR only checks plumbing.
- Audio: when the output holds audio latents (``.precomputed/audio_latents/`` or ``audio_latent.pth``
  members) the recorded audio VAE is rebuilt the same way (``models.audio_vae``) and each becomes
  ``<stem>.wav`` through its decoder and vocoder, journalled like the pictures; the report's
  ``audio`` block counts the WAVs, gives their rate and says so loudly when its weights are random
  (:mod:`shardsmith.verify.decode_audio`). An audio-only dataset (no ``models.vae``) decodes its audio only.
- Nothing in the build folder is written: an ``out`` inside it is refused; so is one that is, lies
  inside or contains a source its manifest's recipe records (exit 2, before anything is written).
- An ``out`` that holds anything is refused (two decodes never mix) unless ``overwrite``; then
  only the files an earlier decode wrote there are removed first: the ones its journal
  (``.decode_files``, one path a line, appended before each file is written, so an interrupted
  decode is covered too) and its report list. An ``out`` holding any other file is refused
  with or without ``overwrite``, naming them; nothing of the user's is ever deleted.
- Every refusal (no build, no latent output — a ``kd_wds``-only ``distill`` build —, no such output,
  ``out`` in use, ``device="cuda"`` without one, recorded files gone — a ``latent_wds`` shard, the
  ``.precomputed/`` tree or its ``latents/``, fewer ``.pt`` files than recorded —, recorded
  ``pretrained`` weights not on this machine, looked up on disk only, never downloaded) is a
  :class:`DecodeError` or :class:`~shardsmith.precheck.DeviceError` raised before the VAE loads.
- A record that cannot be read (a shard's ``json`` member that is not valid JSON, a latent that does not
  load: :mod:`shardsmith.verify.latent_records`) is skipped and listed in the report's ``damaged``
  (``{"file", "member", "error"}``), never a traceback; the CLI names them and exits 1.
- ``.precomputed/`` keeps every latent as ``[C, F', H', W']``; an image VAE's (``F' = 1``) are decoded
  without that frame axis, as ``latent_wds`` stores them.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from shardsmith.encode.vae import load_vae
from shardsmith.errors import UserError
from shardsmith.formats import wds as wds_layout
from shardsmith.formats.build_dir import LEDGER_FILE, LOCK_FILE, MANIFEST_FILE
from shardsmith.formats.precomputed import CACHE_EXT, LATENTS, sample_rel
from shardsmith.verify.latent_records import latent_records
from shardsmith.plan.ledger import Ledger
from shardsmith.precheck import local_path, resolve_device
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.lock import hold
from shardsmith.safety.outdir import recorded_sources, refuse_around_sources
from shardsmith.atomic import TMP_MARK, atomic_write_bytes, atomic_write_json, read_json
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.latent_pixels import LatentPixelMaker
from shardsmith.user_paths import PathNotWritableError, check_writable, nearest_folder, resolve_user_path
from shardsmith.verify.decode_audio import (audio_latents, audio_report, check_recorded_weights, decode_audio_into,
                                            recorded_audio_vae)


REPORT_FILE = "decode_report.json"
JOURNAL_FILE = ".decode_files"


class DecodeError(UserError):
    """A decode that cannot start: not a build with latents, an unknown output, ``--out`` in use."""


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays of one shape (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _to_uint8(x: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] or [3, H, W] in [-1, 1] -> uint8 [F, H, W, 3]."""
    x = x.float().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    if x.ndim == 3:
        x = x[:, None]
    return x.permute(1, 2, 3, 0).cpu().numpy()


def media_path(frames: np.ndarray, path: Path) -> Path:
    """Where :func:`write_media` puts ``frames``: ``path.png`` for one frame, else ``path.mp4``."""
    return path.with_suffix(".png" if frames.shape[0] == 1 else ".mp4")


def write_media(frames: np.ndarray, fps: float, path: Path) -> Path:
    """uint8 [F, H, W, 3] -> ``path.png`` (one frame) or ``path.mp4`` (libx264, crf 18)."""
    from PIL import Image

    out = media_path(frames, path)
    if frames.shape[0] == 1:
        buf = io.BytesIO()
        Image.fromarray(frames[0]).save(buf, format="PNG")
        atomic_write_bytes(out, buf.getvalue())
        return out
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("libx264", rate=max(1, round(fps)))
        s.width, s.height = frames.shape[2] - frames.shape[2] % 2, frames.shape[1] - frames.shape[1] % 2
        s.pix_fmt, s.options = "yuv420p", {"crf": "18"}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f[: s.height, : s.width]),
                                                         format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    atomic_write_bytes(out, buf.getvalue())
    return out


def _vae_from_manifest(manifest: dict[str, Any], recipe, device: str) -> Any:
    v = recipe.models.vae
    check_recorded_weights("models.vae", v, DecodeError)  # a missing model is a message, not a download attempt
    prov = manifest["models"]["vae"]["provenance"]
    return load_vae(v.family, pretrained=local_path(v.pretrained), subfolder=v.subfolder, revision=v.revision,
                    config=v.config, dtype=v.dtype, device=device, store=v.store), prov["weights"] == "random-weights"


def _latents(root: Path, output: dict[str, Any], split: str, samples: "Samples",
             damaged: list[dict[str, Any]]) -> Iterator[tuple[str, Any, torch.Tensor, float]]:
    """(sample path, its planned item or None, latents [C, F', H', W'] or [C, H', W'], fps) in the output's
    order (``samples``: see :class:`Samples`); the records that cannot be read are added to ``damaged``."""
    for rel, z, facts, key in latent_records(root, output, split, LATENTS, wds_layout.LATENT, damaged, ("fps",)):
        rel, item = samples.find(rel, facts, key)
        yield rel, item, z, float(facts["fps"])


def _decoded_before(out: Path) -> set[str]:
    """Files (relative to ``out``) that an earlier decode wrote there: its journal, its report and
    what they list."""
    owned = {REPORT_FILE, JOURNAL_FILE}
    journal = out / JOURNAL_FILE
    if journal.is_file():
        owned |= {line for line in journal.read_text(encoding="utf-8").splitlines() if line}
    report = out / REPORT_FILE
    if report.is_file():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            rep = json.loads(report.read_text(encoding="utf-8"))
            owned |= {row["file"] for row in rep["rows"] + ((rep.get("audio") or {}).get("rows") or [])}
    return owned


def _files_under(out: Path) -> list[str]:
    """Every non-folder entry under ``out`` (links included), relative, sorted; not the decode's lock."""
    return sorted(rel for p in out.rglob("*") if (p.is_symlink() or not p.is_dir())
                  and (rel := p.relative_to(out).as_posix()) != LOCK_FILE)


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock (``.shardsmith/lock``, as a build holds its folder's) for the whole decode: a second
    decode into the same folder is refused at once, naming the first. A decode that fails in a folder it
    created leaves no folder behind. Only a decode that holds the lock cleans up, and while it still holds it:
    a decode refused because another holds it (:class:`FolderLockedError`) touches nothing, and no other process
    can take the lock between the cleanup and the release."""
    lock = out / LOCK_FILE
    made = [p for p in (out, lock.parent) if not p.exists()]  # what taking the lock creates
    had_lock = lock.exists()
    with hold(out, "decode"):
        try:
            yield
        except BaseException:
            if not had_lock:  # a failed decode leaves no lock of its own in the user's folder
                lock.unlink(missing_ok=True)
            for folder in reversed(made):
                with contextlib.suppress(OSError):  # not empty: what was written stays
                    folder.rmdir()
            raise


def _clear_earlier_decode(out: Path, owned: set[str]) -> None:
    """Remove the files of an earlier decode, then the folders that this left empty."""
    for rel in owned:
        path = out / rel
        path.unlink(missing_ok=True)
        for parent in path.parents:
            if parent == out or not parent.is_relative_to(out):
                break
            with contextlib.suppress(OSError):  # not empty: something else is still inside
                parent.rmdir()


def check_place(out: Path, root: Path) -> None:
    """Refuse an ``out`` inside the build, a file, under a file, or that cannot be written: in a folder this user
    may not look into or write in (:class:`DecodeError`, before anything is written)."""
    if out == root or out.is_relative_to(root):
        raise DecodeError(f"--out {out} lies inside the build folder {root}; decode never writes into a build: "
                          "pick a folder outside it")
    try:  # (a file is made and removed in ``out``, or in its nearest existing folder when it is not there yet)
        check_writable(nearest_folder(out, out, "--out"), out, "--out")
    except PathNotWritableError as exc:
        raise DecodeError(str(exc)) from None


def prepare_out(out: Path, root: Path, overwrite: bool) -> None:
    """Make ``out`` ready for a decode (see the module contract) or raise :class:`DecodeError`."""
    present = check_out(out, root, overwrite)
    if present:
        _clear_earlier_decode(out, set(present))


def check_out(out: Path, root: Path, overwrite: bool) -> list[str]:
    """Refuse (:class:`DecodeError`) an ``out`` a decode may not write (see :func:`check_place`), or one that
    holds any file an earlier decode did not write, or an earlier decode without ``overwrite``; the files to
    clear. Reads only."""
    check_place(out, root)
    present = _files_under(out) if out.is_dir() else []
    if not present:
        return []
    owned = _decoded_before(out)
    foreign = [rel for rel in present if rel not in owned and rel.rpartition(TMP_MARK)[0] not in owned]
    if foreign:
        raise DecodeError(f"--out {out} holds files decode did not write: {', '.join(foreign[:10])}"
                          f"{' ...' if len(foreign) > 10 else ''}; pick an empty folder (decode never deletes "
                          "your files)")
    if not overwrite:
        raise DecodeError(f"--out {out} holds an earlier decode ({len(present)} files); pass --overwrite to replace "
                          "it, or pick an empty folder")
    return present


def _read_manifest(root: Path) -> dict[str, Any]:
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise DecodeError(f"{root} has no {MANIFEST_FILE}; decode reads the models a shardsmith "
                          "build recorded (point it at the build's --out folder)")
    try:
        manifest = read_json(mpath)
    except (OSError, ValueError) as exc:
        why = exc.strerror or str(exc) if isinstance(exc, OSError) else f"not valid JSON: {exc}"
        raise DecodeError(f"{mpath} cannot be read ({why}); restore it from a copy, or rebuild into a new --out "
                          "(decode reads the models and outputs the manifest records)") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
        raise DecodeError(f"{mpath} is not a shardsmith manifest (no outputs object); restore it from a copy, or "
                          "rebuild into a new --out")
    if not manifest.get("models"):
        raise DecodeError(f"{root} holds no latent outputs (no models in its manifest); decode turns cached latents "
                          "back into pictures")
    return manifest


def _pick_output(root: Path, manifest: dict[str, Any], output: str | None) -> tuple[str, dict[str, Any]]:
    """(name, manifest block) of the latent output to decode (default: the first)."""
    latent_outs = {n: o for n, o in manifest["outputs"].items() if o["format"] in ("precomputed", "latent_wds")}
    if not latent_outs:
        held = ", ".join(f"{n} ({o.get('format')})" for n, o in manifest["outputs"].items()) or "none"
        raise DecodeError(f"{root} holds no latent output (its outputs: {held}); decode turns the cached latents "
                          "of a precomputed or latent_wds output back into pictures (a kd_wds output of "
                          "shardsmith distill is checked with shardsmith verify)")
    name = output or next(iter(latent_outs))
    if name not in latent_outs:
        raise DecodeError(f"--output {name!r} is not a latent output of this build; use one of {sorted(latent_outs)}")
    return name, latent_outs[name]


def _has_pictures(block: dict[str, Any], split: str, vae: bool) -> bool:
    """Whether ``split`` of the output holds latents to decode into pictures: a VAE is recorded (``vae``) and,
    for a ``.precomputed/`` tree, the manifest does not record its ``latents/`` count as 0 (an audio-only
    build: audio latents and conditions only, no ``latents/`` folder)."""
    if not vae:
        return False
    if block["format"] != "precomputed":
        return True
    return ((block["files"][split].get("files") or {}).get(LATENTS)) != 0


def _check_present(root: Path, name: str, block: dict[str, Any], split: str, pictures: bool) -> None:
    """:class:`DecodeError` (before any model loads) when the files the manifest records for ``split`` of
    output ``name`` are gone: a ``latent_wds`` shard, the ``.precomputed/`` tree, or (``pictures``: a VAE is
    recorded and the manifest does not record 0 latent files, :func:`_has_pictures`) its ``latents/`` folder
    or some of its ``.pt`` files."""
    files = block["files"][split]
    base = root / files["dir"]
    fix = "restore it from a copy, or rebuild the output (shardsmith build with the build's recipe)"
    if not base.is_dir():
        raise DecodeError(f"output {name}: {base} (recorded in the manifest) is missing; {fix}")
    if block["format"] == "latent_wds":
        gone = [sh["name"] for sh in files.get("shards", []) if not (base / sh["name"]).is_file()]
        if gone:
            more = f" (and {len(gone) - 1} more of its {len(files['shards'])} shards)" if len(gone) > 1 else ""
            raise DecodeError(f"output {name}: {base / gone[0]}{more} (recorded in the manifest) is missing; {fix}")
        return
    if not pictures:
        return
    folder = base / LATENTS
    if not folder.is_dir():
        raise DecodeError(f"output {name}: {folder} (recorded in the manifest) is missing; {fix}")
    found = sum(1 for _ in folder.rglob(f"*{CACHE_EXT}"))
    recorded = (files.get("files") or {}).get(LATENTS)
    if found == 0 or (isinstance(recorded, int) and found < recorded):
        of = f"{found} of the {recorded}" if isinstance(recorded, int) else f"{found} of the"
        raise DecodeError(f"output {name}: {folder} holds {of} latent files the manifest records; {fix} "
                          f"(shardsmith verify {base} names what is wrong)")


class Samples:
    """The planned items (``items``: the ledger's of one split; those of the sources that do not feed output
    ``name`` are left out) of output ``name``, found exactly for each latent record
    (:func:`~shardsmith.verify.latent_records.latent_records`), with the path its decoded files take.

    A ``.precomputed/`` file (``key`` None) is its item's by its path: the item's ``sample_rel``, unique in the
    plan. A ``latent_wds`` sample is the item whose id its json records, else the item of its sample key (both
    unique in the plan), and takes that item's ``sample_rel``, as in a tree; never the item of its media path
    with the suffix swapped, which ``x.jpg`` and ``x.png`` share. A sample the ledger does not hold keeps its
    media path (with its key added when another sample has that path): decoded, compared with nothing."""

    def __init__(self, items: Iterable[Any], recipe, name: str):
        names = [s.name for s in recipe.sources]
        # only the items of the sources that feed this output, named as its sink named them
        # (sinks/latent_members.py): another source's item of the same name (a/cat.jpg, b/cat.jpg, each in
        # its own output: both cat.pt) is no sample of this output and must not take its name
        taken = recipe.outputs[[o.name for o in recipe.outputs].index(name)].sources  # (as Recipe.source_ids)
        ids = {names.index(n) for n in taken} if taken else set(range(len(names)))
        multi = len(ids) > 1
        self.by_rel: dict[str, Any] = {}
        self.by_id: dict[str, tuple[str, Any]] = {}
        self.by_key: dict[str, tuple[str, Any]] = {}
        for it in items:
            if it.source not in ids:
                continue
            rel = sample_rel(it.relpath, names[it.source] if multi else None, key=it.key, item_id=it.item_id,
                             key_source=names[it.source] if len(names) > 1 else None)
            self.by_rel[rel] = it
            self.by_id[it.item_id] = self.by_key[it.key] = (rel, it)
        self._unknown: dict[str, str] = {}  # sample key -> path, of the samples the ledger does not hold

    def find(self, rel: str, facts: Any, key: str | None) -> tuple[str, Any]:
        """(the sample's path, its planned item or None) of the record ``(rel, _, facts, key)``."""
        if key is None:
            return rel, self.by_rel.get(rel)
        ident = facts.get("id") if isinstance(facts, dict) else None
        found = (self.by_id.get(ident) if isinstance(ident, str) else None) or self.by_key.get(key)
        if found is not None:
            return found
        if key not in self._unknown:  # (asked again for the sample's audio: the same path)
            if rel in self.by_rel or rel in self._unknown.values():
                p = PurePosixPath(rel)
                rel = p.with_name(f"{p.stem}_{key}{CACHE_EXT}").as_posix()
            self._unknown[key] = rel
        return self._unknown[key], None


def _samples(root: Path, recipe, name: str, split: str) -> Samples:
    """The :class:`Samples` of ``split`` from the build's ledger (none without one: decode creates nothing in
    the build folder)."""
    if not (root / LEDGER_FILE).is_file():
        return Samples((), recipe, name)
    ledger = Ledger(root / LEDGER_FILE)
    try:
        return Samples(ledger.items(split=split, status="ok"), recipe, name)
    finally:
        ledger.close()


def _for_vae(z: torch.Tensor, vae, rel: str) -> torch.Tensor:
    """``z`` shaped as ``vae.decode`` takes one sample: an image VAE's latents as ``[C, H', W']``. A
    ``.precomputed/`` tree keeps every latent as ``[C, F', H', W']`` (the LTX trainer's layout), so an
    image build's latents there carry a frame axis of 1, which is dropped."""
    if vae.spec.kind == "image_vae" and z.ndim == 4:
        if z.shape[1] != 1:
            raise DecodeError(f"{rel}: latents of shape {tuple(z.shape)} hold {z.shape[1]} frames, but the recorded "
                              f"VAE ({vae.spec.family}) is an image VAE; this file does not belong to this build "
                              "(run shardsmith verify on the output)")
        return z[:, 0]
    return z


def _decode_into(out: Path, vae, maker: LatentPixelMaker, latents: Iterator[tuple[str, Any, torch.Tensor, float]],
                 limit: int | None, tick=lambda: None) -> list[dict[str, Any]]:
    """Decode up to ``limit`` latents into ``out`` (each file journalled before it is written); one
    report row per sample, with its PSNR against its own item's bucketed source when the ledger holds it."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / JOURNAL_FILE, "a", encoding="utf-8") as journal:
        for i, (rel, item, z, fps) in enumerate(latents):
            if limit is not None and i >= limit:
                break
            z = _for_vae(z, vae, rel)
            with torch.inference_mode():
                frames = _to_uint8(vae.decode(z[None].to(vae.device, vae.torch_dtype))[0])
            journal.write(media_path(frames, out / rel).relative_to(out).as_posix() + "\n")
            journal.flush()  # recorded before the file exists: an interrupted decode's files stay ours
            written = write_media(frames, fps, out / rel)
            row: dict[str, Any] = {"path": rel, "file": written.relative_to(out).as_posix(),
                                   "shape": list(frames.shape), "id": item.item_id if item is not None else None}
            if item is not None:
                src = maker(item)
                if src.pixels is not None and src.pixels.shape == frames.shape:
                    row["psnr_db"] = round(psnr(src.pixels, frames), 3)
            rows.append(row)
            tick()
    return rows


def decode(build_dir: str | Path, out: str | Path, *, output: str | None = None, split: str = "train",
           limit: int | None = None, overwrite: bool = False, device: str = "auto",
           progress: Any = None) -> dict[str, Any]:
    """Decode a latent output's split into ``out`` (see the module contract); ``progress``: a
    :class:`~shardsmith.progress.Progress` for the model-loading spinner and the samples' bar."""
    from shardsmith.progress import Progress

    progress = progress or Progress(quiet=True)
    root, out = resolve_user_path(build_dir), resolve_user_path(out, "--out")
    manifest = _read_manifest(root)
    # (before anything is written: decoded pictures among the sources would be read by the next build)
    refuse_around_sources(out, recorded_sources(manifest), "--out",
                          "decode never writes into or around the sources this build read")
    name, block = _pick_output(root, manifest, output)
    if split not in block["files"]:
        raise DecodeError(f"--split {split!r}: output {name!r} has no such split; use one of {sorted(block['files'])}")
    device = resolve_device(device, "--device")
    check_out(out, root, overwrite)  # (before the lock makes a folder or a lock file in it)
    with _locked(out):
        prepare_out(out, root, overwrite)  # holding the lock: no other decode is clearing or writing it
        return _decode_locked(root, out, manifest, name, block, split, limit, device, progress)


def format_damaged(report: dict[str, Any]) -> str | None:
    """The lines that name the report's damaged records and the way on, or None when there are none."""
    damaged = report.get("damaged") or []
    if not damaged:
        return None
    from shardsmith.verify.latent_records import damage_text

    shown = 10
    lines = [f"damaged: {len(damaged)} record(s) of {report['output']}/{report['split']} could not be read and were "
             "not decoded:"] + [f"  {damage_text(d)}" for d in damaged[:shown]]
    if len(damaged) > shown:
        lines.append(f"  ... and {len(damaged) - shown} more (decode_report.json lists them all)")
    folder = Path(damaged[0]["file"]).parent
    lines.append(f"fix: shardsmith verify {folder} names every damaged record; to restore them, re-run the build's "
                 "command with --overwrite (the output is rebuilt from its sources beside the old one and swapped "
                 "in when complete)")
    return "\n".join(lines)


def _decode_locked(root: Path, out: Path, manifest: dict[str, Any], name: str, block: dict[str, Any], split: str,
                   limit: int | None, device: str, progress: Any) -> dict[str, Any]:
    recipe = recipe_from_dict(manifest["recipe"], base_dir="/")
    pictures = _has_pictures(block, split, recipe.models.vae is not None)
    _check_present(root, name, block, split, pictures)
    if pictures:
        check_recorded_weights("models.vae", recipe.models.vae, DecodeError)
    if manifest["models"].get("audio_vae"):
        check_recorded_weights("models.audio_vae", recipe.models.audio_vae, DecodeError)
    samples = _samples(root, recipe, name, split)  # (each latent's own item, and the path its files take)
    damaged: list[dict[str, Any]] = []  # the records that cannot be read, skipped
    audio = None  # the audio latents (first one peeked), when the output holds any
    if recipe.models.audio_vae is not None and manifest["models"].get("audio_vae"):
        found = audio_latents(root, block, split, samples.find, damaged)
        first = next(found, None)
        audio = None if first is None else itertools.chain([first], found)
    if not pictures and audio is None:
        raise DecodeError(f"output {name!r} holds neither latents with a recorded VAE nor audio latents: nothing "
                          "to decode")
    rows, random = [], False
    if audio is not None:  # loaded first: a missing vocoder is refused before any file is written
        with progress.spin(f"load the recorded audio VAE on {device}"):
            avae, audio_random = recorded_audio_vae(manifest, recipe, device, DecodeError)
    if pictures:
        with progress.spin(f"load the recorded VAE on {device}"):
            vae, random = _vae_from_manifest(manifest, recipe, device)
        maker = LatentPixelMaker(parse_buckets(recipe.geometry.buckets), recipe.images, recipe.geometry.fps)
        written = block.get("splits", {}).get(split, {}).get("written")
        total = written if limit is None or written is None else min(limit, written)
        with progress.task(f"decode {name}/{split}", total=total) as tick:
            rows = _decode_into(out, vae, maker, _latents(root, block, split, samples, damaged), limit, tick)
    vals = [r["psnr_db"] for r in rows if "psnr_db" in r and math.isfinite(r["psnr_db"])]
    report = {"build": str(root), "output": name, "split": split, "samples": len(rows),
              "random_weights": random, "mean_psnr_db": round(sum(vals) / len(vals), 3) if vals else None,
              "note": ("the VAE has RANDOM WEIGHTS: the pictures are meaningless and PSNR only proves the "
                       "plumbing round-trips") if random else None, "rows": rows}
    if audio is not None:
        out.mkdir(parents=True, exist_ok=True)
        with_audio = (block.get("audio") or {}).get("splits", {}).get(split, {}).get("with_audio")
        total = with_audio if limit is None or with_audio is None else min(limit, with_audio)
        with progress.task(f"decode {name}/{split} audio", total=total) as tick, \
                open(out / JOURNAL_FILE, "a", encoding="utf-8") as journal:
            report["audio"] = audio_report(decode_audio_into(out, avae, audio, limit, journal, tick), avae,
                                           audio_random)
    report["damaged"] = damaged
    atomic_write_json(out / REPORT_FILE, report)
    return report
