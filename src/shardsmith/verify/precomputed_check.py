"""``verify`` of a ``.precomputed/`` tree, as the LTX trainer reads it.

:func:`verify_precomputed` fills the report ``verify`` started (``world`` 1, ``workers`` 0, the
folders its LTX training ``mode`` reads, as ``dirs``) with checks ``folders:<mode>`` (the mode's folders
exist and pair), ``pairing`` (every folder read pairs by relative path), ``latent_grid``,
``attention_mask`` (int64), ``conditions_keys`` (what the mode's trainer reads, ``audio_prompt_embeds``
whenever the LTX-2 audio connector runs), ``audio_latents`` and ``audio_duration`` (when the mode reads
audio latents: :mod:`shardsmith.verify.precomputed_audio`), ``finite:<key>`` and, when the build that
wrote the tree has a manifest, ``manifest``, and when it has a ledger, ``integrity`` (every unit's files hash
to the sha256 the build committed: ``verify.integrity.TreeIntegrity``); plus ``contract`` and ``coverage``. The folder names and
modes come from ``formats.precomputed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.formats import precomputed as precomputed_layout
from shardsmith.verify.contract import ContractRecorder
from shardsmith.verify.integrity import tree_integrity
from shardsmith.verify.owning_build import manifest_count


def _unreadable(root: Path, dirs: list[str], rel: str) -> list[str]:
    """The files of sample ``rel`` that do not load, each with its error (as inspect says them)."""
    from shardsmith.loaders.pth_fast import load_pth_bytes

    bad = []
    for d in dirs:
        try:
            load_pth_bytes((root / d / rel).read_bytes())
        except Exception as e:  # noqa: BLE001 - any load failure is the finding
            why = (str(e).strip().splitlines() or ["the file is empty or cut short"])[0][:120]
            bad.append(f"{d}/{rel} ({type(e).__name__}: {why})")
    return bad or [f"{rel}: cannot be loaded"]


def verify_precomputed(root: Path, report: dict[str, Any], check, checks: list,
                       mode: str | None = None, build=None) -> dict[str, Any]:
    """The LTX trainer's view of a ``.precomputed/`` tree in ``mode`` (a key of
    ``formats.precomputed.MODES``; None: the stamp's ``"mode"``, else inferred from the folders
    present): the mode's folders exist and pair by relative path, each latent dict's grid matches
    its tensor, conditions carry the embeddings the mode reads and an int64 mask, audio latents
    agree with themselves and with the video's duration. ``build``: the shardsmith build that wrote the tree
    (``owning_build.find_build``), whose ledger check ``integrity`` compares its files with."""
    from shardsmith.verify.precomputed_audio import read_stamp, resolve_mode

    root = Path(root)
    stamp = read_stamp(root)
    stamp_path = root / precomputed_layout.PRECOMPUTED_STAMP
    if not stamp and stamp_path.exists():  # there, but not a JSON object: say what it costs
        report.setdefault("warnings", []).append(
            f"{stamp_path} is not a JSON object shardsmith can read, so it is ignored: the mode, the VAE's temporal "
            "factor and whether the tree is LTX-2's are inferred from the folders instead; rebuild the tree to "
            "restore it, or pass --mode")
    mode, mode_from = resolve_mode(root, mode, stamp)
    integrity, why_not = tree_integrity(root, build)  # the files against the build's sha256, hashed in threads
    if why_not:
        report.setdefault("notes", []).append(why_not)
    try:
        if integrity is not None:
            integrity.start()
        return _verify_tree(root, report, check, checks, mode, mode_from, stamp, integrity)
    finally:
        if integrity is not None:
            integrity.close()


def _verify_tree(root: Path, report: dict[str, Any], check, checks: list, mode: str, mode_from: str,
                 stamp: dict, integrity) -> dict[str, Any]:
    import torch

    from shardsmith.loaders.precomputed import PrecomputedDataset
    from shardsmith.verify.precomputed_audio import SampleChecks, folders_check, made_for_ltx2, temporal_factor

    present = precomputed_layout.present_dirs(root)
    dirs = [d for d in precomputed_layout.mode_dirs(mode) if d in present]
    folders_ok, folders_detail, primary_files = folders_check(root, mode, mode_from, present)
    try:
        ds = PrecomputedDataset(root, dirs) if dirs else None
        no_samples = None if dirs else f"none of the folders mode {mode} reads is present"
    except ValueError as e:  # nothing pairs: "no valid samples", as the trainer says
        ds, no_samples = None, str(e)
    unmatched = ds.unmatched if ds is not None else []
    n = len(ds) if ds is not None else 0
    report.update(world=1, workers=0, dirs=dirs, mode=mode, mode_from=mode_from)
    rec, bad_grid, bad_mask, bad_vmask, bad_amask = ContractRecorder(), [], [], [], []
    audio = SampleChecks(mode, dirs, temporal_factor(stamp), ltx2=made_for_ltx2(stamp))
    frames = set()
    unreadable: list[str] = []
    n_unread = 0
    for i in range(n):
        try:
            it = ds[i]
        except Exception:  # noqa: BLE001 - any load failure is the finding (EOFError too: not "Aborted.")
            unreadable += _unreadable(root, dirs, ds.items[i])
            n_unread += 1
            continue
        flat = {}
        for d in dirs:
            for k, v in it[d].items():
                flat[f"{d}.{k}"] = v.unsqueeze(0) if torch.is_tensor(v) else [v]
        for d in (precomputed_layout.LATENTS, precomputed_layout.REFERENCE_LATENTS):
            if d in it:
                why = _grid_problem(it[d])
                if why:
                    bad_grid.append(f"{d}/{it['path']} ({why})")
                elif d == precomputed_layout.LATENTS:
                    frames.add(it[d]["num_frames"])
        vm = it.get(precomputed_layout.VIDEO_MASKS)
        if vm is not None:
            why = _mask_problem(vm, it.get(precomputed_layout.LATENTS))
            if why:
                bad_vmask.append(f"{it['path']} ({why})")
        am = it.get(precomputed_layout.AUDIO_MASKS)
        if am is not None:
            why = _audio_mask_problem(am, it.get(precomputed_layout.AUDIO_LATENTS))
            if why:
                bad_amask.append(f"{it['path']} ({why})")
        cond = it.get(precomputed_layout.CONDITIONS)
        mask = cond.get(precomputed_layout.PROMPT_ATTENTION_MASK) if isinstance(cond, dict) else None
        if torch.is_tensor(mask) and mask.dtype != torch.int64:
            bad_mask.append(it["path"])
        audio.add(it)
        flat["__key__"] = [it["path"]]
        rec.add(flat)
    if mode_from == "folders" and mode == "video" and frames == {1}:
        mode = report["mode"] = "image"  # a video-only tree of stills
        folders_detail = folders_detail.replace("mode video", "mode image", 1)
    check(f"folders:{mode}", folders_ok, folders_detail)
    if unreadable:
        check("readable", False, f"{len(unreadable)} .pt file(s) cannot be loaded, e.g. " + "; ".join(unreadable[:3])
              + f"; the LTX trainer stops on them. shardsmith inspect {root} lists them all, shardsmith repair "
              f"{root} moves them (and their partners) aside")
    if ds is None:
        check("pairing", False, f"{no_samples}; the LTX trainer stops with 'No valid samples found'")
    else:
        check("pairing", not unmatched, f"{n} sample(s) present in every folder {dirs}" if not unmatched else
              f"{len(unmatched)} file(s) lack a partner, e.g. {unmatched[0][0]} missing in {unmatched[0][1]}; "
              "LTX trainers silently skip those")
        check("latent_grid", not bad_grid, "num_frames/height/width match every latent tensor" if not bad_grid else
              f"{len(bad_grid)} latent dict(s) whose grid disagrees with the tensor or lacks a key of "
              f"{list(precomputed_layout.LATENT_KEYS)}, e.g. {bad_grid[:2]}")
        check("attention_mask", not bad_mask, "prompt_attention_mask is int64 everywhere" if not bad_mask else
              f"{len(bad_mask)} condition(s) with a non-int64 mask, e.g. {bad_mask[:2]}")
        if precomputed_layout.AUDIO_MASKS in dirs:
            check("audio_mask_grid", not bad_amask, "every audio mask is 0/1 on its audio latent's steps [T]" if not
                  bad_amask else f"{len(bad_amask)} audio mask(s) off their audio latent's steps, e.g. "
                  f"{bad_amask[:2]}; rebuild the masks (mode: audio-inpaint cuts them with the target)")
        if precomputed_layout.VIDEO_MASKS in dirs:
            check("mask_grid", not bad_vmask, "every video mask is 0/1 on its latent's grid [F', H', W']" if not
                  bad_vmask else f"{len(bad_vmask)} video mask(s) the LTX trainer cannot reshape to its latent's "
                  f"tokens, e.g. {bad_vmask[:2]}; rebuild the masks (mode: video-inpaint cuts them with the target)")
        audio.emit(check)
    c = rec.to_dict()
    report["contract"] = c
    expected = n + len(unmatched) if ds is not None else len(primary_files)
    report["coverage"] = {"expected": expected, "seen": n - n_unread, "unique": n - n_unread, "unmatched": [r for r, _ in unmatched[:20]]}
    for key, st in c["keys"].items():
        if st.get("type") == "tensor" and (st.get("nan") or st.get("inf")):
            check(f"finite:{key}", False, f"{key} holds {st['nan']} NaN and {st['inf']} Inf values")
    mcount, mwhere = manifest_count(root)
    if mcount is not None:
        check("manifest", mcount == n, f"{mwhere} says written={mcount}; the tree pairs {n}")
    if integrity is not None:
        integrity.finish(check)
    report["checks"] = checks
    report["ok"] = all(ch["ok"] for ch in checks)
    return report


def _mask_problem(vm: dict, lat: dict | None) -> str | None:
    """Why a ``video_masks/`` dict is not a 0/1 ``mask`` on its latent's grid ``[F', H', W']``, or None
    (the rule of ``formats.mask_grid``, which the WebDataset loader applies to ``mask.pth`` too)."""
    from shardsmith.formats.mask_grid import mask_grid_problem

    return mask_grid_problem(vm.get("mask") if isinstance(vm, dict) else None,
                             lat.get("latents") if isinstance(lat, dict) else None)


def _audio_mask_problem(am: dict, lat: dict | None) -> str | None:
    """Why an ``audio_masks/`` dict is not a 0/1 ``mask`` on its audio latent's steps ``[T]``, or None."""
    from shardsmith.formats.mask_grid import audio_mask_problem

    return audio_mask_problem(am.get("mask") if isinstance(am, dict) else None,
                              lat.get("latents") if isinstance(lat, dict) else None)


def _grid_problem(lat: Any) -> str | None:
    """Why a ``latents/`` (or ``reference_latents/``) dict is not what the trainer reads, or None."""
    import torch

    if not isinstance(lat, dict):
        return f"a {type(lat).__name__}, not a dict"
    missing = [k for k in precomputed_layout.LATENT_KEYS if k not in lat]
    if missing:
        return f"lacks {', '.join(missing)}"
    t = lat["latents"]
    if not torch.is_tensor(t) or t.ndim != 4:
        return "latents are not [C, F', H', W']"
    grid = (lat["num_frames"], lat["height"], lat["width"])
    if tuple(t.shape[1:]) != grid:
        return f"grid {list(grid)} vs tensor {list(t.shape[1:])}"
    return None
