"""Values that were written as good samples or ended in a traceback (a tester's report) are now a failed item
with its reason, or one message naming the key and the fix:

- a float WAV holding NaN (an audio-only target, or a clip's audio partner) is ``failed:audio_not_finite``, and
  a 1 Hz WAV as a clip's partner (its window cuts no sample) ``failed:audio_rate_too_low``, never latents of NaN
  or a build (and every resume) dying in the encoder's resampler;
- a distill teacher returning NaN stops the run (exit 2) naming the teacher before any shard holds it; one
  returning None or a numpy array is a TeacherError, as a wrong shape is;
- a ``models.vae.config`` / ``models.teacher.config`` dict with a key its diffusers class does not take, or a
  value it cannot be built from, is refused before the plan naming the key (exit 2);
- ``distill.rho`` far outside the sensible range (1e-300 divided by zero in the step allocation) is refused
  before anything runs (exit 2).
"""

from __future__ import annotations

import io
import json
import tarfile
import wave
from pathlib import Path

import numpy as np
import pytest
import yaml

from test_cli_mistakes import assert_message, invoke

FPS = 24
BUCKET = "64x64x17"  # 17 frames at 24 fps: a 0.708 s audio window per sample


def _float_wav(path: Path, seconds: float = 1.5, rate: int = 16000, nan_at: slice | None = slice(100, 4000)) -> Path:
    """A mono float32 WAV of a tone; ``nan_at``: those samples are NaN."""
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    if nan_at is not None:
        x[nan_at] = np.nan
    soundfile.write(str(path), x, rate, subtype="FLOAT")
    return path


def _one_hz_wav(path: Path, samples: int = 4) -> Path:
    """A 16-bit PCM WAV at 1 Hz: a 0.708 s window holds no sample of it."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(1)
        w.writeframes(np.array([0, 1000, -1000, 0][:samples], dtype="<i2").tobytes())
    return path


def _ledger_details(out: Path, output: str) -> dict[str, tuple[str, str]]:
    from shardsmith import formats
    from shardsmith.plan.ledger import Ledger

    led = Ledger(out / formats.LEDGER_FILE)
    return {item: (status, detail) for item, status, detail in led.result_details(output, "train", "%", limit=100)}


# ----------------------------------------------------------------------------------------------- 1, 6: audio


@pytest.mark.slow
def test_a_nan_wav_as_an_audio_only_target_is_a_failed_item(tmp_path):
    """Was written: ``audio_latents/nan.pt`` full of NaN. Now ``failed:audio_not_finite`` naming the file and
    the fix; the good file beside it is written, with finite latents."""
    import torch

    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    audio_file(src / "good.wav", kind="speech", duration=1.5, rate=16000, layout="mono")
    _float_wav(src / "nan.wav")
    for stem in ("good", "nan"):
        (src / f"{stem}.txt").write_text(f"{stem} speech")
    rec = {"sources": [{"path": str(src)}], "models": {"text": {"family": "minilm"},
                                                       "audio_vae": {"family": "ltx2_audio"}, "device": "cpu"},
           "audio": {"durations": "1.0"}, "outputs": [{"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    block = m["outputs"]["precomputed"]
    assert block["counts"]["failed"] == {"audio_not_finite": 1}
    tree = tmp_path / "out" / ".precomputed" / "audio_latents"
    assert sorted(p.name for p in tree.rglob("*.pt")) == ["good.pt"]
    assert torch.isfinite(torch.load(tree / "good.pt", weights_only=True)["latents"]).all()
    [(status, detail)] = [v for v in _ledger_details(tmp_path / "out", "precomputed").values()
                          if v[0].startswith("failed")]
    assert status == "failed:audio_not_finite"
    assert "nan.wav" in detail and "NaN" in detail and "nan_to_num" in detail


@pytest.mark.slow
def test_nan_and_one_hz_audio_partners_fail_their_clips_only(tmp_path):
    """A clip's ``columns: {audio: ...}`` partner: a float WAV with NaN gave ``audio_latent.pth`` of NaN, and a 1 Hz
    WAV (its 17-frame window cuts 0 samples) killed the build in the resampler (``cannot reshape tensor of 0
    elements``), every resume too. Now each is its clip's failure with the reason; the good clip is written."""
    import torch

    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict
    from video_factory import audio_file, pan_video

    src = tmp_path / "src"
    src.mkdir()
    for i, name in enumerate(("a", "b", "c")):
        pan_video(src / f"{name}.mp4", frames=30, fps=FPS, size=(96, 64), photo=("astronaut", "coffee", "rocket")[i])
    audio_file(src / "good.wav", kind="speech", duration=1.5, rate=16000, layout="mono")
    _float_wav(src / "nan.wav")
    _one_hz_wav(src / "slow.wav")
    (src / "rows.csv").write_text("video,voice,caption\na.mp4,good.wav,first\nb.mp4,nan.wav,second\n"
                                  "c.mp4,slow.wav,third\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "video", "audio": "voice",
                                                                   "caption": "caption"}}],
           "geometry": {"buckets": [BUCKET]},
           "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"},
                      "device": "cpu"},
           "outputs": [{"format": "latent_wds"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    counts = m["outputs"]["latent_wds"]["counts"]
    assert counts["written"] == 1
    assert counts["failed"] == {"audio_not_finite": 1, "audio_rate_too_low": 1}
    details = {status: detail for status, detail in _ledger_details(tmp_path / "out", "latent_wds").values()}
    assert "nan.wav" in details["failed:audio_not_finite"]
    assert "slow.wav" in details["failed:audio_rate_too_low"] and "1 Hz" in details["failed:audio_rate_too_low"]
    with tarfile.open(next((tmp_path / "out").rglob("*.tar"))) as tf:
        audio = [torch.load(io.BytesIO(tf.extractfile(x).read()), weights_only=True)
                 for x in tf.getmembers() if x.name.endswith(".audio_latent.pth")]
    assert len(audio) == 1 and torch.isfinite(audio[0]).all()


def test_the_cutter_refuses_non_finite_and_too_slow_audio(tmp_path):
    """The check itself, in the decode worker's cutter (no model): each is an ItemError with its reason."""
    from shardsmith.records import ItemError
    from shardsmith.transform.audio import check_decoded, decode_audio

    nan = _float_wav(tmp_path / "nan.wav")
    with pytest.raises(ItemError) as err:
        check_decoded(decode_audio(str(nan), "n", rate=None, start=0.0, duration=0.5, keep_mono=True), "n (nan.wav)",
                      0.5)
    assert err.value.reason == "audio_not_finite" and "nan.wav" in err.value.detail
    slow = _one_hz_wav(tmp_path / "slow.wav")
    with pytest.raises(ItemError) as err:
        check_decoded(decode_audio(str(slow), "s", rate=None, start=0.0, duration=17 / FPS, keep_mono=True),
                      "s (slow.wav)", 17 / FPS)
    assert err.value.reason == "audio_rate_too_low" and "1 Hz" in err.value.detail
    good = _float_wav(tmp_path / "good.wav", nan_at=None)
    dec = decode_audio(str(good), "g", rate=None, start=0.0, duration=0.5, keep_mono=True)
    assert check_decoded(dec, "g", 0.5) is dec


# ----------------------------------------------------------------------------------------------- 2, 4: teachers

TEACHERS = '''
import numpy as np
import torch


def nan(x, t, c):
    return torch.full_like(x, float("nan"))


def inf_late(x, t, c):
    return torch.full_like(x, float("inf")) if float(t[0]) < 0.5 else torch.zeros_like(x)


def none(x, t, c):
    return None


def array(x, t, c):
    return np.zeros(tuple(x.shape), dtype=np.float32)
'''


@pytest.fixture
def teachers(tmp_path, monkeypatch):
    (tmp_path / "bad_teachers.py").write_text(TEACHERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "bad_teachers"


def _kd_recipe(tmp: Path, teacher: dict, **distill) -> Path:
    (tmp / "p.jsonl").write_text("".join(json.dumps({"prompt": f"a photo of thing {i}"}) + "\n" for i in range(6)))
    r = {"sources": [{"path": "p.jsonl", "columns": {"caption": "prompt"}}], "outputs": [{"format": "kd_wds"}],
         "models": {"teacher": teacher, "text": {"family": "minilm"}, "device": "cpu"},
         "distill": {"shape": [4, 8, 8], "steps": 4, **distill}}
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _pth_members(out: Path):
    import torch

    for shard in out.rglob("*.tar"):
        with tarfile.open(shard) as tf:
            for x in tf.getmembers():
                if x.name.endswith(".pth"):
                    yield x.name, torch.load(io.BytesIO(tf.extractfile(x).read()), weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("fn, when", [("nan", "NaN or inf at t = 0.999 (its call 1 of 8"),
                                      ("inf_late", "NaN or inf at t = 0 (its call 8 of 8")])
def test_a_teacher_giving_nan_stops_the_run_before_any_shard_holds_it(tmp_path, teachers, fn, when):
    """Was ``written 6`` with latent.pth / path.pth of NaN. Now exit 2 naming the teacher and when it did."""
    out = tmp_path / "out"
    code, output = invoke("distill", _kd_recipe(tmp_path, {"family": "callable", "entry_point": f"{teachers}:{fn}",
                                                           "parameterisation": "flow"}), "--out", out)
    assert_message(code, output, f"models.teacher ({teachers}:{fn})", when, "finite")
    assert "done:" not in output and "Traceback" not in output
    import torch

    assert all(torch.isfinite(t).all() for _, t in _pth_members(out))


@pytest.mark.parametrize("fn, says", [("none", "returned None"), ("array", "numpy.ndarray")])
def test_a_teacher_returning_no_tensor_is_a_teacher_error(teachers, fn, says):
    """Was an AttributeError (``'NoneType' object has no attribute 'shape'``, ``'numpy.ndarray' object has no
    attribute 'float'``); now a TeacherError (exit 2) naming the entry point, as a wrong shape is."""
    import torch

    from shardsmith.encode.teacher import TeacherError, load_teacher

    teacher = load_teacher("callable", entry_point=f"{teachers}:{fn}", parameterisation="flow")
    with pytest.raises(TeacherError) as err:
        teacher.predict(torch.zeros(2, 4, 8, 8), 0.5, torch.zeros(2, 3, 384))
    assert err.value.exit_code == 2
    assert f"{teachers}:{fn}" in str(err.value) and says in str(err.value) and "torch.Tensor" in str(err.value)


def test_a_teacher_nan_on_padding_rows_only_is_not_refused():
    """The batch's padding rows (zero conditions, a zero mask) may give NaN in a real model's attention: only the
    batch's own rows are checked."""
    import torch

    from shardsmith.distill.trajectories import Sampler
    from shardsmith.encode.teacher import Teacher, TeacherSpec
    from shardsmith.encode.spec import Provenance

    def fn(x, t, cond, mask):
        out = torch.zeros_like(x)
        out[cond.abs().sum(dim=(1, 2)) == 0] = float("nan")  # the zero rows: the padding
        return out

    teacher = Teacher(TeacherSpec("callable", "flow"), Provenance(cls="t", weights="pretrained"), fn, "cpu")
    s = Sampler("flow", "euler", 4, (0.999, 0.0), 1.0, 1.0, (4, 8, 8))
    got = s.run(teacher, [1, 2], torch.ones(2, 3, 16), None, pad_to=4)
    assert len(got) == 2 and all(torch.isfinite(t.latent).all() for t in got)


# ----------------------------------------------------------------------------------------------- 3: model configs


def _latent_recipe(tmp: Path, **over) -> Path:
    from PIL import Image

    (tmp / "src").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 10, 10)).save(tmp / "src" / "a.jpg")
    r = {"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x17", "64x64x1"]},
         "models": {"vae": {"family": "ltx2"}, "device": "cpu"}, "outputs": [{"format": "latent_wds"}], **over}
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("config, texts", [
    ("{nosuch: 1}", ["models.vae.config", "AutoencoderKLLTX2Video", "'nosuch'", "latent_channels"]),
    ("{latnet_channels: 64}", ["models.vae.config", "'latnet_channels'", "did you mean 'latent_channels'"]),
    ("{latent_channels: -1}", ["models.vae.config", "negative dimension", "cannot be built"]),
    ("{block_out_channels: abc}", ["models.vae.config", "TypeError", "cannot be built"]),
    ("{block_out_channels: 5}", ["models.vae.config", "TypeError"]),
    ("{latent_channels: 0}", ["models.vae.config", "latent channels 0", "at least 1"]),
])
def test_a_vae_config_dict_the_class_refuses_is_one_message_before_the_plan(tmp_path, config, texts):
    out = tmp_path / "out"
    code, output = invoke("build", _latent_recipe(tmp_path), "--out", out, "--set", f"models.vae.config={config}")
    assert_message(code, output, *texts)
    assert not out.exists()


@pytest.mark.slow
def test_a_teacher_config_dict_the_class_refuses_is_one_message_before_the_plan(tmp_path):
    out = tmp_path / "out"
    recipe = _kd_recipe(tmp_path, {"family": "unet", "config": {"cross_attention_dim": 384, "nosuch": 1}},
                        t_list=[14.6, 1.0, 0.0])
    code, output = invoke("distill", recipe, "--out", out)
    assert_message(code, output, "models.teacher.config", "UNet2DConditionModel", "'nosuch'")
    assert not out.exists()
    code, output = invoke("distill", recipe, "--out", out, "--set",
                          "models.teacher.config={cross_attention_dim: 384, block_out_channels: abc}")
    assert_message(code, output, "models.teacher.config", "cannot be built")
    assert not out.exists()


@pytest.mark.slow
def test_the_named_configs_given_as_dicts_pass():
    """No false refusal: every named config of every VAE family and teacher, given as a dict, passes the check."""
    from shardsmith.encode import teacher, vae
    from shardsmith.encode.vae_config import CONFIGS

    for family, configs in CONFIGS.items():
        for cfg in configs.values():
            vae.check_config(family, dict(cfg))
    for family, configs in (("unet", teacher.UNET_CONFIGS), ("sana", teacher.SANA_CONFIGS)):
        for cfg in configs.values():
            teacher.check_config(family, dict(cfg))


# ----------------------------------------------------------------------------------------------- 5: distill.rho


@pytest.mark.parametrize("rho", [1e-300, 1e-3, 1e5])
def test_a_degenerate_rho_is_refused_before_anything_runs(tmp_path, rho):
    """``distill.rho: 1e-300`` was a ZeroDivisionError in the step allocation (an OverflowError with an edm t_list)."""
    out = tmp_path / "out"
    code, output = invoke("distill", _kd_recipe(tmp_path, {"family": "callable", "entry_point":
                                                           "shardsmith.distill.gaussian:velocity",
                                                           "parameterisation": "flow"}, rho=rho), "--out", out)
    assert_message(code, output, "distill.rho", f"rho {rho:g}", "[0.1, 100]")
    assert not out.exists()


def test_time_grid_refuses_what_leaves_float64():
    from shardsmith.distill.schedule import time_grid

    with pytest.raises(ValueError, match="not a finite float64"):
        time_grid(8, [1e300, 0.0], 0.1)
    with pytest.raises(ValueError, match=r"rho 1e-300 is outside"):
        time_grid(8, [80.0, 10.0, 0.0], 1e-300)


# ----------------------------------------------------------------------------------------------- 7: distill.t_list


@pytest.mark.parametrize("t_list, says", [([0.0], "needs at least 2"), ([0.5, 0.5, 0.0], "not strictly decreasing"),
                                          ([1.0, 0.5], "append 0.0"), ([0.999, -0.1, 0.0], "negative time -0.1")])
def test_a_t_list_names_the_rule_it_breaks(tmp_path, t_list, says):
    """``distill.t_list: [0.0]`` was refused as 'must be strictly decreasing and end at 0.0', which it is."""
    out = tmp_path / "out"
    code, output = invoke("distill", _kd_recipe(tmp_path, {"family": "callable", "entry_point":
                                                           "shardsmith.distill.gaussian:velocity",
                                                           "parameterisation": "flow"}, t_list=t_list), "--out", out)
    assert_message(code, output, "distill.t_list", says)
    assert not out.exists()


def test_a_config_dict_pasted_from_a_config_json_passes_with_its_bookkeeping_keys():
    """``_class_name`` / ``_diffusers_version`` (in every HF config.json; diffusers drops them) were refused as
    keys the class does not take; the class builds from such a dict."""
    from shardsmith.encode.vae import check_config
    from shardsmith.encode.vae_config import CONFIGS

    cfg = {**CONFIGS["sd"]["tiny"], "_class_name": "AutoencoderKL", "_diffusers_version": "0.30.0"}
    check_config("sd", cfg)  # no ModelConfigError


@pytest.mark.slow
def test_a_distill_that_samples_no_prompt_exits_3_naming_the_reasons(tmp_path):
    """Every prompt failed (empty captions): distill said 'done' and exited 0 with nothing sampled; now it ends
    as a build that writes nothing does (exit 3, the counts by reason), its manifest still written."""
    recipe = _kd_recipe(tmp_path, {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity",
                                   "parameterisation": "flow"})
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": ""}) + "\n" for _ in range(3)))
    code, output = invoke("distill", recipe, "--out", tmp_path / "out")
    assert code == 3 and "no sample was written to" in output and "done:" not in output, output
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["written"] == 0
