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
