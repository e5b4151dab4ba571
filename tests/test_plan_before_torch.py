"""An audio build plans before torch is imported: with ``models.device: auto`` (the default) the build's
process starts its plan and forks its workers without torch (its import, seconds on a GPU host, runs
beside the plan in the model loader), and no probe or decode worker imports torch at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from video_factory import audio_file

pytestmark = pytest.mark.slow

_PROBE = r'''
import json, os, sys
report = {"children_importing_torch": 0}
marker = sys.argv[3]

class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            with open(marker + ".child." + str(os.getpid()), "w") as f:
                f.write("torch")
        return None

os.register_at_fork(after_in_child=lambda: sys.meta_path.insert(0, _Finder()))
import shardsmith.build as b
_orig = b._start_plan_ahead
def _at_plan(*a, **k):
    report["torch_before_plan"] = "torch" in sys.modules
    with open(marker, "w") as f:
        json.dump(report, f)
    return _orig(*a, **k)
b._start_plan_ahead = _at_plan
from shardsmith.cli import main
sys.argv = ["shardsmith", "build", sys.argv[1], "--out", sys.argv[2], "--no-report", "-q"]
main()
'''


def test_an_audio_build_starts_its_plan_and_workers_without_torch(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    audio_file(src / "a.wav", duration=1.5, rate=16000, layout="stereo")
    audio_file(src / "b.flac", duration=1.2, rate=22050, layout="mono")
    audio_file(src / "c.wav", duration=2.1, rate=48000, layout="stereo")
    rec = tmp_path / "recipe.yaml"
    rec.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}],
        "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "batch_size": 2},  # device: auto
        "audio": {"durations": "1.0"}, "outputs": [{"format": "latent_wds", "dir": "audio"}]}))
    marker = tmp_path / "at_plan.json"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", _PROBE, str(rec), str(out), str(marker)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 3
    assert json.loads(marker.read_text())["torch_before_plan"] is False
    children = sorted(p.name for p in tmp_path.glob("at_plan.json.child.*"))
    assert children == [], f"forked workers imported torch: {children}"
