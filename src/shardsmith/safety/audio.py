"""Audio is never lost quietly: a preflight before an output with audio starts, and a gate after it.

Contract
- ``preflight(ledger, recipe, output, cutter, items=None)``: before any item of ``output`` is made, the first
  items of its train split (as a plan running ahead commits them, when ``items`` are given) that carry
  audio (an ``audio`` partner, an audio file, or a clip whose container has an audio stream, as the
  plan's probe recorded: ``MediaRef.audio``) are decoded in this process
  through the exact path the workers use
  (:meth:`~shardsmith.transform.audio_samples.AudioCutter.decode`). The first one that decodes passes.
  When :data:`PREFLIGHT_DECODES` in a row fail to decode, the decoder is broken: :class:`AudioGateError`
  (exit code 3) with FFmpeg's message and the fix, before any slow work. When audio is required and not
  one eligible item carries audio, the same error says so at once.
- ``audio_counts(ledger, output, split)``: the manifest's audio block of one split: ``with_audio``
  (samples written with audio latents), ``without_audio`` (written without: audio not required),
  ``failed`` (status -> count of items that failed for their audio).
- ``gate(ledger, recipe, output, blocks)``: with audio required, a run in which no item of ``output``
  decoded audio raises :class:`AudioGateError` listing the first items without audio and their
  reasons (an output with no item at all passes: nothing was lost). Items that failed or were skipped before
  the audio decoder (``changed_since_plan``, ``unreadable`` ...) are counted by reason apart from those that
  failed for their audio; where every item did, the message says so and lists them, and does not offer
  ``--skip-audio`` (it would not write them either).
- ``records.NO_AUDIO`` starts the detail of a sample written without audio (audio not required).
"""

from __future__ import annotations

from typing import Any

from shardsmith.errors import UserError
from shardsmith.records import NO_AUDIO, ItemError

PREFLIGHT_DECODES = 3  # items with audio decoded before the decoder is declared broken


class AudioGateError(UserError):
    """The run lost all its audio (or cannot decode any): exit code 3, never a quiet success."""

    exit_code = 3


def _audio_source(item):
    """``(ref, name)`` of the file an item's audio comes from (its ``audio`` partner, else a clip or
    audio target), or None (an image)."""
    partner = item.media.get("audio")
    if partner is not None:
        return partner, f"{item.item_id} (its audio {partner.relpath})"
    target = item.media.get("target")
    if target is not None and item.kind in ("video", "audio"):
        return target, item.item_id
    return None


def preflight(ledger, recipe, output, cutter, items=None) -> dict[str, Any]:
    """See the module contract; returns what was tried (for the manifest). ``items``: the train split's
    planned rows of the output's sources as a plan running ahead commits them (they are waited for);
    default: the complete plan's, from ``ledger``."""
    from shardsmith.split.assign import TRAIN
    from shardsmith.transform.audio import probe_audio

    if items is None:
        items = ledger.items(split=TRAIN, sources=recipe.source_ids(output), status="ok")
    seen = with_stream = 0
    failures: list[str] = []
    for item in items:
        seen += 1
        src = _audio_source(item)
        if src is None:
            continue
        ref, name = src
        facts = ref.audio
        if facts is None:  # planned without the audio probe (a ledger from before it)
            try:
                facts = probe_audio(ref.path, name).to_json()
            except ItemError as err:
                facts = {"none": err.reason}
        if "none" in facts:
            continue
        with_stream += 1
        try:
            cutter.decode(ref.path, name, 0.0, min(facts["duration"], 1.0) or None, facts)
        except ItemError as err:
            failures.append(err.detail)
            if len(failures) >= PREFLIGHT_DECODES:
                break
            continue
        return {"decoded": item.item_id, "items_looked_at": seen}
    if failures:
        raise AudioGateError(
            f"output {output.name!r}: the audio decoder failed on every file tried ({len(failures)}), before the "
            f"run started; the first: {failures[0]}. Check that PyAV's FFmpeg can decode these files "
            "(pip install --force-reinstall av), or convert the audio (e.g. ffmpeg -i in -c:a pcm_s16le out.wav); "
            "--skip-audio builds without audio")
    if recipe.audio_required and seen and not with_stream:
        raise AudioGateError(
            f"output {output.name!r}: audio is required (models.audio_vae is set) but none of the {seen} item(s) "
            "has an audio stream or an audio partner (the plan probed each); give the clips audio (or an audio "
            "column: columns.audio), pass --skip-audio to build without audio, or set audio.required: false")
    return {"decoded": None, "items_looked_at": seen}


def audio_counts(ledger, output, split: str) -> dict[str, Any]:
    """The audio block of one split of ``output`` (see the module contract)."""
    written = sum(ledger.status_counts(output.name, split, "written").values())
    without = sum(ledger.status_counts(output.name, split, "written", NO_AUDIO + "%").values())
    failed: dict[str, int] = {}
    for pattern in ("failed:no_audio_stream", "failed:audio_%"):
        failed.update(ledger.status_counts(output.name, split, pattern))
    return {"with_audio": written - without, "without_audio": without, "failed": failed}


#: a file that could not be read as planned (:func:`~shardsmith.transform.samples.read_verified`): with an ``audio_``
#: prefix the audio partner's reason, which fails the item before its audio is decoded, as for any other file
_READ_FAILURES = ("changed_since_plan", "vanished", "unreadable", "symlink_loop", "not_a_regular_file")


def _for_its_audio(status: str) -> bool:
    """Whether an item of ``status`` failed for its audio (the decoder found none or could not decode it)."""
    kind, _, reason = status.partition(":")
    return kind == "failed" and "audio" in reason and not reason.endswith(_READ_FAILURES)


def gate(ledger, recipe, output, blocks: dict[str, dict[str, Any]]) -> None:
    """Raise :class:`AudioGateError` when audio is required and no item of ``output`` decoded audio
    (``blocks``: split -> :func:`audio_counts`)."""
    if not recipe.audio_required or any(b["with_audio"] for b in blocks.values()):
        return
    if not any(b["without_audio"] or b["failed"] for b in blocks.values()) and not any(
            ledger.result_details(output.name, split, "%", limit=1) for split in blocks):
        return  # no item at all: nothing was lost (the summary says the output is empty)
    n_audio = sum(b["without_audio"] for b in blocks.values())  # written without audio, or failed for it
    before: dict[str, int] = {}  # status -> items that failed or were skipped before the audio decoder
    for split in blocks:
        for pattern in ("failed:%", "skipped:%"):
            for status, n in ledger.status_counts(output.name, split, pattern).items():
                if _for_its_audio(status):
                    n_audio += n
                else:
                    before[status] = before.get(status, 0) + n
    lost: list = []  # (item_id, status, detail): the first without audio, else the first stopped before
    for split in blocks:
        lost += [r for r in ledger.result_details(output.name, split, "failed:%audio%", limit=10)
                 if _for_its_audio(r[1])]
        lost += ledger.result_details(output.name, split, "written", NO_AUDIO + "%", limit=10)
    n_before = sum(before.values())
    skips = any(st.startswith("skipped:") for st in before)
    reasons = ", ".join(f"{st if skips else st.split(':', 1)[1]} {n}"
                        for st, n in sorted(before.items(), key=lambda x: (-x[1], x[0])))
    stopped = f"{'failed or were skipped' if skips else 'failed'} before the audio decoder: {reasons}"
    if not n_audio and n_before:  # not one item reached the decoder: its audio is not what failed
        for split in blocks:
            for pattern in ("failed:%", "skipped:%"):
                lost += [r for r in ledger.result_details(output.name, split, pattern, limit=10) if r[1] in before]
        raise AudioGateError(
            f"output {output.name!r}: audio is required, but no item decoded audio: {n_before} item(s) {stopped}, so "
            f"none was left to decode; the first:\n{_lines(lost)}\ndo what each item's reason says (its detail above; a "
            "file changed since the plan is planned again by a re-run with --overwrite); their audio was never read, so "
            "--skip-audio or audio.required: false would not write these items either")
    more = f"; {n_before} more {stopped}" if n_before else ""
    raise AudioGateError(
        f"output {output.name!r}: audio is required, but no item decoded audio ({n_audio} item(s) without it{more}); "
        f"the first:\n{_lines(lost) or '  (no item reached the audio decoder)'}\n"
        "fix the files (or the audio column), pass --skip-audio to build without audio, or set audio.required: false"
        + ("; for the others, do what their reasons say" if n_before else ""))


def _lines(rows: list, most: int = 10) -> str:
    """The first ``most`` (item_id, status, detail) rows, one indented line each."""
    return "\n".join(f"  {item_id}: {status}: {detail}" for item_id, status, detail in rows[:most])
