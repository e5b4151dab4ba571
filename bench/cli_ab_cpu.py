"""Two versions of the code on one eager VAE-only build through the CLI, alternating, on this machine's CPU (a
diagnostic, BENCHMARKS.md §10, twenty-fourth session): the command's wall time to its exit and the model
load beside the plan (``timings.load_models_overlapped_s``), medians of ``--pairs``. ``--workload image``: the
quickstart's real photos (6 of them), a tiny SD VAE at 64²; ``audio``: 12 real speech files (espeak-ng, three
rates), LTX-2's audio VAE (tiny config). ``--device auto``: the recipe's ``models.device`` (the default, which
settles the image decoder before the plan). The builds must write the same latents.

    git worktree add /tmp/oldsrc 75db711 && python bench/cli_ab_cpu.py /tmp/oldsrc --pairs 8 --out r.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

from _cli import timed_build

REPO = Path(__file__).resolve().parents[1]


def recipe(workload: str, work: Path, device: str = "cpu") -> dict:
    if workload == "image":
        return {"sources": [{"path": str(REPO / "examples" / "quickstart" / "photos")}], "split": {"holdout": 0},
                "geometry": {"buckets": ["64x64x1"]}, "outputs": [{"format": "latent_wds", "dir": "lat"}],
                "models": {"vae": {"family": "sd", "config": "tiny"}, "device": device}}
    src = work / "speech"
    if not src.is_dir():
        sys.path.insert(0, str(REPO / "tests"))
        from video_factory import audio_file

        src.mkdir(parents=True)
        for i in range(12):
            audio_file(src / f"s{i:02d}.wav", kind="speech", duration=1.3, rate=(16000, 22050, 44100)[i % 3],
                       layout=("mono", "stereo")[i % 2])
    return {"sources": [{"path": str(src)}], "split": {"holdout": 0}, "audio": {"durations": "1.0"},
            "outputs": [{"format": "latent_wds", "dir": "lat"}],
            "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "device": device, "batch_size": 4}}


def run(code: Path, work: Path, name: str, workload: str, device: str) -> dict:
    rp, out = work / "recipe.json", work / name
    rp.write_text(json.dumps(recipe(workload, work, device)))
    r = timed_build([str(rp), "-q", "--no-report"], out, env={"HF_HUB_OFFLINE": "1"}, src=code / "src")
    if r.rc != 0:
        raise SystemExit(r.stderr_tail)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((out / "lat").rglob("*.tar")))).hexdigest()
    t = r.manifest["timings"]
    return {"wall_s": round(r.exit_s, 3), "load_s": t.get("load_models_overlapped_s"), "prepare_s": t.get("prepare_s"),
            "latents": digest}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", type=Path, help="a checkout of the code before the change")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--workload", choices=("image", "audio"), default="image")
    ap.add_argument("--device", default="cpu", help="models.device: auto settles the decoder and the offload first")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cli_ab"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list] = {"old": [], "new": []}
    for i in range(args.pairs):
        for side, code in (("old", args.old), ("new", REPO)):
            runs[side].append(run(code, args.work, side, args.workload, args.device))
            print(side, runs[side][-1], flush=True)
    res = {"workload": args.workload, "device": args.device, "pairs": args.pairs, "runs": runs,
           "same_latents": len({r["latents"] for side in runs.values() for r in side}) == 1,
           "median": {side: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "load_s", "prepare_s")}
                      for side, rs in runs.items()}}
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res["median"]), "same latents:", res["same_latents"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
