# Source at the start of a leased GPU machine's command: installs the carried wheels (bench/lease_wheels.sh)
# into /tmp/site, puts src and them on PYTHONPATH, and compiles bytecode once (bench/as_installed.sh).
#   source bench/lease_setup.sh .whl_slim
# SHARDSMITH_SPEECH_DIR, where set by the caller, names carried espeak-ng WAVs (bench/audio_build.py).
set -o pipefail
export PYTHONUNBUFFERED=1
date; nvidia-smi -L; nproc
if [ ! -d /tmp/site/diffusers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${1:-.whl_slim}"/*.whl || return 1
fi
export PYTHONPATH=$PWD/src:/tmp/site PATH=/tmp/site/bin:$PATH AS_INSTALLED_PATHS="src /tmp/site"
if [ -d /tmp/site/transformers ] && ! python3 -c "import importlib.util as u, transformers.modeling_utils
u.find_spec('peft') and __import__('peft')" > /tmp/tf_import.txt 2>&1; then  # (peft: the image's, on transformers)
  echo "the carried transformers does not import beside this image's packages; using the image's:"; tail -1 /tmp/tf_import.txt
  rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
fi
bash bench/as_installed.sh true
unset PYTHONDONTWRITEBYTECODE
python3 -c "import torch, diffusers, av, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'av', av.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
