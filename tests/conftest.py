import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "quickstart"


@pytest.fixture
def example_recipe() -> Path:
    return EXAMPLE / "recipe.yaml"


@pytest.fixture
def disk_full_at(monkeypatch):
    """``disk_full_at(seq)``: every WebDataset unit ``seq`` written from now on fails as a full disk (ENOSPC);
    ``disk_full_at(None)``: units are written again."""
    import errno

    from shardsmith.sinks.wds import WdsSink

    write = WdsSink.write_unit

    def arm(seq: int | None) -> None:
        def full_disk(self, s, samples):
            if s == seq:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(self, s, samples)

        monkeypatch.setattr(WdsSink, "write_unit", write if seq is None else full_disk)

    return arm
