"""Teacher trajectories through ``shardsmith distill``: batched generation vs a per-sample loop (issue 19).

One lease, one dataset of ``--prompts`` prompts (subjects x settings x styles, a holdout of 1/16 that
the teacher never sees), the same recipe twice:

1. **batched**: ``shardsmith distill recipe.yaml --out OUT --no-report -q --set models.batch_size=B``
2. **per-sample loop**: the same with ``models.batch_size=1`` (one prompt per teacher call, the way the
   public trajectory generators run),

each in a subprocess, wall time from the command to its exit (the manifest is the run's last write):
interpreter start, plan, the models' build (random weights of Sana 600M's published transformer config,
bf16, and a Gemma-3-width random text encoder, 2304-wide as Sana's caption_channels), the text encoding
and the teacher's ODE (``--solver`` with ``--steps`` steps, classifier-free guidance), shards and index.
Trajectories per second = prompts written / wall seconds; ratio = batched ÷ per-sample (goal >= 4).

3. **diagnostic (harness-internal, labelled so)**: in a fresh process, the same teacher and one batch of B
   through :class:`~shardsmith.distill.trajectories.Sampler` (after a warm-up batch; median of 3): the
   denoiser's share of the batch = the forwards' GPU time (CUDA events around each teacher call) ÷ the
   batch's wall time (synchronised); the rest is the solver's arithmetic, the noise and the copies.

Usage (GPU machine): ``PYTHONPATH=src:tests python3 bench/distill_speed.py --work /tmp/ds --out $OUT/distill.json``
CPU check of the code paths: ``... --prompts 24 --batch 4 --steps 4 --config tiny --text minilm --device cpu``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

SUBJECTS = ["a red fox", "an astronaut", "a lighthouse", "a bowl of ramen", "a vintage bicycle", "a tabby cat",
            "an old fisherman", "a paper boat", "a glass teapot", "a mountain village", "a steam locomotive",
            "a hummingbird", "a sunflower field", "a jazz trio", "a snowy owl", "a desert canyon"]
SETTINGS = ["at dawn", "in heavy rain", "under neon lights", "on a foggy morning", "at golden hour",
            "in deep snow", "by candlelight", "on the moon"]
STYLES = ["photorealistic, 50mm", "watercolour", "isometric pixel art", "oil painting, impasto",
          "studio lighting, macro", "ink sketch"]


def _prompts(n: int) -> list[str]:
    combos = itertools.cycle(itertools.product(SUBJECTS, SETTINGS, STYLES))
    return [f"{s} {w}, {st} (#{i})" for i, (s, w, st) in zip(range(n), combos)]


def _recipe(work: Path, args) -> Path:
    import yaml

    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in _prompts(args.prompts)))
    text = {"family": "minilm"} if args.text == "minilm" else {
        "family": "gemma", "config": "published", "max_length": 300, "dtype": "bfloat16"}
    shape = [4, 8, 8] if args.config == "tiny" else [32, 16, 16]  # Sana 600M at 512 px: 32 x 16 x 16 DC-AE latents
    recipe = {"sources": [{"path": "prompts.jsonl", "columns": {"caption": "prompt"}}],
              "split": {"holdout": max(1, args.prompts // 16), "seed": 0},
              "outputs": [{"format": "kd_wds", "samples_per_shard": 128, "text_dtype": "bfloat16"}],
              "models": {"teacher": {"family": "sana", "config": args.config, "dtype": args.dtype},
                         "text": text, "device": args.device, "compile": "off"},
              "distill": {"shape": shape, "steps": args.steps, "solver": args.solver, "guidance": args.guidance,
                          "negative_prompt": "blurry, low quality, watermark"}}
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _run(recipe: Path, out: Path, batch: int) -> dict:
    cmd = [sys.executable, "-m", "shardsmith", "distill", str(recipe), "--out", str(out), "--no-report", "-q",
           "--set", f"models.batch_size={batch}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    m = json.loads((out / "manifest.json").read_text())
    written = m["counts"]["written"]
    stage = m.get("models") or {}
    return {"batch": batch, "wall_s": round(wall, 2), "written": written, "traj_per_s": round(written / wall, 3),
            "seconds": stage.get("seconds"), "timings": m.get("timings")}


def _profile(recipe_path: Path, batch: int) -> dict:
    """Harness-internal: the denoiser's share of one batch through the Sampler (a fresh process)."""
    code = f"""
import json, time, torch
from shardsmith.recipe import load_recipe
from shardsmith.encode.teacher import load_teacher
from shardsmith.distill.trajectories import Sampler
r = load_recipe({str(recipe_path)!r}); tm = r.models.teacher
dev = "cuda" if torch.cuda.is_available() else "cpu"
t = load_teacher(tm.family, config=tm.config, dtype=tm.dtype, device=dev)
inner, spans = t._fn, []
def timed(x, tt, c, m):
    if dev != "cuda":
        return inner(x, tt, c, m)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); out = inner(x, tt, c, m); b.record(); spans.append((a, b))
    return out
t._fn = timed
s = Sampler.from_recipe(r)
cond = torch.randn({batch}, 300 if r.models.text.family == "gemma" else 77, t.spec.text_dim or 384)
neg = (torch.zeros(cond.shape[1:]), None)
s.run(t, list(range({batch})), cond, None, neg)  # warm-up
walls, dens = [], []
for _ in range(3):
    spans.clear()
    if dev == "cuda": torch.cuda.synchronize()
    t0 = time.perf_counter(); s.run(t, list(range({batch})), cond, None, neg)
    if dev == "cuda": torch.cuda.synchronize()
    walls.append(time.perf_counter() - t0)
    dens.append(sum(a.elapsed_time(b) for a, b in spans) / 1e3)
wall, den = sorted(walls)[1], sorted(dens)[1]
print(json.dumps({{"batch": {batch}, "batch_wall_s": round(wall, 4), "denoiser_s": round(den, 4),
                  "denoiser_share_of_batch": round(den / wall, 4) if wall and den else None,
                  "forward_passes": s.forward_passes(), "rows_per_forward": 2 * {batch} if s.guidance != 1 else {batch}}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])})
    if r.returncode:
        return {"error": r.stderr[-3000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--solver", default="heun")
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--config", default="published")
    ap.add_argument("--text", default="gemma", choices=["gemma", "minilm"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-loop", action="store_true")
    ap.add_argument("--profile-only", action="store_true")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    recipe = _recipe(args.work, args)
    res = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    if not args.profile_only:
        res["batched"] = _run(recipe, args.work / "batched", args.batch)
        print(json.dumps(res["batched"]), flush=True)
    if not args.skip_loop and not args.profile_only:
        res["per_sample"] = _run(recipe, args.work / "loop", 1)
        print(json.dumps(res["per_sample"]), flush=True)
        res["ratio"] = round(res["batched"]["traj_per_s"] / res["per_sample"]["traj_per_s"], 3)
    res["profile"] = _profile(recipe, args.batch)
    print(json.dumps(res["profile"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: res.get(k) for k in ("ratio",)}))


if __name__ == "__main__":
    main()
