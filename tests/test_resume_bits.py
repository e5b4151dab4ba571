"""What keeps a resumed build's bytes those of an uninterrupted one where the two meet an item in other
company. The encoded-item memo of a build with several outputs (``.shardsmith/encoded``): values come back
bit for bit, for the very item and geometry only, and a batch is served whole or not at all, so a build
killed between two of a batch's writes re-encodes that batch with the same mates. Text: every text batch
has one shape, so a caption's embedding does not depend on its batch-mates or on the caption cache."""

from __future__ import annotations

import pytest
import torch

from shardsmith.encode.memo import EncodedMemo
from shardsmith.records import PlannedItem


def _item(idx: int, sha: str = "ab") -> PlannedItem:
    return PlannedItem(idx=idx, item_id=f"i{idx}", key=f"k{idx}", source=0, path=f"/d/{idx}.mp4", relpath=f"{idx}.mp4",
                       caption=f"clip {idx}", label=None, label_name=None, meta={}, sha256=sha, size_bytes=1,
                       kind="video", width=96, height=64, image_format=None, mode=None, split="train", plan_status="ok")


def _batch(memo: EncodedMemo, idxs: list[int]) -> tuple[torch.Tensor, list]:
    g = torch.Generator().manual_seed(sum(idxs))
    z = torch.randn(len(idxs), 4, 3, 2, 2, generator=g)
    texts = [(torch.randn(5, 8, generator=g), torch.ones(5, dtype=torch.bool)) for _ in idxs]
    memo.put([_item(i) for i in idxs], z, texts, ["64x64x17"] * len(idxs))
    return z, texts


def test_values_come_back_bit_for_bit_for_the_same_item_and_geometry_only(tmp_path):
    memo = EncodedMemo(tmp_path / "encoded")
    z, texts = _batch(memo, [4, 5])
    lat, text, audio = memo.get(_item(5), "64x64x17")
    assert torch.equal(lat, z[1]) and lat.dtype == torch.float32 and audio is None
    assert torch.equal(text[0], texts[1][0]) and torch.equal(text[1], texts[1][1])
    assert memo.get(_item(5), "32x32x9") is None  # another geometry
    assert memo.get(_item(5, sha="cd"), "64x64x17") is None  # the source changed
    assert memo.get(_item(6), "64x64x17") is None  # never kept
    assert memo.hits == 1


def test_a_batch_cut_short_by_a_kill_is_served_to_no_item(tmp_path):
    """A kill after c4's record and before c5's: c4 alone must not be served, or c5 is encoded in a batch of
    one and its latent's last bits differ from the uninterrupted build's (found by test_partners_resume)."""
    memo = EncodedMemo(tmp_path / "encoded")
    z, _ = _batch(memo, [4, 5])
    memo._path(5).unlink()  # as if killed between the two atomic writes
    assert memo.get(_item(4), "64x64x17") is None and memo.get(_item(5), "64x64x17") is None
    # the resumed build encodes [c4, c5] again and puts it: c4's record stays, c5's is written; both served
    memo.put([_item(4), _item(5)], z, None, ["64x64x17"] * 2)
    assert torch.equal(memo.get(_item(4), "64x64x17")[0], z[0]) and torch.equal(memo.get(_item(5), "64x64x17")[0], z[1])
    assert memo.hits == 2


@pytest.mark.slow
def test_a_caption_s_embedding_does_not_depend_on_its_batch_mates_or_the_cache_on_a_cpu():
    """A resumed build meets a repeated caption first in another batch than the uninterrupted one did (the
    caption cache starts empty): its embedding must be the same bits. Real MiniLM weights, CPU; on an
    AVX-512 Xeon MKL gave batches of 1-2 and 3+ rows different last bits before text batches had one shape."""
    from shardsmith.encode.stage import EncodeStage
    from shardsmith.encode.text import load_text_encoder

    def stage():
        return EncodeStage(None, load_text_encoder("minilm"), batch_size=4, device="cpu")

    x = "a cat sitting on a red chair in the sun"
    first = stage()
    first.text(["a dog", "the mountains at dawn with snow and a lake", "x y z"])
    seen_late = first.text([x])[0]  # the others cached: x encoded with no mates
    fresh = stage().text(["a dog", x, "the mountains at dawn with snow and a lake"])[1]  # x among mates
    many = stage().text([f"caption {i}" for i in range(9)] + [x])[-1]  # x in a chunk of its own after two full ones
    for got in (fresh, many):
        assert got[0].dtype == seen_late[0].dtype and got[0].shape == seen_late[0].shape == (77, 384)
        assert torch.equal(got[0], seen_late[0]) and torch.equal(got[1], seen_late[1])
