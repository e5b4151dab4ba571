"""Compiled image-VAE encoders kept as AOTInductor packages in the user's compile cache.

A compiled image VAE (``models.compile`` on, or ``auto`` deciding so) runs its encoder network (the encoder and
its quant conv: the posterior's moments) from an AOTInductor package, one per input shape, kept under
``compile.cache_dir()/aot``. The first build of a (model, shape, dtype, torch, GPU) exports and compiles the
package; every later build on that machine loads it: without importing diffusers, without building the model
and without tracing it. Every build that runs a package runs the same kernels, so a resumed, a second or
another GPU's build writes the same bytes.

Contract
- :func:`packaged` says whether a VAE family runs from packages (the ``AutoencoderKL`` families: ``sd``,
  ``sdxl``, ``flux``); the others compile with ``torch.compile`` as before.
- :func:`model_key` identifies a model without building it, from the recipe's ``models.vae`` alone: family,
  config (name or dict), dtype, store, and for pretrained weights the sha256 of the weight files and of
  ``config.json`` (None where those files cannot be found: such a model is not packaged).
- :func:`package_key` adds the input shape (batch included: a package's shapes are fixed), torch's version,
  the GPU and the compile mode.
- :func:`export` exports the network on an example input; :func:`build` compiles that into the package ``path``
  (written beside and renamed in: a package is whole or absent); :func:`save_program` keeps the exported program
  beside it (:func:`program_path`) and :func:`load_program` reads it back: what a machine whose loader does not work
  compiles with ``torch.compile``, without diffusers or the model; :func:`verify` loads and runs a package once in a
  child process and keeps the verdict beside it (:func:`verdict`): only a verified package is loaded into a build's
  process, so a torch whose loader crashes costs a child, not the build. A child that dies of a signal also marks
  the machine's loader (this torch on this device) broken (:func:`loader_broken`): later models and shapes are not
  compiled into packages there at all. :func:`build_lock` serialises the builds of one package across processes (two
  GPUs' workers starting cold compile it once); :func:`load` loads one onto the current device; :func:`write_meta` /
  :func:`read_meta` keep the model's manifest block beside its packages (what a build that loads a package reports
  without the model).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from shardsmith.atomic import atomic_open, atomic_write_json

PACKAGED_FAMILIES = ("sd", "sdxl", "flux")  # AutoencoderKL: encoder + quant conv -> a diagonal Gaussian's moments
SUFFIX = ".pt2"
PROGRAM_SUFFIX = ".program.pt2"  # (torch.export.load wants .pt2; a package is `<key>.pt2`)
ARTIFACT_SUFFIX = ".inductor.bin"  # a program compiled by Inductor ahead of the build (one per device index)


def packaged(family: str) -> bool:
    return family in PACKAGED_FAMILIES


def package_dir(cache: Path) -> Path:
    return cache / "aot"


def _sha(blob: str) -> str:
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def model_key(vae, device_type: str, hashed: tuple[str | None, str | None] | None = None) -> str | None:
    """The identity of ``models.vae`` (a recipe's :class:`~shardsmith.recipe.VaeModel`) as a package's key part,
    computed without the model; None where its pretrained files cannot be found (not packaged). ``hashed``: the
    pretrained weights' ``(sha256, resolved revision)`` where a loaded model's provenance already holds them (as
    :func:`~shardsmith.encode.spec.hash_pretrained` gives them: not read again)."""
    from importlib.metadata import version

    from shardsmith.encode.spec import hash_pretrained, resolve_model_folder

    parts: dict[str, Any] = {"family": vae.family, "dtype": vae.dtype, "store": vae.store,
                             "diffusers": version("diffusers")}  # (its classes build and initialise the model)
    if vae.pretrained is None:
        parts.update(config=vae.config, weights="random-weights", init_device=device_type)
    else:
        sha, resolved = hashed or hash_pretrained(str(vae.pretrained), vae.subfolder, vae.revision)[::2]
        folder, _, _ = resolve_model_folder(str(vae.pretrained), vae.subfolder, vae.revision)
        cfg = folder / "config.json" if folder is not None else None
        if sha is None or cfg is None or not cfg.is_file():
            return None
        parts.update(weights_sha256=sha, config_sha256=hashlib.sha256(cfg.read_bytes()).hexdigest(),
                     revision=resolved)
    return _sha(json.dumps(parts, sort_keys=True, default=str))


def package_key(model: str, shape: tuple[int, ...], device_name: str, mode: str) -> str:
    return _sha(json.dumps([model, list(shape), torch.__version__, device_name, mode], sort_keys=True))


def packages(cache: Path) -> list[Path]:
    """The packages kept in ``cache`` (not their exported programs), by name."""
    return sorted(p for p in package_dir(cache).glob(f"*{SUFFIX}") if not p.name.endswith(PROGRAM_SUFFIX))


def package_path(cache: Path, key: str) -> Path:
    return package_dir(cache) / f"{key}{SUFFIX}"


def write_meta(cache: Path, model: str, block: dict[str, Any]) -> None:
    """Keep (update) a model's block beside its packages: its manifest block (spec, provenance, parameter
    bytes) and the options its packages were compiled with."""
    d = package_dir(cache)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_json(d / f"{model}.json", {**(read_meta(cache, model) or {}), **block})


def read_meta(cache: Path, model: str) -> dict[str, Any] | None:
    try:
        return json.loads((package_dir(cache) / f"{model}.json").read_text())
    except (OSError, ValueError):
        return None


def loader_path(cache: Path, device_name: str) -> Path:
    """Where the verdict on this torch's package loader on ``device_name`` is kept (written only when it crashed)."""
    return package_dir(cache) / f"loader-{_sha(json.dumps([torch.__version__, device_name]))}.json"


def loader_broken(cache: Path, device_name: str) -> str | None:
    """Why packages do not load on this machine (this torch, ``device_name``), None where none has crashed here."""
    path = loader_path(cache, device_name)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return (f"{found['why']}; packages are not built on this machine since ({path} holds that verdict: delete it "
            "to try again, e.g. after a driver update)")


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold the lock on building the package ``path`` (an advisory lock on a file beside it, released when the
    block ends or the process dies): a second process wanting the same package waits, then finds it built."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.stem}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def export(module: torch.nn.Module, example: torch.Tensor):
    """``module`` exported on ``example`` (fixed shapes and strides): an ``ExportedProgram``."""
    with torch.no_grad():
        return torch.export.export(module, (example,))


def build(exported, path: Path, options: dict[str, Any]) -> Path:
    """Compile the exported program ``exported`` (:func:`export`) into the package ``path``."""
    from torch._inductor import aoti_compile_and_package

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{SUFFIX}")
    try:
        with warnings.catch_warnings():  # (torch's own deprecation notices about its pytree, not the user's doing)
            warnings.simplefilter("ignore", FutureWarning)
            aoti_compile_and_package(exported, package_path=str(tmp), inductor_configs=dict(options))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def program_path(package: Path) -> Path:
    """Where the exported program of the package ``package`` is kept: what a machine whose package loader does not
    work compiles with ``torch.compile`` instead (without diffusers or the model)."""
    return package.with_suffix(PROGRAM_SUFFIX)


def save_program(exported, path: Path) -> Path:
    """Keep the exported program at ``path`` (written beside and renamed in)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{SUFFIX}")  # (torch.export wants the suffix)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.export.save(exported, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_exported(path: Path):
    """The exported program kept at ``path`` (:func:`save_program`): an ``ExportedProgram``, its weights ordinary
    tensors even where the caller runs in inference mode (an encoder's call does: its inference tensors could not
    be traced again, by :func:`build_artifact`)."""
    with warnings.catch_warnings(), torch.inference_mode(False):
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.load(str(path))


def load_program(path: Path) -> torch.nn.Module:
    """The exported program at ``path`` as a module (its ATen graph, run by torch; compiled by the caller)."""
    exported = load_exported(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return exported.module()


def artifact_path(package: Path, device: torch.device) -> Path:
    """Where the package's exported program compiled by Inductor for ``device`` is kept (its constants beside it,
    :func:`constants_path`): what a machine whose package loader does not work runs. Per device index: Inductor's
    code names the GPU it was compiled on."""
    where = f"cuda{_device_index(device)}" if device.type == "cuda" else device.type
    return package.with_name(f"{package.name[:-len(SUFFIX)]}.{where}{ARTIFACT_SUFFIX}")


def constants_path(artifact: Path) -> Path:
    """What the artifact's constants are: ``{"at": the pixels' place among the graph's inputs, "file": the name
    of the constants' file}`` (:func:`shared_constants`, in the same folder). Before constants were shared, the
    constants themselves, with ``at``, were kept here under the same stem (``.constants.pt``: still read)."""
    return artifact.with_name(artifact.name[:-len(ARTIFACT_SUFFIX)] + ".constants.json")


def _beside(artifact: Path, verdict: str) -> Path:
    """Where the artifact's ``verdict`` (``verified``, ``failed``) is kept: beside it, named after it."""
    return artifact.with_name(f"{artifact.name}.{verdict}.json")


def shared_constants(folder: Path, constants: list[torch.Tensor]) -> Path:
    """Where ``constants`` (a program's weights) are kept in ``folder``: named by their content (dtypes, shapes,
    strides, bytes), so that the artifacts of every shape of one model share one file, and one copy in memory
    (:func:`load_artifact`'s ``loaded``)."""
    h = hashlib.sha256()
    for t in constants:
        h.update(repr((str(t.dtype), tuple(t.shape), t.stride())).encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b"")
    return folder / f"constants-{h.hexdigest()[:24]}.pt"


def artifacts_supported() -> bool:
    """Whether this torch compiles and loads Inductor artifacts (``torch._inductor.standalone_compile``)."""
    import torch._inductor

    return hasattr(torch._inductor, "standalone_compile") and hasattr(torch._inductor, "CompiledArtifact")


def build_artifact(exported, example: torch.Tensor, path: Path, options: dict[str, Any]) -> Path:
    """Compile the exported program ``exported`` (:func:`export`, on ``example``'s device, shape and strides) with
    Inductor ahead of the build into ``path`` (:func:`artifact_path`), its constants beside it (:func:`constants_path`,
    :func:`shared_constants`; each written beside and renamed in, the artifact last). The program's weights become
    inputs of the compiled graph, in its signature's order."""
    import torch._inductor.config
    from torch._inductor import standalone_compile

    with torch.inference_mode(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = exported.run_decompositions()
        state = {**program.state_dict, **dict(program.constants)}
        specs = program.graph_signature.input_specs
        user = [i for i, spec in enumerate(specs) if spec.target is None]
        if len(user) != 1:
            raise ValueError(f"the exported program takes {len(user)} inputs; one (the pixels) was expected")
        constants = [state[spec.target].detach().to(example.device) for spec in specs if spec.target is not None]
        inputs = [*constants[:user[0]], torch.zeros_like(example), *constants[user[0]:]]
        with torch._inductor.config.patch(dict(options)):  # (its ``options`` are compile_fx's keywords, not these)
            compiled = standalone_compile(program.graph_module, inputs, dynamic_shapes="from_example_inputs")
    _beside(path, "verified").unlink(missing_ok=True)  # (an artifact built again is verified again)
    shared = shared_constants(path.parent, constants)
    if not shared.is_file():  # (another shape's artifact may have kept them)
        with atomic_open(shared) as fh:
            torch.save(constants, fh)
    atomic_write_json(constants_path(path), {"at": user[0], "file": shared.name})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # (the artifact is saved by path)
    try:
        compiled.save(path=str(tmp), format="binary")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def artifact_failed(path: Path) -> str | None:
    """Why the artifact ``path`` failed to compile or load on this machine (kept by :func:`mark_artifact_failed`),
    None where it has not."""
    try:
        return json.loads(_beside(path, "failed").read_text())["why"]
    except (OSError, ValueError, KeyError):
        return None


def passing(exc: BaseException) -> bool:
    """Whether a failure may pass: out of memory (torch's, or Triton's loading its kernels, a ``RuntimeError``) or
    a file system error."""
    return isinstance(exc, (torch.OutOfMemoryError, OSError)) or "out of memory" in str(exc).lower()


def artifact_complete(path: Path) -> bool:
    """Whether the artifact ``path`` is kept with its constants (a cache cleaned by hand may have lost the shared
    file or the reference to it: the artifact is then built again)."""
    if not path.is_file():
        return False
    ref = constants_path(path)
    if not ref.is_file():
        return ref.with_suffix(".pt").is_file()  # (kept before constants were shared)
    try:
        return (path.parent / json.loads(ref.read_text())["file"]).is_file()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def mark_artifact_failed(path: Path, exc: BaseException) -> str:
    """Keep beside ``path`` why its artifact failed (later builds on the machine go to ``torch.compile`` at once:
    delete the file to try again); returns the reason, naming that file. A failure that may pass (out of memory,
    a file system error) is not kept: the next build tries again."""
    why = f"the Inductor artifact failed here ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if passing(exc):
        return f"{why}; the next build tries again"
    marker = _beside(path, "failed")
    atomic_write_json(marker, {"why": f"{why}; {marker} keeps that verdict: delete it to try again"})
    return artifact_failed(path) or why


_VERIFY_ARTIFACT = """
import sys, torch
from pathlib import Path
from shardsmith.encode.aot_package import load_artifact
path, shape, dtype, device = Path(sys.argv[1]), [int(v) for v in sys.argv[2].split(",")], sys.argv[3], sys.argv[4]
x = torch.zeros(shape, dtype=getattr(torch, dtype), device=device).contiguous(memory_format=torch.channels_last)
with torch.inference_mode():
    out = load_artifact(path, torch.device(device))(x)
if device != "cpu":
    torch.cuda.synchronize()
assert torch.isfinite(out.float()).all().item(), "non-finite moments on zeros"
"""


def artifact_verified(path: Path) -> bool:
    """Whether a child process loaded and ran the artifact ``path`` (:func:`verify_artifact`)."""
    return _beside(path, "verified").is_file()


def verify_artifact(path: Path, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                    timeout_s: float = 300.0) -> str | None:
    """Load the artifact ``path`` and run it once on zeros in a child process (a crash there is not the build's);
    keep the verdict beside it: None where it ran (later builds load it at once), else why not (kept as
    :func:`mark_artifact_failed` keeps it: a failure that may pass is tried again by the next build)."""
    import subprocess
    import sys

    where = f"cuda:{_device_index(device)}" if device.type == "cuda" else "cpu"
    argv = [sys.executable, "-c", _VERIFY_ARTIFACT, str(path), ",".join(map(str, shape)), str(dtype).split(".")[-1],
            where]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # (this process's shardsmith)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        if r.returncode == 0:
            atomic_write_json(_beside(path, "verified"), {"ok": True, "torch": torch.__version__})
            return None
        last = (r.stderr.strip().splitlines() or [""])[-1]
        exc: BaseException = RuntimeError(f"a child loading and running it died of signal {-r.returncode}"
                                          if r.returncode < 0 else f"a child loading and running it: {last}")
    except subprocess.TimeoutExpired:
        exc = RuntimeError(f"a child loading and running it gave no answer in {timeout_s:.0f} s")
    return mark_artifact_failed(path, exc)


def load_artifact(path: Path, device: torch.device,
                  loaded: dict[str, list[torch.Tensor]] | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The Inductor artifact at ``path`` (:func:`build_artifact`) with its constants on ``device``, as a function of
    the pixels: no model, no trace. ``loaded``: constants already on ``device`` by file name, shared by the
    artifacts of one model's shapes (read once, one copy in memory); filled here."""
    from torch._inductor import CompiledArtifact

    from shardsmith.encode import coordesc_cache

    coordesc_cache.keep()  # (its Triton kernels' tuning reused from Inductor's cache, not done again)
    ref = constants_path(path)
    if ref.is_file():
        kept = json.loads(ref.read_text())
        at, name = kept["at"], kept["file"]
        constants = (loaded or {}).get(name)
        if constants is None:
            constants = torch.load(path.parent / name, map_location=device, weights_only=True)
            if loaded is not None:
                loaded[name] = constants
    else:  # (kept before constants were shared: beside the artifact, with their place)
        saved = torch.load(ref.with_suffix(".pt"), map_location=device, weights_only=True)
        constants, at = saved["constants"], saved["at"]
    compiled = CompiledArtifact.load(path=str(path), format="binary")
    return lambda x: compiled(*constants[:at], x, *constants[at:])[0]


_VERIFY = """
import sys, torch
path, shape, dtype, index = sys.argv[1], [int(v) for v in sys.argv[2].split(",")], sys.argv[3], int(sys.argv[4])
x = torch.zeros(shape, dtype=getattr(torch, dtype), device="cpu" if index < 0 else f"cuda:{index}")
loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index)
out = loader.run([x.contiguous(memory_format=torch.channels_last)])[0]
if index >= 0:
    torch.cuda.synchronize()
assert torch.isfinite(out.float()).all().item(), "non-finite moments on zeros"
"""


def _device_index(device: torch.device) -> int:
    """The package loader's device argument: the CUDA device's index, -1 for the CPU."""
    if device.type != "cuda":
        return -1
    return device.index if device.index is not None else torch.cuda.current_device()


def verdict(path: Path) -> dict[str, Any] | None:
    """What :func:`verify` found of the package at ``path`` (``{"ok": bool, "why": str}``), None: not yet verified."""
    try:
        return json.loads(path.with_suffix(".verified.json").read_text())
    except (OSError, ValueError):
        return None


def verify(path: Path, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
           timeout_s: float = 300.0, loader: Path | None = None) -> dict[str, Any]:
    """Load the package at ``path`` and run it once on zeros in a child process, and keep the verdict beside it:
    a torch whose package loader crashes (the leased H100s' torch 2.11 died of a segmentation fault) then
    fails in the child, not in the build. A child killed by a signal also writes the verdict to ``loader`` (see
    :func:`loader_path`). Returns the verdict (:func:`verdict`)."""
    import subprocess
    import sys

    argv = [sys.executable, "-c", _VERIFY, str(path), ",".join(map(str, shape)), str(dtype).split(".")[-1],
            str(_device_index(device))]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        ok = r.returncode == 0
        why = "loaded and ran" if ok else (f"died of signal {-r.returncode}" if r.returncode < 0 else
                                           f"exit code {r.returncode}: " + (r.stderr.strip().splitlines() or [""])[-1])
    except subprocess.TimeoutExpired:
        ok, why = False, f"no answer in {timeout_s:.0f} s"
    found = {"ok": ok, "why": f"torch {torch.__version__}: the package {why}"}
    atomic_write_json(path.with_suffix(".verified.json"), found)
    if loader is not None and why.startswith("died of signal"):
        atomic_write_json(loader, {**found, "package": path.name})
    return found


def load(path: Path, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """The package at ``path`` (compiled for ``device``) as a function of one input tensor. Loaded by torch's
    package loader itself (which does not import Inductor and Dynamo: seconds of imports), else through
    ``torch._inductor.aoti_load_package``."""
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, _device_index(device))
    except (AttributeError, TypeError):  # another torch's signature: its public loader
        from torch._inductor import aoti_load_package

        compiled = aoti_load_package(str(path))
        return lambda x: compiled(x)
    return lambda x: loader.run([x])[0]
