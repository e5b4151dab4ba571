"""Text encoding on a full GPU (issue 23): out of memory, the batch in halves down to one prompt, with the
same embeddings; a prompt that still does not fit is one message naming the model and what to set."""

from __future__ import annotations

import pytest
import torch

from shardsmith.encode.text import load_text_encoder
from shardsmith.encode.text_memory import TextMemoryError, encode_halving

PROMPTS = ["a red fox asleep in snow", "an astronaut on a horse", "a bowl of ramen, studio light",
           "a lighthouse in a storm", "pixel art island", "a dew drop on a web", "a red bicycle in Lisbon"]


class _Tight:
    """A real encoder on a device that fits at most ``fits`` prompts a pass (more: CUDA's out-of-memory error)."""

    def __init__(self, encoder, fits: int):
        self.inner, self.fits, self.passes, self.ok = encoder, fits, [], []
        self.spec, self.provenance, self.model = encoder.spec, encoder.provenance, encoder.model

    def encode(self, prompts, **kw):
        self.passes.append(len(prompts))
        if len(prompts) > self.fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total "
                                              "capacity of 23.5 GiB of which 12.00 MiB is free.")
        self.ok.append(len(prompts))
        return self.inner.encode(prompts, **kw)


@pytest.fixture(scope="module")
def minilm():
    return load_text_encoder("minilm")


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
@pytest.mark.parametrize("fits", [1, 2, 3])
def test_out_of_memory_halves_the_batch_and_gives_the_same_embeddings(minilm, fits):
    tight, counter = _Tight(minilm, fits), [0]
    got = encode_halving(tight, PROMPTS, device="cpu", counter=counter)
    assert max(tight.ok) <= fits and sum(tight.ok) == len(PROMPTS)  # every prompt once, in passes that fit
    assert counter[0] > 0 and got.emb.shape == (len(PROMPTS), 77, 384) and got.mask.shape == (len(PROMPTS), 77)
    for i, p in enumerate(PROMPTS):  # each as a pass of its own: its embedding and the very same mask
        one = minilm.encode([p], device="cpu")
        # (equal to the last bit on most CPUs; on some, the BLAS rounds a batch of 3 and a batch of 1 apart)
        torch.testing.assert_close(got.emb[i], one.emb[0], rtol=0, atol=1e-5)
        assert torch.equal(got.mask[i], one.mask[0])
    assert got.truncated == [False] * len(PROMPTS)


def test_a_prompt_that_never_fits_is_one_message_naming_the_model_and_the_fix(minilm):
    with pytest.raises(TextMemoryError) as e:
        encode_halving(_Tight(minilm, 0), PROMPTS[:3], device="cpu")
    msg = str(e.value)
    assert "models.text (minilm" in msg and "on a single prompt" in msg and "asked for 1.50 GiB" in msg
    assert "GiB of weights" in msg and "models.text.dtype: bfloat16" in msg and "models.device: cpu" in msg


def test_other_errors_are_not_retried(minilm):
    class Broken(_Tight):
        def encode(self, prompts, **kw):
            raise ValueError("tokenizer exploded")

    with pytest.raises(ValueError, match="tokenizer exploded"):
        encode_halving(Broken(minilm, 9), PROMPTS, device="cpu")


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_the_stage_encodes_through_the_halving_path_and_reports_it(minilm):
    from shardsmith.encode.stage import EncodeStage

    stage = EncodeStage(None, _Tight(minilm, 2), batch_size=8, device="cpu")
    got = stage.text(PROMPTS)
    assert all(torch.equal(g[0], minilm.encode([p], device="cpu").emb[0]) for g, p in zip(got, PROMPTS))
    assert stage.describe()["text_oom_halvings"] > 0
