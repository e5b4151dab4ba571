"""``verify`` on a ``.precomputed/`` tree checks what the LTX-2 trainer reads in each training mode:
the mode's folders and their pairing, the conditions' keys (``audio_prompt_embeds`` whenever the
audio connector runs), the audio latents and their duration against the video's. Trees are small
``torch.save`` dicts shaped like LTX's (shared/reference/ltx-trainer.md §2.5)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from shardsmith.formats import precomputed as layout
from shardsmith.verify.runner import verify

N = 4
LAT_FRAMES, FPS = 5, 24.0  # 5 latent frames = 33 pixel frames = 1.375 s at 24 fps
VIDEO_SECONDS = layout.pixel_frames(LAT_FRAMES) / FPS
RATE = layout.AUDIO_LATENT_STEPS_PER_SECOND


def _save(root, folder, rel, obj):
    path = root / folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def audio_record(seconds, steps=None, dtype=torch.float32):
    """As LTX-2's audio encoder stores it: T = N // (4 * hop) + 1 = floor(seconds * 25) + 1 (51 for 2.0 s)."""
    t = int(seconds * RATE + 1e-9) + 1 if steps is None else steps
    return {"latents": torch.randn(8, t, 16).to(dtype), "num_time_steps": t, "frequency_bins": 16,
            "duration": float(seconds)}


def make_tree(root, *, video=True, audio=True, audio_embeds=True, shift_steps=None):
    """``N`` samples ``clips/cI.pt``; ``shift_steps``: {i: latent steps sample i's audio is longer by}."""
    for i in range(N):
        rel = f"clips/c{i}.pt"
        if video:
            _save(root, "latents", rel, {"latents": torch.randn(128, LAT_FRAMES, 2, 3).bfloat16(),
                                         "num_frames": LAT_FRAMES, "height": 2, "width": 3, "fps": FPS})
        if audio:
            seconds = VIDEO_SECONDS + (shift_steps or {}).get(i, 0.0) / RATE
            _save(root, "audio_latents", rel, audio_record(seconds))
        cond = {"video_prompt_embeds": torch.randn(16, 32).bfloat16(),
                "prompt_attention_mask": torch.ones(16, dtype=torch.int64)}
        if audio_embeds:
            cond["audio_prompt_embeds"] = torch.randn(16, 24).bfloat16()
        _save(root, "conditions", rel, cond)
    return root


def checks(rep):
    return {c["name"]: c for c in rep["checks"]}


def run(tree, **kw):
    return verify(tree, **kw)


def test_modes_table_is_the_reference():
    assert set(layout.MODES) == {"t2v", "i2v", "video-extend", "v2v-ic", "a2v", "v2a", "video-inpaint",
                                 "video-outpaint", "t2a", "audio-extend", "audio-inpaint", "a2a-ic", "av2av-ic",
                                 "image", "video"}
    assert layout.MODES["av2av-ic"] == ("latents", "audio_latents", "reference_latents", "reference_audio_latents")
    assert layout.MODES["t2a"] == ("audio_latents",) and layout.MODES["video"] == ("latents",)
    assert layout.AUDIO_MODES == {"t2v", "i2v", "video-extend", "a2v", "v2a", "t2a", "audio-extend",
                                  "audio-inpaint", "a2a-ic", "av2av-ic"}
    assert layout.required_keys("conditions", "t2v") == ("video_prompt_embeds", "prompt_attention_mask",
                                                          "audio_prompt_embeds")
    assert layout.required_keys("conditions", "v2v-ic") == ("video_prompt_embeds", "prompt_attention_mask")
    assert layout.required_keys("audio_latents", "t2a") == ("latents", "num_time_steps", "frequency_bins",
                                                             "duration")
    assert layout.mode_dirs("t2a") == ["conditions", "audio_latents"]
    assert layout.AUDIO_LATENT_STEPS_PER_SECOND == 16000 / 160 / 4
    assert layout.pixel_frames(5) == 33 and layout.pixel_frames(5, 4) == 17
    assert layout.infer_mode(["latents", "conditions", "audio_latents"]) == "t2v"
    assert layout.infer_mode(["conditions", "audio_latents"]) == "t2a"
    assert layout.infer_mode(["latents", "conditions"]) == "video"
    with pytest.raises(ValueError, match="unknown LTX training mode 'x2y'"):
        layout.mode_dirs("x2y")


def test_a_good_t2v_tree_passes(tmp_path):
    rep = run(make_tree(tmp_path / "t"))
    c = checks(rep)
    assert rep["ok"], rep["checks"]
    assert rep["mode"] == "t2v" and rep["mode_from"] == "folders"
    assert rep["dirs"] == ["latents", "conditions", "audio_latents"]
    assert list(c)[:1] == ["folders:t2v"]
    assert "each of the 4 sample(s) in latents/ has a partner in every folder" in c["folders:t2v"]["detail"]
    assert {"conditions_keys", "audio_latents", "audio_duration", "pairing", "latent_grid"} <= set(c)
    assert "audio_prompt_embeds [16, 24] bfloat16" in c["conditions_keys"]["detail"]
    assert "all 4 audio latent dict(s)" in c["audio_latents"]["detail"]
    assert c["audio_duration"]["detail"].startswith("4 sample(s): audio duration = video duration ((num_frames - 1) "
                                                    "x 8 + 1 pixel frames / fps; 8: the LTX VAEs' temporal factor)")


def test_missing_audio_partner_fails_folders(tmp_path):
    tree = make_tree(tmp_path / "t")
    (tree / "audio_latents" / "clips" / "c1.pt").unlink()
    rep = run(tree)
    c = checks(rep)
    assert not rep["ok"] and not c["folders:t2v"]["ok"]
    d = c["folders:t2v"]["detail"]
    assert "1 of 4 sample(s) in latents/ lack a partner in audio_latents/" in d
    assert "latents/clips/c1.pt has no audio_latents/clips/c1.pt" in d and "models.audio_vae" in d
    assert not c["pairing"]["ok"] and rep["coverage"]["seen"] == 3 and rep["coverage"]["unmatched"] == ["clips/c1.pt"]


def test_empty_audio_folder_is_a_report_not_a_crash(tmp_path):
    """LTX's silent audio failure leaves audio_latents/ empty: nothing pairs."""
    tree = make_tree(tmp_path / "t", audio=False)
    (tree / "audio_latents").mkdir()
    rep = run(tree)
    c = checks(rep)
    assert not rep["ok"] and rep["mode"] == "t2v"
    assert "4 of 4 sample(s) in latents/ lack a partner in audio_latents/" in c["folders:t2v"]["detail"]
    assert not c["pairing"]["ok"] and "No valid samples found" in c["pairing"]["detail"]
    assert rep["coverage"] == {"expected": 4, "seen": 0, "unique": 0, "unmatched": []}


def test_conditions_without_audio_embeds(tmp_path):
    rep = run(make_tree(tmp_path / "t2v", audio_embeds=False))
    c = checks(rep)
    assert not rep["ok"] and not c["conditions_keys"]["ok"]
    d = c["conditions_keys"]["detail"]
    assert "4 of 4 condition(s) lack audio_prompt_embeds (e.g. clips/c0.pt)" in d
    assert "Audio connector is configured but no audio features were provided." in d
    assert "models.text.family: ltx2" in d
    assert [n for n, x in c.items() if not x["ok"]] == ["conditions_keys"]

    # the same conditions in a video-only tree are fine
    rep = run(make_tree(tmp_path / "vid", audio=False, audio_embeds=False))
    c = checks(rep)
    assert rep["ok"] and rep["mode"] == "video", rep["checks"]
    assert "folders:video" in c and "audio_latents" not in c and "audio_duration" not in c
    # and so in the t2v tree verified as video-only: its audio folder is not read
    rep = run(tmp_path / "t2v", mode="video")
    c = checks(rep)
    assert rep["ok"] and rep["mode_from"] == "argument" and rep["dirs"] == ["latents", "conditions"]
    assert "not read in this mode: audio_latents/" in c["folders:video"]["detail"]


def test_audio_duration_against_the_video(tmp_path):
    rep = run(make_tree(tmp_path / "far", shift_steps={2: 3.0}))
    c = checks(rep)
    assert not rep["ok"] and not c["audio_duration"]["ok"]
    d = c["audio_duration"]["detail"]
    assert "1 of 4 sample(s) whose audio and video durations differ by more than one step" in d
    assert "worst clips/c2.pt: audio 1.495 s vs video 1.375 s (33 frames at 24 fps), 3.0 latent step(s) apart" in d
    assert [n for n, x in c.items() if not x["ok"]] == ["audio_duration"]

    rep = run(make_tree(tmp_path / "near", shift_steps={2: 0.6, 3: -0.9}))
    c = checks(rep)
    assert rep["ok"], rep["checks"]
    assert "worst clips/c3.pt" in c["audio_duration"]["detail"]

    # num_time_steps against duration x 25 (the tensor agreeing with num_time_steps)
    tree = make_tree(tmp_path / "steps")
    torch.save(audio_record(VIDEO_SECONDS, steps=int(VIDEO_SECONDS * RATE) + 3),
               tree / "audio_latents" / "clips" / "c0.pt")
    c = checks(run(tree))
    assert not c["audio_duration"]["ok"] and c["audio_latents"]["ok"]
    assert "1 of 4 whose num_time_steps disagrees with their duration, worst clips/c0.pt: num_time_steps 37 vs duration x 25 = 34.38, 2.6 apart" in \
        c["audio_duration"]["detail"]

    # the temporal factor comes from the stamp's VAE: 4 makes 5 latent frames 17 pixel frames
    tree = make_tree(tmp_path / "t4")
    (tree / layout.PRECOMPUTED_STAMP).write_text(json.dumps({"vae": {"family": "x", "temporal": 4}}))
    c = checks(run(tree))
    assert "4 of 4 sample(s) whose audio and video durations differ" in c["audio_duration"]["detail"]
    assert "(17 frames at 24 fps)" in c["audio_duration"]["detail"]
    assert "(num_frames - 1) x 4 + 1 pixel frames / fps; 4: the vae's temporal factor in shardsmith.json" in \
        c["audio_duration"]["detail"]


def test_the_audio_encoders_extra_step_passes(tmp_path):
    """2.0 s of video (49 frames at 24.5 fps) and its audio as the encoder stores it: 51 steps, where
    duration x 25 = 50: within one step."""
    root = tmp_path / "t"
    for i in range(2):
        _save(root, "latents", f"c{i}.pt", {"latents": torch.randn(128, 7, 2, 2).bfloat16(), "num_frames": 7,
                                            "height": 2, "width": 2, "fps": 24.5})
        _save(root, "audio_latents", f"c{i}.pt", audio_record(2.0))
        _save(root, "conditions", f"c{i}.pt", {"video_prompt_embeds": torch.randn(8, 4),
                                               "audio_prompt_embeds": torch.randn(8, 2),
                                               "prompt_attention_mask": torch.ones(8, dtype=torch.int64)})
    assert torch.load(root / "audio_latents" / "c0.pt")["num_time_steps"] == 51
    rep = run(root)
    assert rep["ok"], rep["checks"]
    assert "audio 2.000 s vs video 2.000 s (49 frames at 24.5 fps), 0.0 latent step(s) apart" in \
        checks(rep)["audio_duration"]["detail"]


def test_bad_audio_latent_dicts(tmp_path):
    tree = make_tree(tmp_path / "t")
    bad = audio_record(VIDEO_SECONDS, dtype=torch.bfloat16)
    bad["num_time_steps"] += 1
    torch.save(bad, tree / "audio_latents" / "clips" / "c1.pt")
    nan = audio_record(VIDEO_SECONDS)
    nan["latents"][0, 0, 0] = float("nan")
    del nan["frequency_bins"]
    torch.save(nan, tree / "audio_latents" / "clips" / "c3.pt")
    c = checks(run(tree))
    assert not c["audio_latents"]["ok"]
    d = c["audio_latents"]["detail"]
    assert d.startswith("2 of 4 audio latent dict(s) are not what the LTX-2 trainer reads")
    assert "audio_latents/clips/c1.pt: latents are [8, 35, 16] bfloat16 (needs float32), num_time_steps 36 but " \
           "the tensor has T=35" in d
    assert "audio_latents/clips/c3.pt: lacks frequency_bins, latents hold 1 NaN/Inf value(s)" in d
    assert not c["finite:audio_latents.latents"]["ok"]


def test_a_t2a_tree_passes(tmp_path):
    rep = run(make_tree(tmp_path / "a", video=False))
    c = checks(rep)
    assert rep["ok"], rep["checks"]
    assert rep["mode"] == "t2a" and rep["dirs"] == ["conditions", "audio_latents"]
    assert "each of the 4 sample(s) in conditions/ has a partner" in c["folders:t2a"]["detail"]
    assert "audio_duration" not in c and "all 4 audio latent dict(s)" in c["audio_latents"]["detail"]


def test_mode_from_the_stamp_and_refusals(tmp_path):
    tree = make_tree(tmp_path / "v", audio=False, audio_embeds=False)
    (tree / layout.PRECOMPUTED_STAMP).write_text(json.dumps({"mode": "v2v-ic"}))
    rep = run(tree)
    c = checks(rep)
    assert rep["mode"] == "v2v-ic" and rep["mode_from"] == "stamp" and not rep["ok"]
    assert "mode v2v-ic (from shardsmith.json)" in c["folders:v2v-ic"]["detail"]
    assert "reference_latents/ is missing: the LTX trainer refuses to start" in c["folders:v2v-ic"]["detail"]
    # an explicit mode wins over the stamp; an audio mode wants audio embeddings
    c = checks(run(tree, mode="i2v"))
    assert "audio_latents/ is missing" in c["folders:i2v"]["detail"] and not c["conditions_keys"]["ok"]
    with pytest.raises(ValueError, match="unknown LTX training mode 'foo'"):
        run(tree, mode="foo")
    (tree / layout.PRECOMPUTED_STAMP).write_text(json.dumps({"mode": "bar"}))
    with pytest.raises(ValueError, match="says mode 'bar'"):
        run(tree)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "00000.tar").write_bytes(b"")
    with pytest.raises(ValueError, match="applies to .precomputed/ trees"):
        run(tmp_path / "w", mode="t2v")


def test_a_tree_of_stills_is_an_image_tree(tmp_path):
    root = tmp_path / "img"
    for i in range(2):
        _save(root, "latents", f"p{i}.pt", {"latents": torch.randn(128, 1, 2, 2).bfloat16(), "num_frames": 1,
                                            "height": 2, "width": 2, "fps": 1.0})
        _save(root, "conditions", f"p{i}.pt", {"video_prompt_embeds": torch.randn(8, 4),
                                               "prompt_attention_mask": torch.ones(8, dtype=torch.int64)})
    rep = run(root)
    assert rep["ok"] and rep["mode"] == "image" and "folders:image" in checks(rep)
    assert checks(rep)["folders:image"]["detail"].startswith("mode image (inferred")


def test_bad_conditions_shapes(tmp_path):
    tree = make_tree(tmp_path / "t")
    torch.save({"video_prompt_embeds": torch.randn(16, 32), "audio_prompt_embeds": torch.randn(12, 24),
                "prompt_attention_mask": torch.ones(16, 1, dtype=torch.int64)}, tree / "conditions/clips/c0.pt")
    torch.save({"prompt_embeds": torch.randn(16, 32), "prompt_attention_mask": torch.ones(16, dtype=torch.int64)},
               tree / "conditions/clips/c1.pt")  # the legacy key: used for both modalities
    c = checks(run(tree))
    d = c["conditions_keys"]["detail"]
    assert d == ("1 of 4 condition(s) do not hold what the LTX-2 trainer reads, e.g. clips/c0.pt: "
                 "prompt_attention_mask is [16, 1] int64 (needs [L] int64)")


@pytest.mark.slow
def test_cli_exit_codes_and_lines(tmp_path):
    good = make_tree(tmp_path / "good")
    r = subprocess.run([sys.executable, "-m", "shardsmith", "verify", str(good)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[PASS] folders:t2v: mode t2v (inferred from the folders present" in r.stdout
    assert "[PASS] audio_duration:" in r.stdout and r.stdout.rstrip().endswith("OK")
    bad = make_tree(tmp_path / "bad", audio_embeds=False)
    r = subprocess.run([sys.executable, "-m", "shardsmith", "verify", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "conditions_keys" in x)
    assert line.startswith("  [FAIL] conditions_keys: 4 of 4 condition(s) lack audio_prompt_embeds")
    assert "Audio connector is configured but no audio features were provided." in line
    assert r.stdout.rstrip().endswith("FAILED")


def test_inspect_and_repair_pair_the_audio_folders(tmp_path):
    from shardsmith.verify.precomputed_inspect import inspect_precomputed, repair_precomputed

    tree = make_tree(tmp_path / "t")
    (tree / "audio_latents" / "clips" / "c3.pt").unlink()
    for i in range(N):
        _save(tree, "reference_audio_latents", f"clips/c{i}.pt", audio_record(VIDEO_SECONDS))
    (tree / "audio_latents" / "clips" / "c1.pt").write_bytes(b"xx")
    rep = inspect_precomputed(tree)
    assert rep["unpaired"] == [{"file": "clips/c3.pt", "in": ["latents", "conditions", "reference_audio_latents"],
                                "missing": ["audio_latents"]}]
    assert [u["file"] for u in rep["dirs"]["audio_latents"]["unreadable"]] == ["audio_latents/clips/c1.pt"]
    assert rep["dirs"]["reference_audio_latents"]["shapes"] == {"8x35x16": 4} and rep["samples"] == 2
    rep = repair_precomputed(tree)
    assert sorted(m["file"] for m in rep["moved"]) == sorted(
        f"{d}/clips/c{i}.pt" for i in (1, 3) for d in ("latents", "conditions", "audio_latents",
                                                        "reference_audio_latents") if (d, i) != ("audio_latents", 3))
    assert rep["after"]["ok"] and rep["after"]["samples"] == 2
    assert run(tree, mode="av2av-ic")["checks"][0]["detail"].startswith("mode av2av-ic (as asked) reads latents/, "
                                                                         "conditions/, audio_latents/, "
                                                                         "reference_latents/, reference_audio_latents/")


def test_a_video_only_tree_made_for_ltx2_needs_audio_embeddings_too(tmp_path):
    """The LTX-2 trainer builds its audio connector in every mode (checked with its own training step on
    CPU: video-only modes fail the same way): a tree whose stamp says LTX-2 needs audio_prompt_embeds."""
    tree = make_tree(tmp_path / "v", audio=False, audio_embeds=False)
    (tree / layout.PRECOMPUTED_STAMP).write_text(json.dumps({"vae": {"family": "ltx2"}, "text": {"family": "t5"}}))
    rep = run(tree)
    c = checks(rep)
    assert rep["mode"] == "video" and not rep["ok"] and not c["conditions_keys"]["ok"]
    assert "made for LTX-2 (its stamp), whose trainer builds its audio connector in every mode, video too" \
        in c["conditions_keys"]["detail"]
    (tree / layout.PRECOMPUTED_STAMP).write_text(json.dumps({"vae": {"family": "ltx"}, "text": {"family": "t5"}}))
    assert run(tree)["ok"]  # an LTX-Video tree: no audio connector
