"""The build's main process does not grow with the item count (issue 24).

Each build runs in a fresh interpreter (the peak of this test process would say nothing) that
reports its own peak RSS (``VmHWM``). A 20k-item build may exceed a 2k-item build by at most
:data:`MARGIN_KIB`: about 90 bytes per extra item, a quarter of what one kept string per item
costs, with room for the noise of a busy machine (the median of two builds each).
"""

import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

SMALL, LARGE = 2_000, 20_000
MARGIN_KIB = 1_600

CHILD = r"""
import json, sys
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
recipe = recipe_from_dict({"sources": [{"path": sys.argv[1]}],
                           "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 1000}]})
build(recipe, sys.argv[2], quiet=True, workers=2)
written = sum(json.load(open(sys.argv[2] + "/wds/shard_count.json")).values())
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"hwm_kib": hwm, "written": written}))
"""


def _tiny_pngs(dest, n: int, seed: int = 0) -> None:
    dest.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(dest / f"{i:07d}.png")


def _peak_kib(src, out) -> int:
    p = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads(p.stdout.strip().splitlines()[-1])
    assert d["written"] == len(os.listdir(src))
    return d["hwm_kib"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_build_peak_rss_does_not_grow_with_items(tmp_path):
    large = tmp_path / "large"
    _tiny_pngs(large, LARGE)
    small = tmp_path / "small"
    small.mkdir()
    for name in sorted(os.listdir(large))[:SMALL]:
        os.link(large / name, small / name)
    peaks: dict[int, list[int]] = {SMALL: [], LARGE: []}
    for r in range(2):
        for n, src in ((SMALL, small), (LARGE, large)) if r == 0 else ((LARGE, large), (SMALL, small)):
            peaks[n].append(_peak_kib(src, tmp_path / f"out_{n}_{r}"))
    grew = statistics.median(peaks[LARGE]) - statistics.median(peaks[SMALL])
    assert grew <= MARGIN_KIB, (f"the build's main process grew {grew} KiB from {SMALL} to {LARGE} items "
                                f"(peaks in KiB: {peaks}); it must not hold per-item state")
