"""The mode-aware checks of ``verify`` on a ``.precomputed/`` tree: the folders an LTX training mode
reads, the conditions' keys (``audio_prompt_embeds`` whenever the LTX-2 audio connector runs), the
audio latents and their duration against the video's (layout and modes: ``formats.precomputed``).

- :func:`resolve_mode`: the mode asked for, else the stamp's ``"mode"``, else the one the folders
  suggest (``formats.precomputed.infer_mode``).
- :func:`folders_check`: check ``folders:<mode>``: every folder of the mode exists and holds a
  partner for every sample of the primary folder (the trainer silently skips the others).
- :class:`SampleChecks`: fed each loaded sample; emits ``conditions_keys``, ``audio_latents``
  and ``audio_duration``.

``audio_duration`` allows one latent step (1/25 s) between the audio's ``duration`` and the video's
(pixel frames / fps), and 1 between ``num_time_steps`` and ``duration x 25``: the LTX-2 audio encoder
stores ``N // (4 * hop) + 1`` steps (51 for 2.0 s), one more than ``AudioLatentShape.from_duration``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.formats import precomputed as L

EXAMPLES = 2
#: how each way of choosing the mode reads in a check line
MODE_FROM = {"argument": "as asked", "stamp": f"from {L.PRECOMPUTED_STAMP}",
             "folders": "inferred from the folders present; choose another with --mode"}
AUDIO_CONNECTOR_ERROR = "ValueError: Audio connector is configured but no audio features were provided."
#: how to get each folder a mode needs
FIX = {L.LATENTS: "build with models.vae set (it writes latents/)",
       L.CONDITIONS: "build with models.text set (it writes conditions/ for every sample)",
       L.AUDIO_LATENTS: "build with models.audio_vae set (it writes audio_latents/); clips without an audio track "
                        "get none: give them one, move them out (shardsmith repair quarantines unpaired files) or "
                        "verify a video-only --mode",
       L.REFERENCE_LATENTS: "build with mode: v2v-ic (or av2av-ic) and a reference clip for every item "
                            "(sources[*].columns.reference; mode: image-edit's columns.source too), with models.vae "
                            "set (it writes reference_latents/)",
       L.REFERENCE_AUDIO_LATENTS: "build with mode: a2a-ic (or av2av-ic) and a reference for every item "
                                  "(sources[*].columns.reference), with models.audio_vae set (it writes "
                                  "reference_audio_latents/)",
       L.VIDEO_MASKS: "build with mode: video-inpaint and a mask for every clip (sources[*].columns.mask), with "
                      "models.vae set (it writes video_masks/)",
       L.AUDIO_MASKS: "build with mode: audio-inpaint and a mask for every item (sources[*].columns.mask), with "
                      "models.audio_vae set (it writes audio_masks/)",
       L.CAMERAS: "build with mode: camera-video and camera data for every clip (sources[*].columns.camera; it "
                  "writes cameras/)"}


def _fix(d: str) -> str:
    return FIX.get(d, f"shardsmith does not write {d}/: make it with the LTX trainer's process_dataset.py, or "
                      "verify another --mode")


def read_stamp(root: Path) -> dict[str, Any]:
    """The tree's ``shardsmith.json`` (``{}`` when absent or unreadable)."""
    try:
        doc = read_json(Path(root) / L.PRECOMPUTED_STAMP)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def made_for_ltx2(stamp: dict[str, Any]) -> bool:
    """Whether the stamp says the tree was made for LTX-2 (its video VAE or text encoder is LTX-2's),
    whose trainer needs ``audio_prompt_embeds`` in every mode."""
    return any(isinstance(stamp.get(k), dict) and stamp[k].get("family") == "ltx2" for k in ("vae", "text"))


def temporal_factor(stamp: dict[str, Any]) -> tuple[int, str]:
    """The video VAE's temporal compression: the stamp's vae ``temporal`` (or its spec's) when
    present, else the LTX VAEs' 8; and where it came from."""
    vae = stamp.get("vae")
    if isinstance(vae, dict):
        for t in (vae.get("temporal"), (vae.get("spec") or {}).get("temporal")):
            if isinstance(t, int) and not isinstance(t, bool) and t >= 1:
                return t, f"the vae's temporal factor in {L.PRECOMPUTED_STAMP}"
    return L.VIDEO_TEMPORAL_FACTOR, "the LTX VAEs' temporal factor"


def resolve_mode(root: Path, mode: str | None, stamp: dict[str, Any]) -> tuple[str, str]:
    """``(mode, "argument" | "stamp" | "folders")``; an unknown mode (asked or stamped) is refused."""
    if mode is not None:
        L.mode_dirs(mode)  # refuses an unknown one
        return mode, "argument"
    stamped = stamp.get(L.MODE_KEY)
    if stamped is not None:
        if stamped not in L.MODES:
            raise ValueError(f"{root / L.PRECOMPUTED_STAMP} says mode {stamped!r}, not one of {', '.join(L.MODES)}; "
                             "pass the mode to verify (--mode)")
        return stamped, "stamp"
    return L.infer_mode(L.present_dirs(root)), "folders"


def folders_check(root: Path, mode: str, mode_from: str, present: list[str]) -> tuple[bool, str, list[str]]:
    """``(ok, detail, primary files)`` of check ``folders:<mode>``."""
    need = L.mode_dirs(mode)
    primary = L.primary_dir(need)
    missing = [d for d in need if d not in present]
    rels = L.cache_files(root, primary) if primary in present else []
    head = f"mode {mode} ({MODE_FROM[mode_from]}) reads {', '.join(d + '/' for d in need)}"
    unread = [d for d in present if d not in need]
    tail = f"; not read in this mode: {', '.join(d + '/' for d in unread)}" if unread else ""
    problems = [f"{d}/ is missing: the LTX trainer refuses to start without a folder its mode lists; fix: {_fix(d)}"
                for d in missing]
    for d in need:
        if d == primary or d in missing:
            continue
        have = set(L.cache_files(root, d))
        lacking = [r for r in rels if r not in have]
        if lacking:
            problems.append(f"{len(lacking)} of {len(rels)} sample(s) in {primary}/ lack a partner in {d}/ (e.g. "
                            f"{primary}/{lacking[0]} has no {d}/{lacking[0]}); the LTX trainer silently skips "
                            f"them; fix: {_fix(d)}")
    if problems:
        return False, f"{head}: " + "; ".join(problems) + tail, rels
    return True, f"{head}: each of the {len(rels)} sample(s) in {primary}/ has a partner in every folder" + tail, rels


def _desc(v: Any) -> str:
    import torch

    if torch.is_tensor(v):
        return f"{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
    return type(v).__name__


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class SampleChecks:
    """Fed every loaded sample (``{"path", <dir>: dict}``) with :meth:`add`; :meth:`emit` gives the
    checks ``conditions_keys``, ``audio_latents`` and ``audio_duration`` (the last two only when
    the mode reads audio latents, resp. both video and audio latents)."""

    def __init__(self, mode: str, dirs: list[str], temporal: tuple[int, str], ltx2: bool = False):
        self.mode, self.dirs, (self.temporal, self.temporal_from) = mode, dirs, temporal
        # the LTX-2 trainer builds its audio connector in every mode (checked with its training step):
        # a tree made for LTX-2 needs audio_prompt_embeds even in a video-only mode
        self.need_audio = mode in L.AUDIO_MODES or ltx2
        self.ltx2 = ltx2
        self.cond_seen, self.no_audio, self.cond_bad, self.cond_shapes = 0, [], [], {}
        self.audio_seen, self.audio_bad, self.audio_t, self.audio_dur = 0, [], [], []
        self.dur_seen, self.dur_off, self.steps_off = 0, [], []  # (steps apart, path, text)

    def add(self, it: dict[str, Any]) -> None:
        path = it["path"]
        if L.CONDITIONS in it:
            self._condition(path, it[L.CONDITIONS])
        for d in (L.AUDIO_LATENTS, L.REFERENCE_AUDIO_LATENTS):
            if d in it:
                self._audio(f"{d}/{path}", it[d])
        if L.LATENTS in it and L.AUDIO_LATENTS in it:
            self._duration(path, it[L.LATENTS], it[L.AUDIO_LATENTS])

    def _condition(self, path: str, cond: Any) -> None:
        import torch

        self.cond_seen += 1
        if not isinstance(cond, dict):
            self.cond_bad.append(f"{path}: a {type(cond).__name__}, not a dict")
            return
        legacy = cond.get(L.LEGACY_PROMPT_EMBEDS)  # the trainer uses it for both modalities
        embeds = {L.VIDEO_PROMPT_EMBEDS: cond.get(L.VIDEO_PROMPT_EMBEDS, legacy),
                  L.AUDIO_PROMPT_EMBEDS: cond.get(L.AUDIO_PROMPT_EMBEDS, legacy)}
        mask = cond.get(L.PROMPT_ATTENTION_MASK)
        bad = []
        if embeds[L.AUDIO_PROMPT_EMBEDS] is None and self.need_audio:
            self.no_audio.append(path)
        if embeds[L.VIDEO_PROMPT_EMBEDS] is None:
            bad.append(f"lacks {L.VIDEO_PROMPT_EMBEDS}")
        if mask is None:
            bad.append(f"lacks {L.PROMPT_ATTENTION_MASK}")
        elif not (torch.is_tensor(mask) and mask.ndim == 1 and mask.dtype == torch.int64):
            bad.append(f"{L.PROMPT_ATTENTION_MASK} is {_desc(mask)} (needs [L] int64)")
        for key, v in embeds.items():
            if v is None:
                continue
            if not (torch.is_tensor(v) and v.ndim == 2 and v.is_floating_point()):
                bad.append(f"{key} is {_desc(v)} (needs [L, D] floating)")
            elif torch.is_tensor(mask) and mask.ndim == 1 and v.shape[0] != mask.shape[0]:
                bad.append(f"{key} has L={v.shape[0]} but {L.PROMPT_ATTENTION_MASK} L={mask.shape[0]}")
            else:
                self.cond_shapes.setdefault(key, _desc(v))
        if torch.is_tensor(mask):
            self.cond_shapes.setdefault(L.PROMPT_ATTENTION_MASK, _desc(mask))
        if bad:
            self.cond_bad.append(f"{path}: {', '.join(bad)}")

    def _audio(self, where: str, rec: Any) -> None:
        import torch

        self.audio_seen += 1
        if not isinstance(rec, dict):
            self.audio_bad.append(f"{where}: a {type(rec).__name__}, not a dict")
            return
        bad = [f"lacks {k}" for k in L.AUDIO_LATENT_KEYS if k not in rec]
        lat, steps, bins, dur = (rec.get(k) for k in L.AUDIO_LATENT_KEYS)
        if torch.is_tensor(lat) and lat.ndim == 3:
            if lat.dtype != torch.float32:
                bad.append(f"latents are {_desc(lat)} (needs float32)")
            if steps is not None and steps != lat.shape[1]:
                bad.append(f"num_time_steps {steps} but the tensor has T={lat.shape[1]}")
            if bins is not None and bins != lat.shape[2]:
                bad.append(f"frequency_bins {bins} but the tensor has F={lat.shape[2]}")
            if lat.is_floating_point() and not bool(torch.isfinite(lat).all()):
                bad.append(f"latents hold {int((~torch.isfinite(lat)).sum())} NaN/Inf value(s)")
            self.audio_t.append(int(lat.shape[1]))
        elif lat is not None:
            bad.append(f"latents are {_desc(lat)} (needs [C, T, F] float32)")
        if "duration" in rec and not (_number(dur) and dur > 0):
            bad.append(f"duration {dur!r} (needs seconds > 0)")
        elif _number(dur):
            self.audio_dur.append(float(dur))
        if bad:
            self.audio_bad.append(f"{where}: {', '.join(bad)}")

    def _duration(self, path: str, lat: Any, aud: Any) -> None:
        if not (isinstance(lat, dict) and isinstance(aud, dict)):
            return
        frames, fps, dur, steps = lat.get("num_frames"), lat.get("fps"), aud.get("duration"), aud.get("num_time_steps")
        if not (_number(frames) and _number(fps) and fps > 0 and _number(dur) and dur > 0):
            return  # reported by latent_grid / audio_latents
        self.dur_seen += 1
        rate = L.AUDIO_LATENT_STEPS_PER_SECOND
        pixels = L.pixel_frames(frames, self.temporal)
        video = pixels / fps
        apart = abs(dur - video) * rate
        self.dur_off.append((apart, path, f"{path}: audio {dur:.3f} s vs video {video:.3f} s ({pixels} frames at "
                                          f"{fps:g} fps), {apart:.1f} latent step(s) apart"))
        if _number(steps):
            off = abs(steps - dur * rate)
            self.steps_off.append((off, path, f"{path}: num_time_steps {steps} vs duration x {rate:g} = "
                                              f"{dur * rate:.2f}, {off:.1f} apart"))

    def emit(self, check) -> None:
        self._emit_conditions(check)
        if L.AUDIO_LATENTS in self.dirs or L.REFERENCE_AUDIO_LATENTS in self.dirs:
            self._emit_audio(check)
        if L.LATENTS in self.dirs and L.AUDIO_LATENTS in self.dirs:
            self._emit_duration(check)

    def _emit_conditions(self, check) -> None:
        n = self.cond_seen
        problems = []
        if self.no_audio:
            problems.append(
                f"{len(self.no_audio)} of {n} condition(s) lack {L.AUDIO_PROMPT_EMBEDS} (e.g. {self.no_audio[0]}): "
                + (f"mode {self.mode} runs the LTX-2 audio connector" if self.mode in L.AUDIO_MODES else
                   f"the tree was made for LTX-2 (its stamp), whose trainer builds its audio connector in every "
                   f"mode, {self.mode} too")
                + ", so the trainer's training step fails with "
                f"`{AUDIO_CONNECTOR_ERROR}`; fix: rebuild with models.text.family: ltx2, which writes both "
                f"{L.VIDEO_PROMPT_EMBEDS} and {L.AUDIO_PROMPT_EMBEDS}")
        if self.cond_bad:
            problems.append(f"{len(self.cond_bad)} of {n} condition(s) do not hold what the LTX-2 trainer reads, "
                            f"e.g. {'; '.join(self.cond_bad[:EXAMPLES])}")
        if problems:
            check("conditions_keys", False, "; ".join(problems))
            return
        shapes = ", ".join(f"{k} {s}" for k, s in sorted(self.cond_shapes.items()))
        check("conditions_keys", True, f"all {n} condition(s) hold what mode {self.mode} reads: {shapes}")

    def _emit_audio(self, check) -> None:
        n = self.audio_seen
        if self.audio_bad:
            check("audio_latents", False, f"{len(self.audio_bad)} of {n} audio latent dict(s) are not what the LTX-2 "
                  f"trainer reads ([C, T, F] float32, num_time_steps T, frequency_bins F, duration > 0, finite), "
                  f"e.g. {'; '.join(self.audio_bad[:EXAMPLES])}")
            return
        t = f"T {min(self.audio_t)}..{max(self.audio_t)}" if self.audio_t else "no tensor"
        d = f"{min(self.audio_dur):.2f}..{max(self.audio_dur):.2f} s" if self.audio_dur else "-"
        check("audio_latents", True, f"all {n} audio latent dict(s): [C, T, F] float32 ({t}), num_time_steps and "
              f"frequency_bins match, durations {d}, finite")

    def _emit_duration(self, check) -> None:
        eps = 1e-6
        far = [x for x in self.dur_off if x[0] > 1 + eps]
        off = [x for x in self.steps_off if x[0] > 1 + eps]
        rule = (f"audio duration = video duration ((num_frames - 1) x {self.temporal} + 1 pixel frames / fps; "
                f"{self.temporal}: {self.temporal_from}) within one latent step (1/{L.AUDIO_LATENT_STEPS_PER_SECOND:g}"
                f" s), num_time_steps = duration x {L.AUDIO_LATENT_STEPS_PER_SECOND:g} within 1")
        if far or off:
            parts = []
            if far:
                parts.append(f"{len(far)} of {self.dur_seen} sample(s) whose audio and video durations differ by "
                             f"more than one step, worst {max(far)[2]}")
            if off:
                parts.append(f"{len(off)} of {len(self.steps_off)} whose num_time_steps disagrees with their "
                             f"duration, worst {max(off)[2]}")
            check("audio_duration", False, "; ".join(parts) + f" (needs {rule}); the trainer then places audio and "
                  "video over different spans of the clip; fix: rebuild the tree (its audio is trimmed to the "
                  "clip's pixel frames / fps)")
            return
        worst = f"; worst {max(self.dur_off)[2]}" if self.dur_off else ""
        check("audio_duration", True, f"{self.dur_seen} sample(s): {rule}{worst}")
