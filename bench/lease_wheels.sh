#!/usr/bin/env bash
# Download, on the development machine, the wheels a leased GPU image lacks (see bench/as_installed.sh) into
# DIR (default .whl_slim, which .git/info/exclude should list): python3.12, manylinux x86_64, no dependencies
# resolved (the list is complete for shardsmith's build path on that image). Carry DIR with the lease's call
# and install it there with bench/lease_setup.sh.
# TRANSFORMERS=1: also our pinned transformers (the image has an older one), without py-spy and with only the model
# folders the benches' builds import (auto, t5, bert, what auto's tokenizer lookup and peft pull in: 45 of its 55 MB are
# model folders), so that the carry (with .devsite and the tree) stays under a call's 64 MiB; bench/lease_setup.sh
# falls back to the image's where it fails to import.
#
#   bash bench/lease_wheels.sh .whl_slim
#   TRANSFORMERS=1 bash bench/lease_wheels.sh .whl_tf
set -euo pipefail
dir=${1:-.whl_slim}
mkdir -p "$dir"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
pins=$(python3 - <<'PY'
import os, re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
want = {"av", "diffusers", "webdataset", "typer", "rich", "pydantic", "pyyaml"}
if os.environ.get("TRANSFORMERS") == "1":
    want.add("transformers")
print(" ".join(d for d in deps if re.split(r"[=<>]", d)[0].lower() in want))
PY
)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" $pins braceexpand click shellingham markdown-it-py mdurl pygments annotated-types \
  typing-inspection "typing-extensions>=4.16" $([ "${TRANSFORMERS:-}" = 1 ] || echo py-spy)
core=$(unzip -p "$dir"/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" "pydantic-core==$core"
if [ "${TRANSFORMERS:-}" = 1 ]; then
  python3 - "$dir"/transformers-[0-9]*.whl <<'PY'
import sys, zipfile
keep = {"auto", "t5", "bert", "align", "encoder_decoder", "clip", "gemma3",  # (the builds)
        "bloom", "dinov2_with_registers", "siglip", "vit_mae"}  # (peft, which a library caller's diffusers imports)
src = sys.argv[1]
kept = lambda n: not (n.startswith("transformers/models/") and n.count("/") >= 3 and n.split("/")[2] not in keep)
with zipfile.ZipFile(src) as z:
    entries = [(i, z.read(i)) for i in z.infolist() if kept(i.filename)]
with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
    for info, data in entries:
        if info.filename.endswith(".dist-info/RECORD"):
            data = "".join(l + "\n" for l in data.decode().splitlines() if kept(l.split(",")[0])).encode()
        z.writestr(info, data)
PY
fi
du -sh "$dir"
