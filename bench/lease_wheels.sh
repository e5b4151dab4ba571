#!/usr/bin/env bash
# Download, on the development machine, the wheels a leased GPU image lacks (see bench/as_installed.sh) into
# DIR (default .whl_slim, which .git/info/exclude should list): python3.12, manylinux x86_64, no dependencies
# resolved (the list is complete for shardsmith's build path on that image). Carry DIR with the lease's call
# and install it there with bench/lease_setup.sh.
#
#   bash bench/lease_wheels.sh .whl_slim
set -euo pipefail
dir=${1:-.whl_slim}
mkdir -p "$dir"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
pins=$(python3 - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
want = {"av", "diffusers", "webdataset", "typer", "rich", "pydantic", "pyyaml"}
print(" ".join(d for d in deps if re.split(r"[=<>]", d)[0].lower() in want))
PY
)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" $pins braceexpand click shellingham markdown-it-py mdurl pygments annotated-types \
  typing-inspection "typing-extensions>=4.16" py-spy
core=$(unzip -p "$dir"/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" "pydantic-core==$core"
du -sh "$dir"
