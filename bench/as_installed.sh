#!/usr/bin/env bash
# Run a benchmark command with Python as a user's `pip install` leaves it (BENCHMARKS.md §10, runs 6-9).
#
# The leased GPU machines ship their packages without bytecode and set PYTHONDONTWRITEBYTECODE=1, so every
# process there compiles every module it imports, every time (import torch 5.6-8.0 s instead of 1.8-2.7 s).
# pip compiles bytecode when it installs. This compiles the interpreter's site-packages and the paths given
# in AS_INSTALLED_PATHS (default: src) once (a marker in /tmp), untimed, unsets the variable and runs "$@".
#
#   bash bench/as_installed.sh python3 bench/cli_gpu_build.py --work /tmp/b --out r.json --workloads small
#
# The leased image (2026-12) has torch 2.11, numpy, Pillow, transformers 5.17, safetensors and pytest. The
# wheels it lacks are those bench/lease_wheels.sh downloads (bench/lease_setup.sh installs them there). Do not
# carry soundfile: without cffi's backend there it breaks transformers' audio_utils, and with it every
# diffusers model import.
set -euo pipefail
marker=/tmp/.shardsmith-bytecode-compiled
if [ ! -f "$marker" ]; then
  start=$(date +%s)
  site=$(python3 -c "import site; print(site.getsitepackages()[0])")
  # (a module that does not compile, e.g. a test fixture written for another Python, is left as it is)
  python3 -m compileall -q -j "$(nproc)" "$site" ${AS_INSTALLED_PATHS:-src} >/dev/null 2>&1 || true
  echo "as_installed: bytecode compiled in $(( $(date +%s) - start )) s (untimed)" >&2
  touch "$marker"
fi
unset PYTHONDONTWRITEBYTECODE
exec "$@"
