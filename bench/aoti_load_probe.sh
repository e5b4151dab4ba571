#!/bin/bash
# The AOTInductor loader probe on a leased GPU machine (bench/aoti_load_probe.py; BENCHMARKS.md §10, twenty-third
# session): clean python3 (no PYTHONPATH), CPU and CUDA packages, embedded kernels, a cuda-gdb backtrace. Output: $OUT/aoti.txt
exec > >(tee -a $OUT/aoti.txt) 2>&1
cd /tmp; P=$OLDPWD/bench/aoti_load_probe.py
unset PYTHONPATH
nvidia-smi -L; uname -r; g++ --version | head -1; which cuda-gdb; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch._C._GLIBCXX_USE_CXX11_ABI)"
for d in cpu cuda; do timeout 120 python3 $P build $d 2>&1 | grep -v Warning | tail -3; done
for d in cpu cuda; do timeout 60 python3 $P load $d > /tmp/l_$d.txt 2>&1; echo "load $d rc=$?"; tail -8 /tmp/l_$d.txt; done
mkdir -p /tmp/x && cd /tmp/x && python3 -c "import zipfile; zipfile.ZipFile('/tmp/p5_cuda.pt2').extractall('.')" && find . -name '*.so' -o -name '*.cubin' | head; for s in $(find . -name '*.so'); do ldd $s | grep -v '=> /' ; ldd $s | head -20; done; cd /tmp
timeout 120 cuda-gdb -q -batch -ex 'set pagination off' -ex 'set cuda api_failures ignore' -ex run -ex bt -ex 'info registers rip' -ex 'x/6i $pc' --args python3 $P load cuda 2>&1 | grep -v '^\[New Thread\|^\[Thread' | tail -60
for v in emb multi; do timeout 120 python3 $P build cuda $v 2>&1 | grep -v Warning | tail -2; timeout 60 python3 $P load cuda $v > /tmp/l_$v.txt 2>&1; echo "load $v rc=$?"; tail -4 /tmp/l_$v.txt; done
env | grep -i "^LD_\|CUDA" ; cat /proc/self/maps 2>/dev/null | head -0
timeout 120 python3 $P buildso cuda 2>&1 | grep -v Warning | tail -3
timeout 60 python3 $P loadso cuda > /tmp/lso.txt 2>&1; echo "loadso rc=$?"; tail -6 /tmp/lso.txt
