"""A rank whose DataLoader worker fails reports one line in ``verify``'s ``loader_runs`` check: the worker's
sentence and the original error, not the worker's traceback (which stays in the report's ``traces``)."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader, Dataset

from shardsmith.verify.ranks import error_line


class _Broken(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        raise ValueError(f"member 00003.latent.pth of shard 00000.tar is truncated (item {i})")


@pytest.mark.slow
def test_a_dataloader_worker_s_error_is_one_line_with_the_original_error():
    with pytest.raises(Exception) as info:
        next(iter(DataLoader(_Broken(), num_workers=1, multiprocessing_context="fork")))
    assert "Traceback" in str(info.value)  # what torch re-raises: the worker's traceback inside the message
    line = error_line(info.value)
    assert "\n" not in line and "Traceback" not in line and 'File "' not in line
    assert line.startswith("ValueError: Caught ValueError in DataLoader worker process 0.")
    assert line.endswith("ValueError: member 00003.latent.pth of shard 00000.tar is truncated (item 0)")


def test_other_errors_keep_their_message_on_one_line():
    assert error_line(KeyError("txt_emb.pth")) == "KeyError: 'txt_emb.pth'"
    assert error_line(RuntimeError("two\nlines")) == "RuntimeError: two lines"
