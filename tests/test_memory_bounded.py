"""The main process of build, verify, scan, inspect and repair does not grow with the item count (issue 24).

Each build runs in a fresh interpreter (the peak of this test process would say nothing) that
reports its own peak RSS (``VmHWM``). A 20k-item build may exceed a 2k-item build by at most
:data:`MARGIN_KIB`: about 90 bytes per extra item, a quarter of what one kept string per item
costs, with room for the noise of a busy machine (the median of two builds each). The CLI
commands are measured the same way, each against its own margin.
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


def _two_sets(tmp_path):
    large = tmp_path / "large"
    _tiny_pngs(large, LARGE)
    small = tmp_path / "small"
    small.mkdir()
    for name in sorted(os.listdir(large))[:SMALL]:
        os.link(large / name, small / name)
    return {SMALL: small, LARGE: large}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_build_peak_rss_does_not_grow_with_items(tmp_path):
    sets = _two_sets(tmp_path)
    small, large = sets[SMALL], sets[LARGE]
    peaks: dict[int, list[int]] = {SMALL: [], LARGE: []}
    for r in range(2):
        for n, src in ((SMALL, small), (LARGE, large)) if r == 0 else ((LARGE, large), (SMALL, small)):
            peaks[n].append(_peak_kib(src, tmp_path / f"out_{n}_{r}"))
    grew = statistics.median(peaks[LARGE]) - statistics.median(peaks[SMALL])
    assert grew <= MARGIN_KIB, (f"the build's main process grew {grew} KiB from {SMALL} to {LARGE} items "
                                f"(peaks in KiB: {peaks}); it must not hold per-item state")


# --- verify and scan: their main process keeps no per-item state either --------------------------------

CLI_CHILD = r"""
import atexit, os, sys
def peak():
    hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
    os.write(2, f"VmHWM_KIB {hwm}\n".encode())
atexit.register(peak)
sys.argv = ["shardsmith", *sys.argv[1:]]
from shardsmith.cli import app
app()
"""

VERIFY_MARGIN_KIB = 1_600  # before the fix verify grew ~6500 KiB from 2k to 20k items (~370 B per item)
SCAN_MARGIN_KIB = 1_000  # before the fix scan grew 928..1310 KiB (~70 B per item), after it ~560 KiB: headroom for noise


def _cli_peak_kib(*args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-c", CLI_CHILD, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("VmHWM_KIB ")][-1]
    return int(line.split()[1]), p.stdout


def _growth_kib(targets: dict[int, object], command: str, check_out, quiet: bool = True) -> tuple[float, dict]:
    """Main-process peaks of ``shardsmith COMMAND TARGET [--quiet]`` at both sizes, interleaved, two each."""
    peaks: dict[int, list[int]] = {SMALL: [], LARGE: []}
    for r in range(2):
        for n in (SMALL, LARGE) if r == 0 else (LARGE, SMALL):
            kib, out = _cli_peak_kib(command, str(targets[n]), *(("--quiet",) if quiet else ()))
            check_out(n, out)
            peaks[n].append(kib)
    return statistics.median(peaks[LARGE]) - statistics.median(peaks[SMALL]), peaks


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_verify_peak_rss_does_not_grow_with_items(built_sets):
    def seen_all(n, out):
        assert f"{n} of {n} samples seen exactly once" in out, out[-2000:]

    grew, peaks = _growth_kib(built_sets, "verify", seen_all)
    assert grew <= VERIFY_MARGIN_KIB, (f"verify's main process grew {grew} KiB from {SMALL} to {LARGE} samples "
                                       f"(peaks in KiB: {peaks}); it must not hold per-sample state")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_scan_peak_rss_does_not_grow_with_items(tmp_path):
    def counted(n, out):
        assert f"{n} item(s)" in out.splitlines()[0], out[:500]

    grew, peaks = _growth_kib(_two_sets(tmp_path), "scan", counted)
    assert grew <= SCAN_MARGIN_KIB, (f"scan's main process grew {grew} KiB from {SMALL} to {LARGE} items "
                                     f"(peaks in KiB: {peaks}); it must not hold per-item state")


# --- inspect and repair: shard by shard, no per-sample state past its shard ------------------------------

# before the fix inspect and repair grew ~23400 KiB from 2k to 20k samples (~1.3 KiB per sample: every
# shard's sample runs were kept); after it -60..+90 KiB: the margin is noise headroom
INSPECT_MARGIN_KIB = 1_600
REPAIR_MARGIN_KIB = 1_600


@pytest.fixture(scope="module")
def built_sets(tmp_path_factory):
    """A wds dataset (1000 samples per shard) built from 2k and from 20k tiny images, once for the module:
    verify, inspect and repair read it."""
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    tmp = tmp_path_factory.mktemp("inspect_repair")
    targets = {}
    for n, src in _two_sets(tmp).items():
        recipe = recipe_from_dict({"sources": [{"path": str(src)}],
                                   "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 1000}]})
        build(recipe, tmp / f"ds_{n}", quiet=True, workers=2)
        targets[n] = tmp / f"ds_{n}" / "wds"
    return targets


def _tree(root) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_inspect_peak_rss_does_not_grow_with_samples(built_sets):
    def clean(n, out):
        lines = out.splitlines()
        assert f"{n} sample(s)" in lines[0] and "OK" in lines, out[:1000]

    grew, peaks = _growth_kib(built_sets, "inspect", clean, quiet=False)
    assert grew <= INSPECT_MARGIN_KIB, (f"inspect's main process grew {grew} KiB from {SMALL} to {LARGE} samples "
                                        f"(peaks in KiB: {peaks}); it must not hold per-sample state")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_repair_peak_rss_does_not_grow_with_samples(built_sets):
    shards = {n: _tree(d) for n, d in built_sets.items()}

    def unchanged(n, out):
        lines = out.splitlines()
        assert sum(" unchanged " in ln for ln in lines) == n // 1000 and "ERROR" not in out, out[-2000:]

    grew, peaks = _growth_kib(built_sets, "repair", unchanged)
    assert {n: _tree(d) for n, d in built_sets.items()} == shards  # a healthy dataset: nothing written
    assert grew <= REPAIR_MARGIN_KIB, (f"repair's main process grew {grew} KiB from {SMALL} to {LARGE} samples "
                                       f"(peaks in KiB: {peaks}); it must not hold per-sample state")
