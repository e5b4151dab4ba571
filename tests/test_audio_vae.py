"""The LTX-2 audio encoder (encode/audio_vae.py): log-mel, latent shapes, the audio_latents/ record,
determinism, batch independence, from_pretrained, decode and WAV bytes."""

from __future__ import annotations

import dataclasses
import inspect
import io
import wave

import numpy as np
import pytest
import torch

from shardsmith.encode import audio_vae as av
from shardsmith.encode.audio_vae import audio_vae_settings, load_audio_vae, mel_filters, wav_bytes
from video_factory import speech_wave

RATE = 16000


def _stereo(seconds: float, text: str = "shardsmith makes every failure loud") -> np.ndarray:
    mono = speech_wave(seconds, RATE, text=text)
    return np.stack([mono, mono * 0.7]).astype(np.float32)


@pytest.fixture(scope="module")
def tiny():
    return load_audio_vae(config="tiny")


@pytest.fixture(scope="module")
def speech2():
    return _stereo(2.0)


# ----------------------------------------------------------------------------- settings and arithmetic


def test_published_config_is_diffusers_defaults():
    """"published" is AutoencoderKLLTX2Audio's defaults, which diffusers' convert_ltx2_to_diffusers.py lists as
    LTX-2's audio VAE (get_ltx2_audio_vae_config "2.0"; "2.3" and "2.5" say "Same config as LTX-2.0")."""
    from diffusers import AutoencoderKLLTX2Audio

    defaults = {k: p.default for k, p in inspect.signature(AutoencoderKLLTX2Audio.__init__).parameters.items()
                if k != "self"}
    assert av.PUBLISHED == defaults
    assert av.CONFIGS["ltx2_audio"]["published"] == {}


def test_settings_and_latent_steps():
    pub = audio_vae_settings(config="published")
    assert (pub.sample_rate, pub.hop_length, pub.n_fft, pub.mel_bins) == (16000, 160, 1024, 64)
    assert (pub.latent_channels, pub.frequency_bins, pub.temporal) == (8, 16, 4)
    assert pub.latent_steps_per_second == 25.0  # 16000 / 160 / 4, LTX's latents_per_second
    # LTX-2 (ltx_core/types.py AudioLatentShape.from_duration): frames = round(duration * 16000 / 160 / 4),
    # i.e. 50 for 2.0 s and 34 for 1.37 s. What the encoder returns (and the trainer stores as num_time_steps)
    # is one more: 1 + N // 160 mel frames (centred STFT: 201 for 2.0 s) through two causal stride-2
    # convolutions ((t - 1) // 2 + 1 twice: 201 -> 101 -> 51). Checked against ltx-core's AudioEncoder run on
    # the same weights: 51 for 2.0 s, 35 for 1.37 s.
    assert round(2.0 * pub.latent_steps_per_second) == 50
    assert pub.mel_frames(32000) == 201
    assert pub.latent_steps(32000) == 51
    assert pub.latent_steps(21920) == 35
    assert pub.latent_shape(32000) == (8, 51, 16)
    assert [pub.latent_steps(n) for n in (513, 639, 640, 641, 1279, 1280)] == [1, 1, 2, 2, 2, 3]
    tiny = audio_vae_settings()  # the test model keeps the published front end, 2 channels
    assert (tiny.sample_rate, tiny.hop_length, tiny.mel_bins, tiny.frequency_bins) == (16000, 160, 64, 16)
    assert tiny.latent_channels == 2 and tiny.latent_steps(32000) == 51
    with pytest.raises(ValueError, match="unknown audio VAE family"):
        audio_vae_settings("nope")
    with pytest.raises(ValueError, match="ch_mult needs 3 entries"):
        audio_vae_settings(config={"ch_mult": (1, 2)})


# ----------------------------------------------------------------------------- mel


@pytest.mark.parametrize("rate,n_fft,mels", [(16000, 1024, 64), (44100, 2048, 128), (22050, 512, 80),
                                             (24000, 1024, 64), (1600, 256, 40)])
def test_the_filterbank_is_transformers_mel_filter_bank_bit_for_bit(rate, n_fft, mels):
    """Our own arithmetic (no transformers import in an audio build) gives the float32 values transformers'
    ``mel_filter_bank`` gave before it, so the latents of earlier builds stay the same bytes."""
    from transformers.audio_utils import mel_filter_bank

    ref = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mels, min_frequency=0.0,
                          max_frequency=rate / 2.0, sampling_rate=rate, norm="slaney", mel_scale="slaney")
    ours = mel_filters(rate, n_fft, mels)
    assert ours.dtype == np.float32 and ours.shape == (n_fft // 2 + 1, mels)
    assert ours.tobytes() == np.ascontiguousarray(ref, dtype=np.float32).tobytes()


def test_mel_filterbank_is_slaney():
    """Against torchaudio's melscale_fbanks(513, 0, 8000, 64, 16000, norm="slaney", mel_scale="slaney") (the
    filterbank of LTX's AudioProcessor): support, peak bin, peak value and area of four filters, taken from
    torchaudio's algorithm (functional.py) run in float32. Ours is computed in float64, so values agree to
    float32 rounding (1e-5 relative)."""
    fb = mel_filters(16000, 1024, 64).astype(np.float64)
    assert fb.shape == (513, 64)
    ref = {0: (1, 5, 3, 0.021331151947379112, 0.06399345537647605),
           10: (30, 35, 33, 0.019152283668518066, 0.06399345258250833),
           32: (106, 116, 111, 0.011424848809838295, 0.06394863117020577),
           63: (466, 511, 488, 0.002730027539655566, 0.06400368928734679)}
    for m, (lo, hi, peak, value, area) in ref.items():
        nz = np.flatnonzero(fb[:, m] > 0)
        assert (nz[0], nz[-1], int(fb[:, m].argmax())) == (lo, hi, peak)
        assert fb[peak, m] == pytest.approx(value, rel=1e-5)
        assert fb[:, m].sum() == pytest.approx(area, rel=1e-5)


def test_mel_matches_reference(tiny, speech2):
    """Our log-mel (torch.stft, float32) against transformers.audio_utils.spectrogram (numpy FFT, float64) with
    the same settings: periodic Hann 1024, hop 160, centred with reflect padding, magnitude (power 1), the
    slaney filterbank, log(max(mel, 1e-5)). Tolerance: 1e-4 absolute on the log-mel (float32 STFT rounding;
    the largest values are about 3, the floor is log(1e-5) = -11.5)."""
    from transformers.audio_utils import spectrogram, window_function

    ours = tiny.mel(torch.from_numpy(speech2)[None]).cpu()
    assert ours.shape == (1, 2, 201, 64) and ours.dtype == torch.float32
    fb = mel_filters(16000, 1024, 64).astype(np.float64)
    for ch in range(2):
        ref = spectrogram(speech2[ch].astype(np.float64), window_function(1024, "hann", periodic=True),
                          frame_length=1024, hop_length=160, fft_length=1024, power=1.0, center=True,
                          pad_mode="reflect", mel_filters=fb, mel_floor=1e-5, log_mel="log", dtype=np.float64)
        assert ref.shape == (64, 201)
        diff = np.abs(ours[0, ch].numpy().astype(np.float64) - ref.T)
        assert diff.max() < 1e-4, diff.max()
    # real speech: the spectrum is well above the floor in the speech band
    assert float(ours.max()) > -2.0 and float(ours.min()) >= np.log(1e-5) - 1e-6


# ----------------------------------------------------------------------------- encode, record


def test_encode_shapes_and_record(tiny, speech2):
    (z,) = tiny.encode([speech2])
    assert z.shape == (2, 51, 16) == (tiny.spec.latent_channels, tiny.latent_steps(32000), tiny.spec.frequency_bins)
    assert z.dtype == torch.float32 and z.device.type == "cpu" and torch.isfinite(z).all()
    rec = tiny.record(z, 2.0)
    # process_videos.py _encode_audio / compute_audio_latents: these keys in this order; T and F are ints
    # (from the tensor's shape), duration a float (samples / sample rate)
    assert list(rec) == ["latents", "num_time_steps", "frequency_bins", "duration"]
    assert rec["latents"].dtype == torch.float32 and rec["latents"].is_contiguous()
    assert type(rec["num_time_steps"]) is int and rec["num_time_steps"] == 51
    assert type(rec["frequency_bins"]) is int and rec["frequency_bins"] == 16
    assert type(rec["duration"]) is float and rec["duration"] == 2.0
    buf = io.BytesIO()
    torch.save(rec, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)  # as the trainer loads it
    assert torch.equal(back["latents"], z)
    with pytest.raises(ValueError, match="expected audio latents"):
        tiny.record(z[:, :, :8], 2.0)
    spec = tiny.spec.to_dict()
    assert spec["kind"] == "audio_vae" and spec["sample_rate"] == 16000 and spec["temporal"] == 4
    assert tiny.provenance.weights == "random-weights" and tiny.provenance.config_name == "tiny"


def test_normalisation_is_ltx_patchified_statistics(tiny, speech2):
    """LTX's AudioEncoder._normalize_latents on diffusers' output: the posterior mean, patchified
    b c t f -> b t (c f), (x - latents_mean) / latents_std over the C*F channels, unpatchified."""
    x = torch.from_numpy(speech2)[None]
    with torch.inference_mode():
        mean = tiny.model.encode(tiny.mel(x)).latent_dist.mean  # [1, C, T, F]
    b, c, t, f = mean.shape
    assert tiny.model.latents_mean.shape == (c * f,)
    patched = mean.permute(0, 2, 1, 3).reshape(b, t, c * f)
    norm = (patched - tiny.model.latents_mean) / tiny.model.latents_std
    expect = norm.reshape(b, t, c, f).permute(0, 2, 1, 3)
    (z,) = tiny.encode([speech2])
    assert torch.equal(z, expect[0])
    assert not torch.equal(z, mean[0])  # the tiny statistics are not the identity
    assert torch.allclose(tiny.denormalise(z[None]), mean, atol=1e-6)


def test_bfloat16_model_stores_float32(speech2):
    """The LTX trainer loads its audio encoder in float32 and stores what it returns; a bfloat16 model here
    still gives float32 latents and records."""
    v = load_audio_vae(config="tiny", dtype="bfloat16")
    assert v.spec.dtype == "bfloat16"
    (z,) = v.encode([speech2])
    assert z.dtype == torch.float32 and z.shape == (2, 51, 16)
    assert v.record(z, 2.0)["latents"].dtype == torch.float32
    ref = load_audio_vae(config="tiny").encode([speech2])[0]
    assert (z - ref).abs().max() < 0.25  # bfloat16 rounding of the same (seeded) weights


def test_determinism(tiny, speech2):
    a = tiny.encode([speech2])[0]
    b = tiny.encode([speech2.copy()])[0]
    assert a.numpy().tobytes() == b.numpy().tobytes()
    fresh = load_audio_vae(config="tiny").encode([speech2])[0]  # the seeded build gives the same weights
    assert fresh.numpy().tobytes() == a.numpy().tobytes()
    bufs = []
    for z in (a, b):
        buf = io.BytesIO()
        torch.save(tiny.record(z, 2.0), buf)
        bufs.append(buf.getvalue())
    assert bufs[0] == bufs[1]


def test_batch_independence(tiny, speech2):
    """One clip alone and the same clip in a batch of three equal-length clips: equal within 1e-5 absolute
    (CPU convolutions may pick another algorithm for another batch size; latents are O(1))."""
    others = [_stereo(2.0, "a completely different sentence"), _stereo(2.0, "one two three four five")]
    alone = tiny.encode([speech2])[0]
    batch = tiny.encode([others[0], speech2, others[1]])
    assert (batch[1] - alone).abs().max() < 1e-5
    assert not torch.allclose(batch[0], batch[1])
    # mixed lengths: one forward per length, results in input order
    short = _stereo(1.37)
    mixed = tiny.encode([short, speech2, short[:, ::-1].copy()])
    assert [tuple(z.shape) for z in mixed] == [(2, 35, 16), (2, 51, 16), (2, 35, 16)]
    assert (mixed[1] - alone).abs().max() < 1e-5


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_oom_halves_the_batch(tiny, speech2, monkeypatch):
    real = tiny._forward
    calls = []

    def forward(x, rate):
        calls.append(x.shape[0])
        if x.shape[0] > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(x, rate)

    monkeypatch.setattr(tiny, "_forward", forward)
    before = tiny.oom_retries
    out = tiny.encode([speech2, speech2 * 0.5, speech2 * 0.25])
    assert calls == [3, 1, 2, 1, 1]
    assert tiny.oom_retries - before == 2
    monkeypatch.setattr(tiny, "_forward", real)
    ref = tiny.encode([speech2, speech2 * 0.5, speech2 * 0.25])
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(out, ref))

    def broken(x, rate):
        raise RuntimeError("something else")

    monkeypatch.setattr(tiny, "_forward", broken)
    with pytest.raises(RuntimeError, match="something else"):
        tiny.encode([speech2])


def test_bad_inputs(tiny):
    with pytest.raises(ValueError, match=r"stereo waveform \[2, N\]"):
        tiny.encode([np.zeros(16000, np.float32)])
    with pytest.raises(ValueError, match="too short"):
        tiny.encode([np.zeros((2, 400), np.float32)])
    with pytest.raises(ValueError, match="unknown config"):
        load_audio_vae(config="huge")
    small = dict(base_channels=32, ch_mult=(1, 1, 1), num_res_blocks=1)
    with pytest.raises(ValueError, match="base_channels must equal"):  # 4 x 16 = 64 statistics needed, 32 given
        load_audio_vae(config={**small, "latent_channels": 4})
    custom = load_audio_vae(config={**small, "latent_channels": 2, "vocoder": None})
    assert custom.vocoder is None and custom.provenance.config_name == "custom"


def test_settings_of_a_missing_pretrained_model(tmp_path):
    from shardsmith.errors import UserError

    with pytest.raises(UserError, match="config.json was not found"):
        audio_vae_settings(pretrained=str(tmp_path / "missing"), subfolder="audio_vae")


# ----------------------------------------------------------------------------- pretrained, decode


def test_from_pretrained_round_trip(tiny, speech2, tmp_path):
    tiny.model.save_pretrained(tmp_path / "audio_vae")
    tiny.vocoder.save_pretrained(tmp_path / "vocoder")
    v = load_audio_vae(pretrained=str(tmp_path), subfolder="audio_vae")
    assert v.provenance.weights == "pretrained" and v.provenance.weights_sha256
    assert v.provenance.subfolder == "audio_vae" and v.vocoder is not None
    assert any(n.startswith("vocoder: LTX2Vocoder") for n in v.provenance.notes)
    assert v.spec == tiny.spec
    settings = audio_vae_settings(pretrained=str(tmp_path), subfolder="audio_vae")  # config.json only
    assert settings == dataclasses.replace(audio_vae_settings(config="tiny"), config_name=None)
    (z,) = v.encode([speech2])
    assert torch.equal(z, tiny.encode([speech2])[0])
    w1, r1 = v.decode(z[None, :, :8])
    w2, r2 = tiny.decode(z[None, :, :8])
    assert r1 == r2 == 24000 and torch.equal(w1, w2)
    # a folder without a vocoder beside it loads, says so, and refuses to decode
    bare = load_audio_vae(pretrained=str(tmp_path / "audio_vae"))
    assert bare.vocoder is None and any("no vocoder" in n for n in bare.provenance.notes)
    with pytest.raises(RuntimeError, match="no vocoder"):
        bare.decode(z[None])


def test_decode(tiny, speech2):
    (z,) = tiny.encode([speech2])
    wav, rate = tiny.decode(z[None])
    # the decoder gives 4T - 3 = 201 mel frames (ltx-core AudioDecoder target_frames), the vocoder x240
    assert rate == 24000 and wav.shape == (1, 2, 201 * 240) and wav.dtype == torch.float32
    assert torch.isfinite(wav).all() and wav.abs().max() <= 1.0  # tanh output
    with pytest.raises(ValueError, match="expected audio latents"):
        tiny.decode(torch.zeros(1, 3, 5, 16))


@pytest.mark.slow
def test_published_architecture(speech2):
    """LTX-2's published audio VAE (random weights): 2.0 s -> [8, 51, 16]; decoded to 24 kHz."""
    v = load_audio_vae(config="published")
    assert v.spec.latent_channels == 8 and v.spec.frequency_bins == 16
    assert v.model.latents_mean.shape == (128,)
    (z,) = v.encode([speech2])
    assert z.shape == (8, 51, 16) and torch.isfinite(z).all()
    rec = v.record(z, 2.0)
    assert rec["num_time_steps"] == 51 and rec["frequency_bins"] == 16
    assert v.vocoder.config.hidden_channels == 1024 and v.output_rate == 24000
    wav, rate = v.decode(z[None, :, :4])
    assert rate == 24000 and wav.shape == (1, 2, (4 * 4 - 3) * 240) and torch.isfinite(wav).all()


# ----------------------------------------------------------------------------- wav bytes


def test_wav_bytes():
    t = np.arange(1600) / 16000.0
    x = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), np.full_like(t, 2.0)]).astype(np.float32)  # right clips
    data = wav_bytes(x, 16000)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (2, 2, 16000, 1600)
        pcm = np.frombuffer(w.readframes(1600), "<i2").reshape(-1, 2).T
    assert np.abs(pcm[0] / 32767.0 - x[0]).max() <= 0.5 / 32767 + 1e-9
    assert (pcm[1] == 32767).all()
    with wave.open(io.BytesIO(wav_bytes(x[0], 24000))) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (1, 24000, 1600)
    assert wav_bytes(x, 16000) == data
    with pytest.raises(ValueError, match="non-finite"):
        wav_bytes(np.array([0.0, np.nan]), 16000)


def test_the_spec_records_the_per_channel_statistics():
    """The manifest's spec says how the latents were normalised: LTX-2's statistics over the patchified
    channels (c, f) -> c * F + f, latent_channels x frequency_bins of them (not "stored raw")."""
    from shardsmith.encode.audio_vae import load_audio_vae

    vae = load_audio_vae("ltx2_audio", config="tiny", vocoder=False)
    n = vae.spec.normalisation
    assert n["type"] == "mean_std" and len(n["mean"]) == len(n["std"]) == 2 * 16
    assert n["mean"] == vae.model.latents_mean.tolist() and n["std"] == vae.model.latents_std.tolist()
    assert vae.spec.to_dict()["normalisation"]["type"] == "mean_std"
