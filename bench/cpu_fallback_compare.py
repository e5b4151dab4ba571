"""Where a machine's AOTInductor package loader crashes: a warm compiled build of this code (``program``) against one
of OLD's (``old_fallback``), and the same build eager, through the CLI on this machine's CPU (BENCHMARKS.md §10; a
diagnostic). Twenty-third session: OLD 12d58a3 built the model and compiled diffusers' module, this code compiled
the package's exported program with torch.compile; twenty-sixth: OLD 5038ab3 is that, this code loads the program
compiled ahead into an Inductor artifact. Every build's verifying child is made to crash (``aot_package._VERIFY``), as on the leased H100s.
Needs bench/cli_cpu_packaged.py's photos in /tmp/pkp/src first.

    git worktree add /tmp/oldsrc 12d58a3 && python bench/cpu_fallback_compare.py /tmp/oldsrc
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

OLD, NEW = sys.argv[1], str(Path(__file__).resolve().parents[1])
WORK, SRC = Path("/tmp/cmp"), Path("/tmp/pkp/src")
CRASH = ("import shardsmith.encode.aot_package as a; a._VERIFY = 'import os, signal; os.kill(os.getpid(), "
         "signal.SIGSEGV)'; from shardsmith.cli import main; main()")


def recipe(compile_: str) -> dict:
    return {"sources": [{"path": str(SRC)}], "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
            "split": {"holdout": 0}, "outputs": [{"format": "latent_wds", "dir": "lat"}],
            "models": {"vae": {"family": "sd", "config": "tiny"}, "batch_size": 16, "compile": compile_, "device": "cpu"}}


def run(name: str, code: str, compile_: str) -> tuple:
    """One build through the CLI: (wall s, load_models_s, model_built, from_program, any shape unusable)."""
    rp, out = WORK / f"{name}.json", WORK / f"o_{name}"
    rp.write_text(json.dumps(recipe(compile_)))
    subprocess.run(["rm", "-rf", str(out)], check=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(WORK / ("cache_old" if code == OLD else "cache_new")),
           "PYTHONPATH": f"{code}/src"}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", CRASH, "build", str(rp), "--out", str(out), "-q", "--no-report"],
                   check=True, env=env, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    m = json.loads((out / "manifest.json").read_text())
    c = m["models"]["compile"]
    return wall, m["timings"].get("load_models_s"), c.get("model_built"), c.get("from_program"), bool(c.get("unusable"))


def main() -> None:
    WORK.mkdir(exist_ok=True)
    subprocess.run(["rm", "-rf", str(WORK / "cache_old"), str(WORK / "cache_new")], check=True)
    for code in (OLD, NEW):
        print("cold", code, run("cold", code, "on"), flush=True)
    walls: dict[str, list[float]] = {}
    for _ in range(3):
        for name, code, c in (("eager", NEW, "off"), ("old_fallback", OLD, "on"), ("program", NEW, "on")):
            r = run(name, code, c)
            walls.setdefault(name, []).append(r[0])
            print(name, r, flush=True)
    print({k: round(statistics.median(v), 2) for k, v in walls.items()})


if __name__ == "__main__":
    main()
