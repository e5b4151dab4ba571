"""LTX-2's audio VAE (diffusers ``AutoencoderKLLTX2Audio``): waveforms -> the audio latents the LTX-2
trainer caches in ``audio_latents/``, and back to waveforms through the vocoder.

Contract
- :func:`audio_vae_settings` reads what the encoder takes and gives from a config (a named one, a
  dict, or a pretrained folder's ``config.json``) without building a model: sample rate, hop, FFT
  size, mel bins, latent channels and frequency bins, the temporal factor (4) and
  :meth:`AudioSettings.latent_steps`. Worker processes and prechecks use it.
- :func:`load_audio_vae` builds an :class:`AudioVae`: ``pretrained`` loads real weights with
  ``from_pretrained`` (hashed, provenance ``"pretrained"``); without it a model is built from
  ``config`` ("tiny", "published" or a dict) under ``torch.manual_seed(0)`` and labelled
  ``"random-weights"`` (its latents are NOT model-space data), exactly as :func:`~shardsmith.encode.vae.load_vae`.
- :meth:`AudioVae.encode`: waveforms (:class:`~shardsmith.records.Waveform` at their own rate, resampled on the
  model's device first by :mod:`shardsmith.encode.resample`, or ``[2, N]`` float32 at ``spec.sample_rate``)
  -> ``[C, T, F]`` float32 on the CPU (``[8, T, 16]`` for LTX-2), what LTX-2's ``AudioEncoder.forward`` returns
  (see below); items of equal rate, channels and length run as one batch (halved on a CUDA out-of-memory error), each result independent of
  its batch-mates. :meth:`AudioVae.record` is the ``audio_latents/*.pt`` dict exactly as LTX's
  ``process_videos.py`` / ``compute_audio_latents`` save it. :meth:`AudioVae.decode`: latents ->
  ``(waveform [B, 2, N'], rate)`` through the VAE decoder and the vocoder (LTX's ``decode_latents`` path).
- :func:`wav_bytes` (from :mod:`shardsmith.transform.audio`): a waveform as a 16-bit PCM WAV file's bytes.

What LTX-2 computes, and how this module matches it (ltx-core ``model/audio_vae``; ltx-trainer
``scripts/process_videos.py``):

0. Channels and rate (``_encode_audio``, ``AudioProcessor.resample_audio``): on the encoder's device, mono is
   duplicated to stereo and the waveform resampled to ``sample_rate`` by ``torchaudio.functional.resample``.
   Here: the same order, with :mod:`shardsmith.encode.resample` (torchaudio's arithmetic; its samples on the
   CPU bit for bit).
1. Log-mel (``ops.AudioProcessor``): torchaudio ``MelSpectrogram(sample_rate, n_fft=win=1024, hop=160,
   f_min=0, f_max=sr/2, n_mels=64, hann window, center=True, reflect, power=1, mel_scale="slaney",
   norm="slaney")`` then ``log(clamp(x, 1e-5))``, permuted to ``[B, 2, T_mel, mels]``. Here: ``torch.stft``
   (same window, padding and size; magnitude) times the slaney filterbank of
   ``transformers.audio_utils.mel_filter_bank`` (torchaudio is not used). ``T_mel = 1 + N // hop``.
2. ``AudioEncoder.forward``: the network's output ``[B, 2C, T, F]`` is cut to its first ``C`` channels
   (the posterior mean: diffusers' ``latent_dist.mean``, the same ``torch.chunk``), patchified
   ``b c t f -> b t (c f)`` (``AudioPatchifier``), normalised with the per-channel statistics
   ``(x - mean-of-means) / std-of-means`` over the ``C*F`` = 128 patchified channels (diffusers'
   ``latents_mean`` / ``latents_std`` buffers, renamed from those keys), and unpatchified. Channel
   ``c*F + f`` of the statistics belongs to latent ``[c, :, f]``: this module applies exactly that,
   in float32. (``spec.normalisation`` stays None: EncoderSpec's ``mean_std`` check wants one entry per
   latent channel, these are C*F; the statistics are the model's buffers, hashed with its weights.)
3. Saved (``_encode_audio`` and ``compute_audio_latents``): ``latents`` = that ``[C, T, F]`` tensor from an
   encoder loaded in float32, ``num_time_steps`` = T and ``frequency_bins`` = F (ints, from the
   tensor's shape), ``duration`` = samples / sample rate of the waveform before resampling (a float).

T: two causal stride-2 convolutions over time (``causality_axis="height"``, padding 2 before) give
``T = (T_mel - 1) // 4 + 1 = N // (4 * hop) + 1``: 2.0 s at 16 kHz is 201 mel frames and 51 latent
steps. LTX's ``AudioLatentShape.from_duration`` (used to size generated audio) says
``round(duration * 25)`` = 50 for the same 2.0 s; the trainer stores the encoder's 51.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .diffusers_import import model_class
from .spec import EncoderSpec, Provenance, hash_pretrained, pretrained_kwargs

if TYPE_CHECKING:  # torch is imported where a model is built or run: settings stay cheap
    import torch

log = logging.getLogger(__name__)

AUDIO_FAMILIES = ("ltx2_audio",)
CLS = "AutoencoderKLLTX2Audio"
SEED = 0  # the same seed as encode.vae (seeded_init)

# diffusers' LATENT_DOWNSAMPLE_FACTOR / ltx-core's: the decoder's time factor is this constant
# (``target_frames = 4 * T - 3``), whatever ch_mult says, so configs keep two downsamplings.
LATENT_DOWNSAMPLE_FACTOR = 4
# LTX's AudioEncoderConfigurator: ``n_fft = preprocessing.stft.filter_length`` (default 1024; the win
# length is the same). diffusers' config has no such key: a dict config may set ``n_fft``.
N_FFT = 1024
LOG_FLOOR = 1e-5  # log(clamp(mel, 1e-5))

# AutoencoderKLLTX2Audio's defaults, which are LTX-2's published audio VAE: diffusers'
# scripts/convert_ltx2_to_diffusers.py get_ltx2_audio_vae_config("2.0") (and "2.3", "2.5": "Same config
# as LTX-2.0") lists exactly these values and loads the checkpoint strictly into them. Kept here so
# settings need no diffusers import; tests check them against the class signature.
PUBLISHED: dict[str, Any] = dict(
    base_channels=128, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=2, attn_resolutions=None,
    in_channels=2, resolution=256, latent_channels=8, norm_type="pixel", causality_axis="height", dropout=0.0,
    mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=64,
    double_z=True,
)

# Named configs. "tiny" keeps the published front end (16 kHz, hop 160, 64 mels -> 16 latent frequency
# bins, 4x time) and narrows the network to 32 channels: the per-channel statistics have
# ``base_channels`` entries, which must equal C * F, so C = 32 / 16 = 2.
CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "ltx2_audio": {
        "tiny": dict(base_channels=32, ch_mult=(1, 1, 1), num_res_blocks=1, latent_channels=2),
        "published": {},  # AutoencoderKLLTX2Audio() defaults == LTX-2's audio VAE (PUBLISHED)
    },
}

# The vocoder (diffusers.pipelines.ltx2.vocoder.LTX2Vocoder) of a config build. "published" is
# LTX2Vocoder's defaults == get_ltx2_vocoder_config("2.0") (LTX-2's HiFi-GAN: 128 in, 1024 hidden,
# x240 to 24 kHz). "tiny" keeps the x240 upsampling (so 24 kHz) with 32 hidden channels.
VOCODER_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_channels=32, resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]]),
    "published": {},
}
VOCODER_SUBFOLDER = "vocoder"  # the vocoder's folder beside the audio VAE's in a diffusers LTX-2 repo


def _config(family: str, config: str | dict) -> tuple[dict, str, dict | None]:
    """(model config, config name, vocoder config or None) of a named or explicit config.

    A dict config is the model's config; two extra keys are ours: ``n_fft`` (LTX's STFT size, 1024 when
    absent) and ``vocoder`` (LTX2Vocoder kwargs, or None for no vocoder; the tiny vocoder when absent)."""
    if family not in AUDIO_FAMILIES:
        raise ValueError(f"unknown audio VAE family {family!r}; known: {list(AUDIO_FAMILIES)}")
    if isinstance(config, dict):
        cfg = copy.deepcopy(config)
        voc = cfg.pop("vocoder", VOCODER_CONFIGS["tiny"])
        return cfg, "custom", copy.deepcopy(voc)
    if config not in CONFIGS[family]:
        raise ValueError(f"unknown config {config!r} for {family}; known: {sorted(CONFIGS[family])} or a dict")
    return copy.deepcopy(CONFIGS[family][config]), config, copy.deepcopy(VOCODER_CONFIGS[config])


def _full(cfg: dict) -> dict:
    """A config with the class defaults filled in (diffusers' bookkeeping keys dropped)."""
    out = dict(PUBLISHED)
    out.update({k: v for k, v in cfg.items() if not k.startswith("_")})
    return out


def _down(size: int, before: int, after: int) -> int:
    """Output length of a kernel-3, stride-2 convolution after padding ``before`` / ``after``."""
    return (size + before + after - 3) // 2 + 1


# diffusers' LTX2AudioDownsample padding (left, right, top, bottom) = (freq before, freq after, time
# before, time after) for each causality axis.
_DOWN_PAD = {"none": (0, 1, 0, 1), "width": (2, 0, 0, 1), "height": (0, 1, 2, 0), "width-compatibility": (1, 0, 0, 1)}


@dataclass(frozen=True)
class AudioSettings:
    """What an audio VAE takes and gives, read from its config (no model, no weights)."""

    family: str
    sample_rate: int
    hop_length: int
    n_fft: int
    mel_bins: int
    latent_channels: int
    frequency_bins: int
    temporal: int  # latent steps per mel frame (LTX's LATENT_DOWNSAMPLE_FACTOR, 4)
    causality_axis: str
    downsamplings: int
    config_name: str | None = None

    @property
    def latent_steps_per_second(self) -> float:
        """LTX's ``latents_per_second`` (``AudioLatentShape.from_duration``): 16000 / 160 / 4 = 25."""
        return float(self.sample_rate) / float(self.hop_length) / float(self.temporal)

    def mel_frames(self, num_samples: int) -> int:
        """Frames of the centred STFT of ``num_samples`` samples: ``1 + N // hop``."""
        return 1 + int(num_samples) // self.hop_length

    def latent_steps(self, num_samples: int) -> int:
        """Latent time steps T that encoding ``num_samples`` samples (at ``sample_rate``) gives: the
        mel frames through the encoder's stride-2 convolutions (2.0 s at 16 kHz: 201 -> 101 -> 51)."""
        t = self.mel_frames(num_samples)
        _, _, before, after = _DOWN_PAD[self.causality_axis]
        for _ in range(self.downsamplings):
            t = _down(t, before, after)
        return t

    def latent_shape(self, num_samples: int) -> tuple[int, int, int]:
        """``(C, T, F)`` of the latents of ``num_samples`` samples."""
        return (self.latent_channels, self.latent_steps(num_samples), self.frequency_bins)


def _settings(family: str, cfg: dict, config_name: str | None) -> AudioSettings:
    full = _full(cfg)
    n_fft = int(cfg.get("n_fft", N_FFT))
    axis = full["causality_axis"]
    if axis not in _DOWN_PAD:
        raise ValueError(f"unknown causality_axis {axis!r}; known: {sorted(_DOWN_PAD)}")
    downs = len(tuple(full["ch_mult"])) - 1
    if 2**downs != LATENT_DOWNSAMPLE_FACTOR:
        raise ValueError(f"an LTX-2 audio VAE downsamples time by {LATENT_DOWNSAMPLE_FACTOR} (its decoder assumes it): "
                         f"ch_mult needs 3 entries, got {tuple(full['ch_mult'])}")
    freq = int(full["mel_bins"])
    left, right, _, _ = _DOWN_PAD[axis]
    for _ in range(downs):
        freq = _down(freq, left, right)
    return AudioSettings(
        family=family, sample_rate=int(full["sample_rate"]), hop_length=int(full["mel_hop_length"]), n_fft=n_fft,
        mel_bins=int(full["mel_bins"]), latent_channels=int(full["latent_channels"]), frequency_bins=freq,
        temporal=LATENT_DOWNSAMPLE_FACTOR, causality_axis=axis, downsamplings=downs, config_name=config_name,
    )


def _pretrained_config(pretrained: str, subfolder: str | None, revision: str | None,
                       cache_dir: str | None = None) -> dict:
    """The ``config.json`` of a pretrained audio VAE: from disk / the HF cache, else through diffusers'
    ``load_config`` (which may ask the hub)."""
    from .vae_config import pretrained_config

    cfg = pretrained_config(pretrained, subfolder, revision, cache_dir, key="models.audio_vae")
    if cfg is not None:
        return cfg
    AutoencoderKLLTX2Audio = model_class(CLS)

    from shardsmith.errors import UserError

    kw: dict[str, Any] = {}
    if subfolder:
        kw["subfolder"] = subfolder
    if revision:
        kw["revision"] = revision
    if cache_dir:
        kw["cache_dir"] = cache_dir
    try:
        return dict(AutoencoderKLLTX2Audio.load_config(str(pretrained), **kw))
    except (OSError, ValueError) as exc:  # diffusers' "not found" / offline errors
        where = f"{pretrained}" + (f" (subfolder {subfolder!r})" if subfolder else "")
        raise UserError(f"the audio VAE's config.json was not found in {where}: {exc}; download the model or fix "
                        "models.audio_vae.pretrained / subfolder") from exc


CONFIG_KEY = "models.audio_vae.config"


def check_config(family: str, config: dict, *, lean: bool = False) -> None:
    """``models.audio_vae.config`` given as a dict, checked before the plan: its keys are
    ``AutoencoderKLLTX2Audio``'s (and ours: ``n_fft``, ``vocoder``; keys starting with ``_`` are the config's
    bookkeeping), the class builds from it on torch's meta device (no memory, no weights:
    :func:`~shardsmith.encode.vae.build_from_config`), its settings read (:func:`audio_vae_settings`: every size at
    least 1) and its per-channel statistics match its patchified latents, as :func:`load_audio_vae` requires; a
    ``vocoder`` dict builds ``LTX2Vocoder`` the same way. A :class:`~shardsmith.encode.vae.ModelConfigError`
    naming the key otherwise."""
    from .vae import ModelConfigError, build_from_config

    key, fix = CONFIG_KEY, "fix the value, or use a named config (tiny, published)"
    cfg, _, voc = _config(family, config)
    model_cfg = {k: v for k, v in cfg.items() if k != "n_fft"}
    model = build_from_config(model_class(CLS, lean=lean), model_cfg, key, meta=True)
    try:
        s = _settings(family, cfg, "custom")
    except (TypeError, ValueError, KeyError, IndexError, ArithmeticError) as exc:
        raise ModelConfigError(f"{key}: the audio settings cannot be read from it ({type(exc).__name__}: {exc}); "
                               f"{fix}") from None
    for what, value in (("sample_rate", s.sample_rate), ("mel_hop_length", s.hop_length), ("n_fft", s.n_fft),
                        ("mel_bins", s.mel_bins), ("latent_channels", s.latent_channels),
                        ("latent frequency bins (from mel_bins)", s.frequency_bins)):
        if value < 1:
            raise ModelConfigError(f"{key}: it gives an audio VAE with {what} {value}; every size must be at least 1; "
                                   f"{fix}")
    patched = s.latent_channels * s.frequency_bins
    if model.latents_mean.numel() != patched:
        raise ModelConfigError(f"{key}: the audio VAE's per-channel statistics have {model.latents_mean.numel()} "
                               f"entries (base_channels), but its latents patchify to {s.latent_channels} x "
                               f"{s.frequency_bins} = {patched} channels, which LTX-2 normalises with them; set "
                               f"base_channels to {patched} (latent_channels * mel_bins / 4), or use a named config "
                               "(tiny, published)")
    if voc is None:
        return
    if not isinstance(voc, dict):
        raise ModelConfigError(f"{key}.vocoder: {voc!r} is not a dict; give LTX2Vocoder's config as a dict, null "
                               "for no vocoder, or leave vocoder out for the tiny one")
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    full = _full(model_cfg)
    build_from_config(LTX2Vocoder, {"in_channels": int(full["output_channels"]) * int(full["mel_bins"]), **voc},
                      f"{key}.vocoder", meta=True)


def audio_vae_settings(family: str = "ltx2_audio", *, pretrained: str | None = None, subfolder: str | None = None,
                       revision: str | None = None, config: str | dict = "tiny",
                       cache_dir: str | None = None) -> AudioSettings:
    """The settings of an audio VAE without building it: from ``pretrained``'s config.json when given,
    else from the named or explicit ``config`` (see :data:`CONFIGS`)."""
    if family not in AUDIO_FAMILIES:
        raise ValueError(f"unknown audio VAE family {family!r}; known: {list(AUDIO_FAMILIES)}")
    if pretrained is not None:
        return _settings(family, _pretrained_config(pretrained, subfolder, revision, cache_dir), None)
    cfg, name, _ = _config(family, config)
    return _settings(family, cfg, name)


# ----------------------------------------------------------------------------- the model


def _is_oom(exc: BaseException) -> bool:
    """A CUDA out-of-memory error (the test encode/stage.py's ``_is_oom`` makes)."""
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _slaney_mel(hz: float) -> float:
    """Hertz -> Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    return 3.0 * hz / 200.0 if hz < 1000.0 else 15.0 + np.log(hz / 1000.0) * (27.0 / np.log(6.4))


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    """Slaney's mel scale -> hertz, the inverse of :func:`_slaney_mel` (float64)."""
    hz = 200.0 * mel / 3.0
    log = mel >= 15.0
    hz[log] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log] - 15.0))
    return hz


def mel_filters(sample_rate: int, n_fft: int, mel_bins: int) -> np.ndarray:
    """The ``[n_fft // 2 + 1, mel_bins]`` slaney-scale, slaney-normalised triangular filterbank from 0 Hz to
    ``sample_rate / 2`` (torchaudio's ``melscale_fbanks(..., norm="slaney", mel_scale="slaney")``), float32.
    The arithmetic, in float64 and in this order, of transformers' ``audio_utils.mel_filter_bank`` with those
    settings, whose values it equals bit for bit (a test checks it), without importing transformers."""
    mel_edges = np.linspace(_slaney_mel(0.0), _slaney_mel(sample_rate / 2.0), mel_bins + 2)
    edges = _slaney_hz(mel_edges)  # the filters' corners in Hz
    fft_hz = np.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    width = np.diff(edges)
    slopes = np.expand_dims(edges, 0) - np.expand_dims(fft_hz, 1)
    down, up = -slopes[:, :-2] / width[:-1], slopes[:, 2:] / width[1:]
    fb = np.maximum(np.zeros(1), np.minimum(down, up))
    fb *= np.expand_dims(2.0 / (edges[2:mel_bins + 2] - edges[:mel_bins]), 0)  # area normalisation
    return np.ascontiguousarray(fb, dtype=np.float32)


@dataclass
class AudioVae:
    """A loaded LTX-2 audio VAE (and its vocoder) with its spec and provenance; see :func:`load_audio_vae`."""

    spec: EncoderSpec
    provenance: Provenance
    model: Any  # diffusers AutoencoderKLLTX2Audio
    vocoder: Any = None  # diffusers LTX2Vocoder / LTX2VocoderWithBWE, or None
    settings: AudioSettings | None = None
    oom_retries: int = 0
    _fb: Any = field(default=None, repr=False)
    _window: Any = field(default=None, repr=False)
    _copy_stream: Any = field(default=None, repr=False)  # a GPU's host->device copies (made on first use)

    def __post_init__(self) -> None:
        import torch

        if self.settings is None:
            self.settings = _settings(self.spec.family, dict(self.model.config), None)
        s = self.settings
        self._fb = torch.from_numpy(mel_filters(s.sample_rate, s.n_fft, s.mel_bins)).to(self.device)
        self._window = torch.hann_window(s.n_fft, device=self.device)  # periodic, as torchaudio's window_fn

    @property
    def device(self) -> "torch.device":
        return next(self.model.parameters()).device

    @property
    def torch_dtype(self) -> "torch.dtype":
        return next(self.model.parameters()).dtype

    # ------------------------------------------------------------------ waveform -> mel
    def mel(self, wave: "torch.Tensor") -> "torch.Tensor":
        """``[B, 2, N]`` waveforms at ``spec.sample_rate`` -> log-mel ``[B, 2, 1 + N // hop, mel_bins]`` float32
        (on the model's device): LTX's ``AudioProcessor.waveform_to_mel`` (module doc, step 1)."""
        import torch

        s = self.settings
        if wave.ndim != 3:
            raise ValueError(f"expected waveforms [B, channels, N], got shape {tuple(wave.shape)}")
        b, c, n = wave.shape
        if n <= s.n_fft // 2:
            raise ValueError(f"audio of {n} samples is too short: the centred STFT needs more than {s.n_fft // 2} "
                             f"samples ({(s.n_fft // 2 + 1) / s.sample_rate:.3f} s at {s.sample_rate} Hz)")
        x = wave.to(device=self.device, dtype=torch.float32).reshape(b * c, n)
        spec = torch.stft(x, s.n_fft, hop_length=s.hop_length, win_length=s.n_fft, window=self._window,
                          center=True, pad_mode="reflect", normalized=False, onesided=True,
                          return_complex=True).abs()  # [B*2, n_fft/2+1, T_mel], power 1
        mel = torch.matmul(spec.transpose(-1, -2), self._fb)  # [B*2, T_mel, mels] (torchaudio's MelScale)
        mel = torch.log(torch.clamp(mel, min=LOG_FLOOR))
        return mel.reshape(b, c, mel.shape[-2], mel.shape[-1])

    # ------------------------------------------------------------------ normalisation
    def _stats(self, like: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """The per-channel statistics ``[C*F]`` as ``[1, C, 1, F]`` float32 (patchified channel c*F+f)."""
        import torch

        c, f = self.spec.latent_channels, self.spec.frequency_bins
        mean = self.model.latents_mean.detach().to(device=like.device, dtype=torch.float32)
        std = self.model.latents_std.detach().to(device=like.device, dtype=torch.float32)
        return mean.view(1, c, 1, f), std.view(1, c, 1, f)

    def normalise(self, means: "torch.Tensor") -> "torch.Tensor":
        """Posterior means ``[B, C, T, F]`` -> LTX's normalised latents (float32): patchify ``b c t f -> b t (c f)``,
        ``(x - latents_mean) / latents_std``, unpatchify; the same arithmetic per element."""
        mean, std = self._stats(means)
        return (means.float() - mean) / std

    def denormalise(self, latents: "torch.Tensor") -> "torch.Tensor":
        """Inverse of :meth:`normalise` (LTX's ``un_normalize``: ``x * std + mean``), float32."""
        mean, std = self._stats(latents)
        return latents.float() * std + mean

    # ------------------------------------------------------------------ encode
    def latent_steps(self, num_samples: int) -> int:
        """Latent time steps of ``num_samples`` samples (what :meth:`encode` returns; pure arithmetic)."""
        return self.settings.latent_steps(num_samples)

    def _forward(self, x: "torch.Tensor", rate: int) -> "torch.Tensor":
        return self._latents(x, rate).to("cpu")

    def _latents(self, x: "torch.Tensor", rate: int) -> "torch.Tensor":
        """``[B, 2, N]`` (or mono ``[B, 1, N]``) waveforms at ``rate`` Hz (any device) -> normalised latents
        ``[B, C, T, F]`` float32 on the model's device. There, as LTX-2's ``_encode_audio`` and ``AudioProcessor``
        do: mono duplicated to stereo, resampled to the encoder's rate (:mod:`shardsmith.encode.resample`),
        then the mel and the encoder."""
        import torch

        from shardsmith.encode.resample import resample

        with torch.inference_mode():
            x = x.to(device=self.device, dtype=torch.float32)
            if x.shape[1] == 1:
                x = x.repeat(1, 2, 1)
            x = resample(x, rate, self.settings.sample_rate)
            mel = self.mel(x)
            post = self.model.encode(mel.to(self.torch_dtype)).latent_dist
            return self.normalise(post.mean)

    def _encode_batch(self, x: "torch.Tensor", rate: int) -> list["torch.Tensor"]:
        import torch

        try:
            z = self._forward(x, rate)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
            if not _is_oom(exc):
                raise
            self.oom_retries += 1
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            n = x.shape[0]
            if n > 1:
                half = n // 2
                log.warning("out of memory encoding %d audio clips; retrying as %d + %d", n, half, n - half)
                return self._encode_batch(x[:half], rate) + self._encode_batch(x[half:], rate)
            raise
        return [t.clone() for t in z.unbind(0)]

    def encode(self, waves: list) -> list["torch.Tensor"]:
        """Waveforms -> normalised latents ``[C, T, F]`` float32 on the CPU, in order. A waveform is a
        :class:`~shardsmith.records.Waveform` (float32 ``[2, N]``, or ``[1, N]`` mono, at its rate: duplicated and
        resampled to the encoder's first) or a float32 ``[2, N]`` array at ``spec.sample_rate``. Items of the same
        rate, channels and N run as one batch; each result is independent of its batch-mates."""
        import torch

        arrays = dict(enumerate(_waveform_arrays(waves, self.settings.sample_rate)))
        out: list[torch.Tensor | None] = [None] * len(arrays)
        for (rate, _, _), idx in _groups(arrays).items():
            x = torch.from_numpy(np.stack([arrays[i][0] for i in idx]))
            for i, z in zip(idx, self._encode_batch(x, rate)):
                out[i] = z
        return out  # type: ignore[return-value]

    def stage(self, waves: list) -> "StagedAudio":
        """The host side of :meth:`launch` (the caller's thread, while the device runs the batch before):
        waveforms (as :meth:`encode` takes them; None: an item without audio) stacked per rate, channels and
        length into one ``[B, C, N]`` float32 tensor each, page-locked when the model is on a GPU. Refuses
        what :meth:`encode` refuses."""
        import torch

        from shardsmith.encode.host_threads import one_intra_op_thread

        present = [i for i, w in enumerate(waves) if w is not None]
        arrays = dict(zip(present, _waveform_arrays([waves[i] for i in present], self.settings.sample_rate)))
        staged = []
        pin = self.device.type == "cuda"
        for (rate, _, _), idx in _groups(arrays).items():
            views = [torch.from_numpy(np.ascontiguousarray(arrays[i][0])) for i in idx]
            host = torch.empty((len(views), *views[0].shape), dtype=torch.float32, pin_memory=pin)
            with one_intra_op_thread():  # copies with the GIL released; the decode workers hold the cores
                torch.stack(views, out=host)
            staged.append((idx, host, rate))
        return StagedAudio(len(waves), staged)

    def launch(self, staged: "StagedAudio") -> "LaunchedAudio":
        """Start the latents of a staged batch. On a GPU this returns once the upload (on a side stream),
        the resampling, the forward pass and the copy back into page-locked memory are queued (the next
        batch is staged and queued meanwhile); an out-of-memory error there runs that group's items
        through :meth:`encode`'s halving instead. Elsewhere it runs to completion. :meth:`LaunchedAudio.result` gives what
        :meth:`encode` gives, per item (None where there was no waveform)."""
        import torch

        if self.device.type != "cuda":
            return LaunchedAudio(staged.n, [(idx, self._encode_batch(x, rate)) for idx, x, rate in staged.groups])
        from shardsmith.encode.text import to_pinned

        start = torch.cuda.Event(enable_timing=True)
        start.record()
        parts: list = []
        for idx, host, rate in staged.groups:
            try:
                parts.append((idx, to_pinned(self._latents(self._upload(host), rate))))
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
                if not _is_oom(exc):
                    raise
                self.oom_retries += 1
                torch.cuda.empty_cache()
                parts.append((idx, self._encode_batch(host, rate)))
        done = torch.cuda.Event(enable_timing=True)
        done.record()
        return LaunchedAudio(staged.n, parts, start, done, keep=staged)

    def _upload(self, host: "torch.Tensor") -> "torch.Tensor":
        """A staged (page-locked) group on the GPU, copied on a side stream that the compute stream then
        waits for: a batch launched ahead crosses PCIe while the batch before it still computes, instead
        of queueing its copy behind that batch's kernels (waveforms at a source's rate are megabytes)."""
        import torch

        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=self.device)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            x = host.to(self.device, non_blocking=True)
        compute.wait_stream(self._copy_stream)
        x.record_stream(compute)  # allocated on the copy stream, used on the compute stream
        return x

    def record(self, latent: "torch.Tensor", duration: float) -> dict:
        """The ``audio_latents/*.pt`` dict as the LTX trainer saves it: ``latents`` ``[C, T, F]`` float32 (its
        encoder runs in float32), ``num_time_steps`` T and ``frequency_bins`` F (ints), ``duration`` (seconds,
        a float); in that key order."""
        import torch

        lat = latent.detach().to(device="cpu", dtype=torch.float32).contiguous()
        c, f = self.spec.latent_channels, self.spec.frequency_bins
        if lat.ndim != 3 or lat.shape[0] != c or lat.shape[2] != f:
            raise ValueError(f"expected audio latents [{c}, T, {f}], got shape {tuple(lat.shape)}")
        return {"latents": lat, "num_time_steps": int(lat.shape[1]), "frequency_bins": int(lat.shape[2]),
                "duration": float(duration)}

    # ------------------------------------------------------------------ decode
    @property
    def output_rate(self) -> int | None:
        """The vocoder's output sample rate (24000 for LTX-2), None without a vocoder."""
        if self.vocoder is None:
            return None
        return int(self.vocoder.config.output_sampling_rate)

    def decode(self, latents: "torch.Tensor") -> tuple["torch.Tensor", int]:
        """Normalised latents ``[B, C, T, F]`` -> ``(waveform [B, 2, N'] float32 on the CPU, its sample rate)``:
        denormalise, the VAE decoder (mel ``[B, 2, 4T - 3, mels]``), then the vocoder, as LTX's
        ``decode_latents.py`` / ``decode_audio`` do."""
        import torch

        if self.vocoder is None:
            raise RuntimeError("this audio VAE has no vocoder, so its mel spectrograms cannot become waveforms: "
                               f"load it from a model folder with a {VOCODER_SUBFOLDER}/ beside the audio VAE's")
        if latents.ndim == 3:
            latents = latents.unsqueeze(0)
        c, f = self.spec.latent_channels, self.spec.frequency_bins
        if latents.ndim != 4 or latents.shape[1] != c or latents.shape[3] != f:
            raise ValueError(f"expected audio latents [B, {c}, T, {f}], got shape {tuple(latents.shape)}")
        with torch.inference_mode():
            z = self.denormalise(latents.to(self.device)).to(self.torch_dtype)
            mel = self.model.decode(z).sample
            voc_dtype = next(self.vocoder.parameters()).dtype
            wave = self.vocoder(mel.to(voc_dtype))
        return wave.float().cpu(), self.output_rate


# ----------------------------------------------------------------------------- loading


def _vocoder_class(cfg: dict):
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

    return LTX2VocoderWithBWE if cfg.get("_class_name") == "LTX2VocoderWithBWE" else LTX2Vocoder


def _vocoder_subfolder(subfolder: str | None) -> str:
    """Where a pretrained model's vocoder is: beside the audio VAE's subfolder (``audio_vae`` ->
    ``vocoder``), or ``vocoder/`` under a repo given without one."""
    if not subfolder:
        return VOCODER_SUBFOLDER
    parent = subfolder.rstrip("/").rpartition("/")[0]
    return f"{parent}/{VOCODER_SUBFOLDER}" if parent else VOCODER_SUBFOLDER


def _load_pretrained_vocoder(pretrained: str, subfolder: str | None, revision: str | None, tdt, cache_dir,
                             notes: list[str]):
    from .vae_config import pretrained_config

    sub = _vocoder_subfolder(subfolder)
    cfg = pretrained_config(pretrained, sub, revision, cache_dir, key="models.audio_vae")  # (vocoder/)
    if cfg is None:
        notes.append(f"no vocoder: {sub}/config.json not found in {pretrained} (decode needs one)")
        return None
    cls = _vocoder_class(cfg)
    voc = cls.from_pretrained(str(pretrained), **pretrained_kwargs("torch_dtype", tdt, sub, revision, cache_dir))
    sha, files, _, hnotes = hash_pretrained(str(pretrained), sub, revision, cache_dir)
    notes += hnotes
    notes.append(f"vocoder: {cls.__name__} from {pretrained} subfolder {sub!r} ({', '.join(files) or 'no files'}, "
                 f"sha256 {sha})")
    return voc


def _waveform_arrays(waves, rate: int) -> list[tuple[np.ndarray, int]]:
    """``(float32 [2, N] array, its rate)`` of each of ``waves``: a :class:`~shardsmith.records.Waveform`
    (at its own rate; ``[1, N]`` when mono, duplicated on the device) or an array (at ``rate``, the
    encoder's); anything else is refused naming the clip."""
    from shardsmith.records import Waveform

    arrays = []
    for i, w in enumerate(waves):
        r, channels = rate, (2,)
        if isinstance(w, Waveform):
            w, r, channels = w.samples, int(w.rate), (1, 2)
        a = np.asarray(w, dtype=np.float32)
        if a.ndim != 2 or a.shape[0] not in channels:
            raise ValueError(f"audio clip {i}: expected a stereo waveform [2, N], got shape {a.shape} "
                             "(mono is duplicated to both channels before the encoder, as LTX does)")
        arrays.append((a, r))
    return arrays


def _groups(arrays: dict[int, tuple[np.ndarray, int]]) -> dict[tuple[int, int, int], list[int]]:
    """Item indices by ``(rate, channels, N)``: the items one batch resamples and encodes together."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, (a, r) in arrays.items():
        groups.setdefault((r, *a.shape), []).append(i)
    return groups


@dataclass
class StagedAudio:
    """:meth:`AudioVae.stage`'s result: ``n`` items; ``groups``: ``(item indices, [B, 2, N] float32 host tensor,
    its rate)`` per waveform rate and length."""

    n: int
    groups: list
    staged_at: float | None = None  # perf_counter when stacked (EncodeStage.stage_audio sets it)


class LaunchedAudio:
    """Audio latents started by :meth:`AudioVae.launch`. ``done()`` polls; ``result()`` waits once and gives
    one ``[C, T, F]`` float32 CPU tensor per item (owning its memory; None for an item without audio);
    ``device_seconds()`` is the batch's time on the device (0 off a GPU), after ``result()``."""

    def __init__(self, n: int, parts: list, start=None, done_event=None, keep=None):
        self.n, self.parts, self.start, self.done_event = n, parts, start, done_event
        self._keep = keep  # the page-locked inputs, alive until the device has read them
        self._out: list | None = None
        self.host_seconds = 0.0  # the launch's own time (EncodeStage.launch_audio)
        self.host_times: tuple[float, float, float] | None = None  # staged, launch begun, queued (perf_counter)
        self.booked = False  # its time is in the stage's seconds["audio"] (EncodeStage.audio_result)

    def done(self) -> bool:
        return self._out is not None or self.done_event is None or self.done_event.query()

    def result(self) -> list:
        if self._out is None:
            if self.done_event is not None:
                self.done_event.synchronize()
            out: list = [None] * self.n
            for idx, z in self.parts:
                items = z if isinstance(z, list) else [t.clone() for t in z.unbind(0)]
                for i, t in zip(idx, items):
                    out[i] = t
            self._out, self.parts, self._keep = out, None, None
        return self._out

    def device_seconds(self) -> float:
        if self.start is None:
            return 0.0
        self.done_event.synchronize()
        return self.start.elapsed_time(self.done_event) / 1e3


def load_audio_vae(family: str = "ltx2_audio", *, pretrained: str | None = None, subfolder: str | None = None,
                   revision: str | None = None, config: str | dict = "tiny", dtype: str = "float32",
                   device: "str | torch.device" = "cpu", cache_dir: str | None = None,
                   vocoder: bool = True) -> AudioVae:
    """Load the audio VAE of ``family`` and its vocoder (``vocoder=False``: without it, for encoding
    alone; the build's encode stage does not need it, only ``decode`` does).

    With ``pretrained`` (a local folder or hub repo id; ``subfolder`` e.g. ``"audio_vae"`` of a diffusers
    LTX-2 repo) the real weights are loaded and hashed; the vocoder comes from ``vocoder/`` beside the
    audio VAE's folder when there is one. Without it a model and a vocoder with seeded random weights are
    built from ``config`` ("tiny", "published" or a dict; see :data:`CONFIGS`) and labelled
    ``"random-weights"``: such latents are not model-space data.
    """
    AutoencoderKLLTX2Audio = model_class(CLS)

    from .vae import _dtype_name, _torch_dtype, device_init_note, seeded_init, seeded_statistics

    if family not in AUDIO_FAMILIES:
        raise ValueError(f"unknown audio VAE family {family!r}; known: {list(AUDIO_FAMILIES)}")
    tdt = _torch_dtype(dtype)
    notes: list[str] = []
    if pretrained is not None:
        model = AutoencoderKLLTX2Audio.from_pretrained(
            str(pretrained), **pretrained_kwargs("torch_dtype", tdt, subfolder, revision, cache_dir))
        sha, files, resolved, hnotes = hash_pretrained(str(pretrained), subfolder, revision, cache_dir)
        notes += hnotes
        want_vocoder = vocoder
        vocoder = _load_pretrained_vocoder(str(pretrained), subfolder, revision, tdt, cache_dir, notes) \
            if want_vocoder else None
        cfg_in = dict(model.config)
        settings = _settings(family, cfg_in, None)
        prov = Provenance(cls=CLS, weights="pretrained", path_or_repo=str(pretrained), subfolder=subfolder,
                          revision=resolved if resolved else revision, weights_sha256=sha, config=cfg_in,
                          weight_files=files, notes=notes)
    else:
        cfg_in, cfg_name, voc_cfg = _config(family, config)
        settings = _settings(family, cfg_in, cfg_name)
        model_cfg = {k: v for k, v in cfg_in.items() if k != "n_fft"}
        want_vocoder, vocoder = vocoder, None
        with seeded_init(device):
            model = AutoencoderKLLTX2Audio(**model_cfg)
            if voc_cfg is not None and want_vocoder:
                from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

                full = _full(model_cfg)
                voc_kw = {"in_channels": int(full["output_channels"]) * int(full["mel_bins"]), **voc_cfg}
                vocoder = LTX2Vocoder(**voc_kw)
            if cfg_name == "tiny":
                seeded_statistics(model, notes)
        if next(model.parameters()).dtype != tdt:
            model = model.to(tdt)
        if vocoder is not None and next(vocoder.parameters()).dtype != tdt:
            vocoder = vocoder.to(tdt)
        notes.append("random weights (torch.manual_seed(0)): latents are NOT model-space data")
        if vocoder is not None:
            notes.append(f"vocoder: LTX2Vocoder with random weights ({cfg_name} config)")
        if (note := device_init_note(device)) is not None:
            notes.append(note)
        prov = Provenance(cls=CLS, weights="random-weights", config=dict(model.config), config_name=cfg_name,
                          seed=SEED, notes=notes)

    model = model.to(device).eval().requires_grad_(False)
    if vocoder is not None:
        vocoder = vocoder.to(device).eval().requires_grad_(False)
    patched = settings.latent_channels * settings.frequency_bins
    if model.latents_mean.numel() != patched or model.latents_std.numel() != patched:
        raise ValueError(f"the audio VAE's per-channel statistics have {model.latents_mean.numel()} entries "
                         f"(base_channels), but its latents patchify to {settings.latent_channels} x "
                         f"{settings.frequency_bins} = {patched} channels; LTX-2 normalises those "
                         "(base_channels must equal latent_channels * mel_bins / 4)")
    spec = EncoderSpec(
        kind="audio_vae", family=family, dtype=_dtype_name(tdt), latent_channels=settings.latent_channels,
        temporal=settings.temporal, store="mean", sample_rate=settings.sample_rate,
        normalisation={"type": "mean_std", "mean": model.latents_mean.float().cpu().tolist(),
                       "std": model.latents_std.float().cpu().tolist()},
        hop_length=settings.hop_length, n_fft=settings.n_fft, mel_bins=settings.mel_bins,
        frequency_bins=settings.frequency_bins,
    )
    theirs = getattr(model, "temporal_compression_ratio", None)
    if isinstance(theirs, int) and theirs != settings.temporal:
        prov.notes.append(f"diffusers temporal_compression_ratio={theirs} differs from {settings.temporal}")
    return AudioVae(spec=spec, provenance=prov, model=model, vocoder=vocoder, settings=settings)


from shardsmith.transform.audio import wav_bytes  # noqa: E402 - re-exported: decode writes WAVs

__all__ = ["AUDIO_FAMILIES", "AudioSettings", "AudioVae", "CONFIGS", "audio_vae_settings", "load_audio_vae",
           "mel_filters", "wav_bytes"]
