#!/usr/bin/env bash
# The audio bench of issue 17 on a leased GPU machine, in one call (BENCHMARKS.md §7):
#   bench/audio_build.py at FILES files (the first build, the encoder alone, the ratio), then WARM warm builds of
#   the same recipe timed from the command to the exit (with SWITCH, each followed by one that starts at that switch
#   interval in seconds: bench/gil_convoy.py; a GPU build lowers it to 0.1 ms itself, encode/stage.py's GIL_SWITCH_S,
#   so only a SWITCH below 0.0001 changes anything; with PLANFIRST=1, each followed by one that plans first, the order
#   before audio builds planned ahead), then (SUSTAINED=1) bench/audio_alone_sustained.py, then (PROFILE=1) one under py-spy --native,
#   summarised by bench/pyspy_summary.py. Everything goes to $OUT (log.txt, a.json, manifests, profile).
#
#   SHARDSMITH_SPEECH_DIR=$PWD/speech FILES=64000 WARM=1 PROFILE=1 bash bench/lease_audio.sh .whl_slim
# (carry the wheels' folder, from bench/lease_wheels.sh, and the speech WAVs' folder with the call)
exec > >(tee -a "$OUT/log.txt") 2>&1
source bench/lease_setup.sh "${1:-.whl_slim}" || exit 1
files=${FILES:-64000}; t0=$(date +%s)
python3 bench/audio_build.py --work /tmp/ab --files "$files" --distinct "${DISTINCT:-4000}" --alone-items 4096 \
  --out "$OUT/a.json" | tail -9
echo "bench done at +$(( $(date +%s) - t0 )) s"
warm() {  # label [switch interval] [plan first]: one warm build, the CLI's own entry, timed from the command to the exit
  local t=$EPOCHREALTIME
  python3 -c "import sys; s, f = sys.argv.pop(1), sys.argv.pop(1); s and sys.setswitchinterval(float(s))
if f: import shardsmith.build as b; b.PLAN_AHEAD = False  # the plan first, in a process of its own, waited for
from shardsmith.cli import main; main()" \
    "${2:-}" "${3:-}" build /tmp/ab/recipe.yaml --out "/tmp/ab/$1" --no-report -q || echo "warm build $1 failed"
  python3 -c "import sys, json; m = json.load(open(sys.argv[3])); s = m['models']['audio_steady_state']; print('warm $1:', round(float(sys.argv[2]) - float(sys.argv[1]), 2), 's; stream', s['items_per_s'], 'items/s; GPU idle', s['gpu_idle']['idle_s'], 's; plan', m['timings']['plan_s'], 's, ahead', m['timings'].get('plan_ahead', False), '; first batch done', s['first_batch_done_s'], 's')" "$t" "$EPOCHREALTIME" "/tmp/ab/$1/manifest.json"
  cp "/tmp/ab/$1/manifest.json" "$OUT/$1_manifest.json"; rm -rf "/tmp/ab/$1"
}
for i in $(seq 1 "${WARM:-0}"); do  # with SWITCH (seconds, below 0.0001): each warm build followed by one at it
  warm "warm$i"
  [ -n "${SWITCH:-}" ] && warm "switch$i" "$SWITCH"
  [ -n "${PLANFIRST:-}" ] && warm "planfirst$i" "" 1
done
if [ "${SUSTAINED:-0}" = 1 ]; then  # the encoder alone over the build's item count, in its cuDNN modes
  PYTHONPATH=$PYTHONPATH:$PWD/bench python3 bench/audio_alone_sustained.py --work /tmp/ab --items "$files" \
    > "$OUT/sustained.json" && cat "$OUT/sustained.json"
fi
if [ "${PROFILE:-0}" = 1 ]; then
  python3 -m shardsmith build /tmp/ab/recipe.yaml --out /tmp/ab/prof --no-report -q & pid=$!
  sleep 20; py-spy record --pid $pid --native --threads --idle --format raw -r 40 -d 25 -o /tmp/prof.txt >/dev/null 2>&1
  wait $pid
  python3 bench/pyspy_summary.py /tmp/prof.txt > "$OUT/prof_summary.txt"; gzip -c /tmp/prof.txt > "$OUT/prof.txt.gz"
  head -40 "$OUT/prof_summary.txt"
fi
echo "all done at +$(( $(date +%s) - t0 )) s"
