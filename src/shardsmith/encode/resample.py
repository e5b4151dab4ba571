"""Band-limited resampling of waveforms on the audio encoder's device, before the mel: LTX-2's own step.

LTX-2's ``AudioProcessor.resample_audio`` (ltx-core ``model/audio_vae/ops.py``) calls
``torchaudio.functional.resample(waveform, source_rate, target_rate)`` with its defaults, on the device
the waveform is on. torchaudio cannot be imported beside every torch (nor must shardsmith depend on it),
so this module carries that function's arithmetic (torchaudio 2.11, BSD-2-Clause; ``sinc_interp_hann``,
``lowpass_filter_width=6``, ``rolloff=0.99``), op for op:

- the rates are reduced by their gcd (``orig``, ``new``); ``base = min(orig, new) * 0.99``;
  ``width = ceil(6 * orig / base)``;
- the ``[new, 1, orig + 2 * width]`` kernel is the windowed sinc of torchaudio's
  ``_get_sinc_resample_kernel``, computed in the waveform's dtype on its device (as torchaudio does);
- the waveform ``[..., N]`` is padded by ``width`` before and ``width + orig`` after, convolved with
  stride ``orig``, interleaved and cut to :func:`~shardsmith.transform.audio.resampled_length` samples.

On the CPU the result is torchaudio's, bit for bit (tests compare it with values torchaudio computed); on a
GPU it is what torchaudio gives there (the same kernels, cuDNN's convolution under torch's defaults).
The kernel of each (rates, device, dtype) is made once and kept.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from shardsmith.transform.audio import reduced, resampled_length

if TYPE_CHECKING:
    import torch

LOWPASS_FILTER_WIDTH = 6  # torchaudio's default: zero crossings of the sinc on each side
ROLLOFF = 0.99  # torchaudio's default: the cutoff as a fraction of the lower Nyquist frequency
METHOD = "sinc_interp_hann"  # torchaudio's default window
#: what a build records of this resampler (manifest, ledger): the function and its settings
NAME = f"torchaudio.functional.resample ({METHOD}, lowpass_filter_width={LOWPASS_FILTER_WIDTH}, rolloff={ROLLOFF})"


#: the largest sinc kernel (elements) the encoder builds: 44.1 kHz -> 16 kHz takes 76,000 and 22.05 kHz 147,000,
#: but a rate sharing no factor with the target (47,999 Hz: 16,000 phases of 48,033 taps, 3 GB) would exhaust
#: memory and time; such a file is resampled by FFmpeg in its worker instead (:func:`fits`)
MAX_KERNEL = 1 << 24


def _width(o: int, n: int) -> int:
    """torchaudio's kernel half-width (input samples) for reduced rates ``o`` -> ``n``."""
    return math.ceil(LOWPASS_FILTER_WIDTH * o / (min(o, n) * ROLLOFF))


def kernel_size(orig: int, new: int) -> int:
    """Elements of :func:`sinc_kernel`'s kernel for these rates (pure arithmetic, no torch)."""
    o, n = reduced(orig, new)
    return n * (o + 2 * _width(o, n))


def fits(orig: int, new: int) -> bool:
    """Whether the encoder resamples ``orig`` -> ``new`` itself (its kernel holds at most :data:`MAX_KERNEL`
    elements); equal rates always fit."""
    o, n = reduced(orig, new)
    return o == n or kernel_size(orig, new) <= MAX_KERNEL


@lru_cache(maxsize=32)
def sinc_kernel(orig: int, new: int, device: str, dtype: "torch.dtype") -> tuple["torch.Tensor", int]:
    """``(kernel [new', 1, orig' + 2 * width], width)`` for reduced rates: torchaudio's
    ``_get_sinc_resample_kernel`` with the Hann window, in ``dtype`` on ``device``."""
    import torch

    orig, new = reduced(orig, new)
    base = min(orig, new) * ROLLOFF
    width = _width(orig, new)
    idx = torch.arange(-width, width + orig, dtype=dtype, device=device)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=dtype, device=device)[:, None, None] / new + idx
    t *= base
    t = t.clamp_(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t *= math.pi
    scale = base / orig
    kernels = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernels *= window * scale
    return kernels, width


def resample(wave: "torch.Tensor", orig: int, new: int) -> "torch.Tensor":
    """Floating-point waveforms ``[..., N]`` at ``orig`` Hz -> ``[..., resampled_length(N, orig, new)]`` at
    ``new`` Hz, on their device and in their dtype (the input itself when the rates are equal). Refuses
    an integer tensor (``TypeError``) and rates that are not positive whole numbers (``ValueError``)."""
    import torch

    if not wave.is_floating_point():
        raise TypeError(f"expected a floating-point waveform, got {wave.dtype}")
    o, n = reduced(orig, new)
    if o == n:
        return wave
    if wave.shape[-1] == 0:  # (no sample: none out; the cutter fails such an item first, audio_rate_too_low)
        return wave.new_zeros(*wave.shape[:-1], 0)
    kernel, width = sinc_kernel(orig, new, str(wave.device), wave.dtype)
    shape = wave.shape
    x = wave.reshape(-1, shape[-1])
    length = x.shape[-1]
    x = torch.nn.functional.pad(x, (width, width + o))
    y = torch.nn.functional.conv1d(x[:, None], kernel, stride=o)
    y = y.transpose(1, 2).reshape(x.shape[0], -1)[..., :resampled_length(length, orig, new)]
    return y.reshape(*shape[:-1], y.shape[-1])


LEDGER_KEY = "audio_resampler"


def settle(recipe, ledger):
    """The recipe a build runs, with ``audio.resampler`` kept in the ledger as the build began: a resumed
    build resamples as it started, so its audio latents stay byte-identical to an uninterrupted run (a
    ledger with results and no record is a build from before the setting: ``ffmpeg``). Recipes that write
    no audio are returned as they are."""
    if not recipe.audio_outputs():
        return recipe
    chosen = ledger.kept_choice(LEDGER_KEY, "ffmpeg", lambda: recipe.audio.resampler)
    return recipe.settled("audio", "resampler", chosen)


def describe(resampler: str) -> str:
    """What the manifest says of ``audio.resampler``."""
    if resampler == "ffmpeg":
        return "ffmpeg: FFmpeg's swresample (PyAV's AudioResampler) in the decode workers"
    return f"sinc: {NAME} on the audio encoder's device, from the window cut at the source's rate (LTX-2's order)"
