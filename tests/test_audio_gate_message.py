"""The audio gate's message when items of an output with required audio failed before the audio decoder
(``changed_since_plan``, a vanished file, an audio partner that changed ...): it counts and names them by reason,
lists the first ones, and its advice stays true. Before: "no item decoded audio (0 item(s) without it) ... (no item
reached the audio decoder)", and the advice to pass --skip-audio, which would not write them either."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shardsmith.plan.ledger import Ledger
from shardsmith.records import PlannedItem
from shardsmith.safety.audio import AudioGateError, audio_counts, gate

OUTPUT = SimpleNamespace(name="precomputed")
REQUIRED = SimpleNamespace(audio_required=True)


def _ledger(tmp_path, results: list[tuple[str, str | None]]) -> Ledger:
    """A ledger of one audio item per ``(status, detail)``, ``a/s<i>.wav`` in the train split, with that result
    in output 'precomputed'."""
    led = Ledger(tmp_path / "ledger.sqlite")
    with led.transaction():
        led.add_items([PlannedItem(idx=i, item_id=f"a/s{i}.wav", key=f"a_s{i}", source=0, path=f"/x/s{i}.wav",
                                   relpath=f"s{i}.wav", caption=None, label=None, label_name=None, meta={},
                                   sha256="0" * 64, size_bytes=10, kind="audio", width=None, height=None,
                                   image_format=None, mode=None, split="train", plan_status="ok")
                       for i in range(len(results))])
    led.record_results(OUTPUT.name, [(i, st, det) for i, (st, det) in enumerate(results)])
    return led


def _message(led: Ledger) -> str:
    with pytest.raises(AudioGateError) as got:
        gate(led, REQUIRED, OUTPUT, {"train": audio_counts(led, OUTPUT, "train")})
    return str(got.value)


def test_every_item_changed_since_the_plan_is_said_as_such(tmp_path):
    changed = "a/s{}.wav: /x/s{}.wav changed after it was planned; re-run with --overwrite to plan again"
    msg = _message(_ledger(tmp_path, [("failed:changed_since_plan", changed.format(i, i)) for i in range(3)]))
    assert "no item decoded audio: 3 item(s) failed before the audio decoder: changed_since_plan 3" in msg, msg
    for i in range(3):
        assert f"  a/s{i}.wav: failed:changed_since_plan: {changed.format(i, i)}" in msg, msg
    assert "0 item(s) without it" not in msg and "no item reached the audio decoder" not in msg
    assert "--skip-audio or audio.required: false would not write these items either" in msg
    assert "pass --skip-audio to build without audio" not in msg  # (it would not help)


def test_other_reasons_and_skips_are_counted_apart(tmp_path):
    msg = _message(_ledger(tmp_path, [("failed:audio_changed_since_plan", "its audio p.wav changed"),
                                      ("failed:vanished", "gone"), ("failed:vanished", "gone too"),
                                      ("skipped:duplicate", "a copy of a/s0.wav")]))
    assert "4 item(s) failed or were skipped before the audio decoder: failed:vanished 2, " \
           "failed:audio_changed_since_plan 1, skipped:duplicate 1" in msg, msg
    assert "  a/s3.wav: skipped:duplicate: a copy of a/s0.wav" in msg


def test_items_that_failed_for_their_audio_keep_the_audio_advice_and_the_others_are_counted(tmp_path):
    msg = _message(_ledger(tmp_path, [("failed:no_audio_stream", "a/s0.wav has no audio stream"),
                                      ("failed:changed_since_plan", "changed"), ("failed:changed_since_plan", "too")]))
    assert "no item decoded audio (1 item(s) without it; 2 more failed before the audio decoder: " \
           "changed_since_plan 2); the first:\n  a/s0.wav: failed:no_audio_stream: a/s0.wav has no audio stream\n" in msg
    assert "pass --skip-audio to build without audio" in msg and "for the others, do what their reasons say" in msg


def test_only_audio_failures_read_as_before(tmp_path):
    msg = _message(_ledger(tmp_path, [("failed:audio_decode_error", "bad"), ("failed:no_audio_stream", "none")]))
    assert "no item decoded audio (2 item(s) without it); the first:\n" in msg, msg
    assert msg.endswith("fix the files (or the audio column), pass --skip-audio to build without audio, "
                        "or set audio.required: false")


@pytest.mark.slow  # (loads the text and audio encoders)
def test_a_build_whose_audio_files_all_changed_after_the_plan_says_so_and_overwrite_builds(tmp_path, monkeypatch):
    """Through a whole build: every audio file is rewritten once planned (as a resume of a build killed after its
    plan would find them); the gate names changed_since_plan, and the re-run it advises (--overwrite) builds."""
    import shardsmith.build as build_mod
    from shardsmith.recipe import recipe_from_dict
    from test_recipe_refusals_2 import _wav

    src = tmp_path / "src"
    for i in range(3):
        _wav(src / f"s{i}.wav", tone=440 + 110 * i).with_suffix(".txt").write_text(f"tone {i}")
    real = build_mod.make_plan

    def plan_then_change(*a, **kw):
        n = real(*a, **kw)
        for i in range(3):
            _wav(src / f"s{i}.wav", tone=300 + 50 * i)
        return n

    monkeypatch.setattr(build_mod, "PLAN_AHEAD", False)  # the plan in this process, then the hook
    monkeypatch.setattr(build_mod, "make_plan", plan_then_change)
    recipe = recipe_from_dict({"sources": [{"path": str(src)}], "audio": {"durations": [0.25]},
                               "models": {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"},
                                          "device": "cpu"},
                               "outputs": [{"format": "precomputed"}]})
    with pytest.raises(AudioGateError) as got:
        build_mod.build(recipe, tmp_path / "out", quiet=True)
    msg = str(got.value)
    assert "no item decoded audio: 3 item(s) failed before the audio decoder: changed_since_plan 3" in msg, msg
    assert "  src/s0.wav: failed:changed_since_plan: " in msg and "re-run with --overwrite" in msg
    monkeypatch.setattr(build_mod, "make_plan", real)
    m = build_mod.build(recipe, tmp_path / "out", quiet=True, overwrite=True)
    assert m["counts"]["written"] == 3, m["counts"]
