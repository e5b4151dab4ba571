"""Where a torch's AOTInductor package loader crashes (BENCHMARKS.md §10, twenty-third session): a bare nn.Linear
compiled into a CPU and a CUDA package, each loaded in a fresh process; bench/aoti_load_probe.sh runs it, with a
cuda-gdb backtrace of the CUDA load and ldd of the package's library. ``act dev [variant]``: build | load | buildso |
loadso, cpu | cuda, "" | emb (kernels embedded in the library) | multi (and for several architectures)."""
import faulthandler
import sys
import time

faulthandler.enable()
import torch
act, dev = sys.argv[1], sys.argv[2]
x = torch.zeros(4, 16, device=dev)
var = sys.argv[3] if len(sys.argv) > 3 else ""
p = f"/tmp/p5_{dev}{var}.pt2"
OPTS = {"": {}, "emb": {"aot_inductor.embed_kernel_binary": True}, "multi": {"aot_inductor.emit_multi_arch_kernel": True, "aot_inductor.embed_kernel_binary": True}}
if act == "build":
    mod = torch.nn.Linear(16, 8).to(dev)
    ep = torch.export.export(mod, (x,))
    t = time.perf_counter()
    out = torch._inductor.aoti_compile_and_package(ep, package_path=p, inductor_configs=OPTS[var])
    print("built", dev, out, round(time.perf_counter() - t, 1), flush=True)
elif act == "buildso":
    mod = torch.nn.Linear(16, 8).to(dev)
    so = torch._inductor.aot_compile(torch.export.export(mod, (x,)).module(), (x,), options={"aot_inductor.package": False, "aot_inductor.output_path": f"/tmp/p5_{dev}.so"})
    print("built so", so, flush=True)
elif act == "loadso":
    r = torch._C._aoti.AOTIModelContainerRunnerCuda(f"/tmp/p5_{dev}.so", 1, dev) if dev == "cuda" else torch._C._aoti.AOTIModelContainerRunnerCpu(f"/tmp/p5_{dev}.so", 1)
    print("so load ok", flush=True)
    o = r.run([x]); torch.cuda.synchronize() if dev == "cuda" else None
    print("so run ok", o[0].shape, flush=True)
elif act == "load":
    print("loading", p, flush=True)
    l = torch._C._aoti.AOTIModelPackageLoader(p, "model", False, 1, 0 if dev == "cuda" else -1)
    print("raw load ok", dev, flush=True)
    o = l.run([x]); torch.cuda.synchronize() if dev == "cuda" else None
    print("run ok", dev, o[0].shape, flush=True)
