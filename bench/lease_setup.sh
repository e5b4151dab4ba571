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
bash bench/as_installed.sh true
unset PYTHONDONTWRITEBYTECODE
python3 -c "import torch, diffusers, av, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'av', av.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
