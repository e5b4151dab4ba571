"""The encoder-side resampler is LTX-2's (torchaudio.functional.resample with its defaults), bit for bit.

tests/golden/torchaudio_resample.npz holds a 0.05 s stereo signal (two tones and noise) and what torchaudio
2.11.1's own ``resample`` gave for it on the CPU (its Python functions run from the wheel beside torch
2.13; its C extension is not needed by them), at three rate pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardsmith.encode.resample import reduced, resample, sinc_kernel  # noqa: E402
from shardsmith.transform.audio import resampled_length  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "torchaudio_resample.npz"


@pytest.mark.parametrize("pair", ["44100_16000", "48000_16000", "8000_16000"])
def test_resample_gives_torchaudio_s_samples_bit_for_bit(pair):
    data = np.load(GOLDEN)
    orig, new = map(int, pair.split("_"))
    got = resample(torch.from_numpy(data["input"]), orig, new)
    want = data[pair]
    assert got.dtype == torch.float32
    assert tuple(got.shape) == want.shape
    assert np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("orig,new,n,expected", [
    (44100, 16000, 88200, 32000),  # 2.0 s exactly
    (48000, 16000, 242000, 80667),  # 5.0417 s: 80666.67 rounds up
    (44100, 16000, 222337, 80667),  # 80666.48 rounds up
    (16000, 16000, 80666, 80666),  # equal rates: unchanged
    (8000, 16000, 7, 14),
    (44100, 16000, 1, 1),
    (44100, 16000, 0, 0),
])
def test_resampled_length_is_torchaudio_s_ceiling(orig, new, n, expected):
    assert resampled_length(n, orig, new) == expected
    if n:
        assert resample(torch.zeros(2, n), orig, new).shape[-1] == expected


def test_resampled_length_rounds_the_quotient_to_float32_first_as_torchaudio_does():
    # 160 * n / 441 just above a whole number, closer to it than float32 can tell at this size
    n = next(n for n in range(10_000_000, 10_100_000) if (160 * n) % 441 == 1)
    exact_ceiling = -(-160 * n // 441)
    assert resampled_length(n, 44100, 16000) == float(np.float32(160 * n / 441)).__ceil__()
    assert resampled_length(n, 44100, 16000) == exact_ceiling - 1


def test_the_batch_dimensions_are_independent_and_kept():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 4410, generator=g)
    batch = resample(x, 44100, 16000)
    assert tuple(batch.shape) == (3, 2, 1600)
    for i in range(3):
        assert torch.equal(batch[i], resample(x[i], 44100, 16000))


def test_equal_rates_return_the_input_and_bad_inputs_are_refused():
    x = torch.randn(2, 100)
    assert resample(x, 16000, 16000) is x
    with pytest.raises(TypeError, match="floating-point"):
        resample(torch.zeros(2, 100, dtype=torch.int16), 44100, 16000)
    with pytest.raises(ValueError, match="source rate"):
        resample(x, 0, 16000)
    with pytest.raises(ValueError, match="target rate"):
        resample(x, 44100, 22050.5)
    assert reduced(44100, 16000) == (441, 160)
    kernel, width = sinc_kernel(44100, 16000, "cpu", torch.float32)
    assert tuple(kernel.shape) == (160, 1, 441 + 2 * width) and width == 17
