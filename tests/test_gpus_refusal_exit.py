"""``--gpus N``: a refusal of the complete plan that fires inside an output's split, after the output's
LatentFinisher was made (the GPU workers ran ahead of the plan, then the holdout check refused it), exits 2 with
its one message and the process ends; the finisher is closed (its writer threads and stager), where it was left
open before. On this CPU machine the workers run on CPU "devices" (``SHARDSMITH_WORKER_DEVICES``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from media_factory import real_photos

#: ``shardsmith ARGS`` with LatentFinisher's construction and close() said on stderr (the spawned GPU workers
#: import this file as ``__mp_main__``: nothing runs there)
SPY = '''
import sys


def main():
    from shardsmith.encode import finisher as F

    init, close = F.LatentFinisher.__init__, F.LatentFinisher.close

    def spy_init(self, *a, **k):
        sys.stderr.write("SPY finisher made\\n")
        sys.stderr.flush()
        init(self, *a, **k)

    def spy_close(self):
        close(self)
        sys.stderr.write("SPY finisher closed\\n")
        sys.stderr.flush()

    F.LatentFinisher.__init__, F.LatentFinisher.close = spy_init, spy_close
    from shardsmith.cli import main as cli_main

    sys.argv = ["shardsmith", *sys.argv[1:]]
    cli_main()


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow  # (two worker processes load a VAE)
def test_a_refusal_inside_a_gpus_split_exits_2_closes_the_finisher_and_the_process_ends(tmp_path):
    photos = real_photos(tmp_path / "photos", 6, seed=7, min_side=64, max_side=120)
    for i, p in enumerate(photos):
        p.with_suffix(".txt").write_text(f"a photo {i}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": "photos"}], "geometry": {"buckets": ["64x64x1"]},
        "split": {"holdout": 0.999, "seed": 1},  # a fraction: the plan runs ahead, and every item is held out
        "models": {"vae": {"family": "sd", "config": "tiny"}, "device": "cpu", "batch_size": 4},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 3}]}))
    spy = tmp_path / "spy.py"
    spy.write_text(SPY)
    try:
        r = subprocess.run([sys.executable, str(spy), "build", str(recipe), "--out", str(tmp_path / "out"),
                            "--workers", "2", "--no-report", "--gpus", "2"], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path,
                           env={**os.environ, "SHARDSMITH_WORKER_DEVICES": "cpu,cpu", "HF_HUB_OFFLINE": "1",
                                "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired as exc:  # (generous: the build itself takes seconds)
        pytest.fail(f"the refused build did not end: {exc}")
    said = " ".join(r.stderr.split())  # (the console wraps long lines)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert "split.holdout (a fraction of 0.999) holds out all 6 planned item(s) of output 'latent_wds'" in said
    made, closed = r.stderr.count("SPY finisher made"), r.stderr.count("SPY finisher closed")
    assert made >= 1 and closed == made, r.stderr  # before: made 1, closed 0
