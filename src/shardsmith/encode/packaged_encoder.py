"""An image VAE's encoder network compiled ahead of time, one AOTInductor package per input shape.

Contract
- :class:`PackagedEncoder` maps pixels ``[B, 3, H, W]`` (the VAE's dtype and device) to the posterior's moments
  ``[B, 2C, h, w]``: from the package of that shape in the compile cache (:mod:`~shardsmith.encode.aot_package`),
  or, where there is none yet, exported from the model (``net()``, built on demand) and compiled into it first.
  A package is loaded into the process only once a child process has loaded and run it (its verdict is kept
  beside it); a shape whose package does not load here runs the package's exported program (kept beside it)
  compiled by Inductor into an artifact (kept beside it, per device) instead, the manifest saying why
  (``unusable``, ``from_program``), in every build on that machine and torch (the verdict is kept): a later build
  there loads the artifact, with neither the model nor diffusers nor a trace.
  It runs only once ``active`` (set by :meth:`~shardsmith.encode.vae.VaeEncoder.compile`); eager batches go
  through diffusers as before.
- :func:`attach` gives a loaded VAE its packages (``models.compile`` not ``off``, a packaged family; used only
  where its weights can be identified), whose first build keeps the model's manifest block beside them.
- :func:`from_cache` makes a VAE without building its model, where the cache holds a package for every
  ``shapes`` (or, where packages do not load, its exported program) and the model's block: what a second
  compiled build on a machine loads (no diffusers import). None otherwise (the caller loads the model).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from shardsmith.encode import aot_package as aot

MODE = "aoti"  # (a package key's compile-mode part: COMPILE_MODE and Inductor's deterministic mode are added)


class _Moments(torch.nn.Module):
    """What is packaged: ``AutoencoderKL._encode`` without tiling (the encoder, then the quant conv if any)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.encoder, self.quant_conv = model.encoder, model.quant_conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return self.quant_conv(h) if self.quant_conv is not None else h


def _device_name(place: str) -> str:
    if torch.device(place).type == "cuda":
        return torch.cuda.get_device_name()
    try:  # a CPU package holds code for this CPU's vector instructions
        with open("/proc/cpuinfo") as fh:
            return "cpu:" + next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        import platform

        return "cpu:" + platform.processor()


class PackagedEncoder:
    """``model``: the model's key (:func:`~shardsmith.encode.aot_package.model_key`), or a function computing it
    when first needed (None: the model cannot be identified, and is not packaged: see :meth:`usable`).
    ``block``: the model's manifest block, kept beside its packages when one is built."""

    def __init__(self, cache: Path, model: str | Callable[[], str | None], place: str, net: Callable[[], Any],
                 options: dict[str, Any] | None = None, block: Callable[[], dict[str, Any]] | None = None) -> None:
        from shardsmith.encode import compile as cc

        self.cache, self._model, self.place, self.net, self.block = cache, model, place, net, block
        self.options = options  # Inductor's options of this torch's packages (kept beside them), None: not known
        self._device_name: str | None = None
        self.mode = f"{MODE}:{cc.COMPILE_MODE}:deterministic"
        self.active = False
        self.loaded: list[str] = []  # shapes whose package was in the cache
        self.built: list[str] = []  # shapes compiled into a package by this process
        self.seconds = 0.0  # loading and building packages
        self._runners: dict[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]] = {}
        self.unusable: dict[str, str] = {}  # shapes whose package does not load here, and why (torch.compile instead)
        self.programs: list[str] = []  # shapes run from their exported program, compiled (those unusable)
        self.artifacts_built: list[str] = []  # shapes whose program this process compiled into an Inductor artifact
        self.compiled_by: dict[str, str] = {}  # shapes whose program runs through torch.compile instead, and why
        self._exported: dict[tuple[int, ...], Any] = {}  # programs exported for a package this process built
        self._constants: dict[str, list[torch.Tensor]] = {}  # artifacts' constants on the device, shared by shapes

    @property
    def model(self) -> str | None:
        if callable(self._model):
            self._model = self._model()
        return self._model

    def usable(self) -> bool:
        return self.model is not None

    def path(self, shape: tuple[int, ...]) -> Path:
        if self._device_name is None:
            self._device_name = _device_name(self.place)
        return aot.package_path(self.cache, aot.package_key(self.model, tuple(shape), self._device_name, self.mode))

    def warm(self, shape: tuple[int, ...]) -> bool:
        """Whether this shape runs without the model (:meth:`cached`)."""
        return self.cached(shape) is not None

    def cached(self, shape: tuple[int, ...]) -> Path | None:
        """What this shape runs from without the model: its package, cached and verified to load here, or, where
        packages do not load here, the package's exported program (compiled with ``torch.compile``); None: neither."""
        path = self.path(shape)
        found = aot.verdict(path) if path.is_file() else None
        if found is not None and found.get("ok") is True:
            return path
        unusable = found is not None or aot.loader_broken(self.cache, self._device_name) is not None
        program = aot.program_path(path)
        return program if unusable and program.is_file() else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)  # the layout the packages are compiled for
        run = self._runners.get(tuple(x.shape))
        if run is None:
            run = self._runners[tuple(x.shape)] = self._runner(x)
        return run(x)

    def _runner(self, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """This shape's package, loaded (built and verified first where it is not in the cache). Where it does not
        load here (its verdict, kept beside it, or the machine's: :func:`~shardsmith.encode.aot_package.loader_broken`,
        in which case no package is compiled), the package's exported program compiled with ``torch.compile``
        instead. Builds of one package are serialised across processes: one that waited finds it built."""
        t = time.perf_counter()
        shape = tuple(x.shape)
        path = self.path(shape)
        name = "x".join(map(str, shape))
        cached = path.is_file()
        found = aot.verdict(path) if cached else None
        broken = aot.loader_broken(self.cache, self._device_name) if found is None else None
        if broken is None and found is None:
            with aot.build_lock(path):
                cached = path.is_file()  # (another process may have built it while this one waited)
                if not cached:  # (its program is kept only if the package does not load: _from_program)
                    self._exported[shape] = self._build(path, shape, x, package=True)
                    self.built.append(name)
                found = aot.verdict(path) or aot.verify(path, shape, x.dtype, x.device,
                                                        loader=aot.loader_path(self.cache, self._device_name))
        if found is not None and found["ok"]:
            self._exported.pop(shape, None)
            run = aot.load(path, x.device)
            if cached:
                self.loaded.append(name)
        else:
            self.unusable[name] = broken or found["why"]
            run = self._from_program(path, shape, x)
        self.seconds += time.perf_counter() - t
        return run

    def _build(self, path: Path, shape: tuple[int, ...], x: torch.Tensor, package: bool):
        """Export the network at ``shape``; with ``package``, compile that into the package ``path``, else keep the
        exported program beside it. Keeps the model's block beside them; returns the exported program."""
        from shardsmith.encode import compile as cc

        cc.use_cache_dir()  # (Inductor's own caches, beside the packages)
        self.options = cc.inductor_options()
        with torch.inference_mode(False):
            example = torch.zeros(shape, dtype=x.dtype, device=x.device).contiguous(memory_format=torch.channels_last)
            exported = aot.export(_Moments(self.net()), example)
            if package:
                aot.build(exported, path, self.options)
            else:
                aot.save_program(exported, aot.program_path(path))
        aot.write_meta(self.cache, self.model, {**(self.block() if self.block is not None else {}),
                                                "options": {"torch": torch.__version__, **self.options}})
        return exported

    def _from_program(self, path: Path, shape: tuple[int, ...], x: torch.Tensor) -> Callable:
        """Where packages do not load: the package's exported program (exported first where it is not cached),
        compiled by Inductor ahead of the build into an artifact kept beside it for this device
        (:func:`~shardsmith.encode.aot_package.build_artifact`), which every later build on the machine loads without
        the model and without tracing: the same kernels and bytes in every build. A new artifact is loaded and run
        once by a child process first (:func:`~shardsmith.encode.aot_package.verify_artifact`: a crash is the
        child's). A torch without Inductor's artifacts, or an artifact that failed to compile, verify, load or run
        here (kept beside it:
        :func:`~shardsmith.encode.aot_package.artifact_failed`), compiles the program with ``torch.compile`` in
        every build instead, the manifest saying why (``program_compiled_by``)."""
        from shardsmith.encode import compile as cc

        from shardsmith.encode import coordesc_cache

        program = aot.program_path(path)
        exported = self._exported.pop(shape, None)  # (exported by this process for the package)
        artifacts = aot.artifacts_supported()
        artifact = aot.artifact_path(path, x.device)
        cc.use_cache_dir()
        coordesc_cache.keep()  # (the Triton kernels' tuning reused from the cache, not redone)
        with aot.build_lock(path):  # (another process may keep it while this one waits)
            if not program.is_file():
                if exported is not None:
                    aot.save_program(exported, program)
                else:
                    exported = self._build(path, shape, x, package=False)
        self.options = self.options or cc.inductor_options()
        name = "x".join(map(str, shape))
        self.programs.append(name)
        failed = None if artifacts else "this torch has no Inductor artifacts"
        if failed is None:
            with aot.build_lock(artifact):  # (per device: --gpus workers compile theirs at once)
                failed = aot.artifact_failed(artifact)  # (read under the lock: one that waited finds the verdict)
                if failed is None:
                    try:
                        if not aot.artifact_complete(artifact):
                            aot.build_artifact(exported if exported is not None else aot.load_exported(program), x,
                                               artifact, self.options)
                            self.artifacts_built.append(name)
                        if not aot.artifact_verified(artifact):  # (a child loads and runs it first: a crash there
                            failed = aot.verify_artifact(artifact, shape, x.dtype, x.device)  # is not the build's)
                        if failed is None:
                            return self._first_call_checked(aot.load_artifact(artifact, x.device, self._constants),
                                                            artifact, program, shape)
                    except Exception as exc:  # noqa: BLE001 (kept beside it, named in the manifest; torch.compile)
                        self._constants.clear()  # (a copy no runner holds)
                        failed = aot.mark_artifact_failed(artifact, exc)
        return self._torch_compiled(program, name, failed, x.device)

    def _torch_compiled(self, program: Path, name: str, why: str, device: torch.device) -> Callable:
        """The exported program at ``program`` compiled with ``torch.compile`` (``why``: no artifact, in the
        manifest)."""
        self.compiled_by[name] = f"torch.compile ({why})"
        module = aot.load_program(program).to(device)
        return torch.compile(module, backend="inductor", dynamic=False, options=dict(self.options))

    def _first_call_checked(self, run: Callable, artifact: Path, program: Path, shape: tuple[int, ...]) -> Callable:
        """``run`` (a loaded artifact), whose first call is checked: an artifact that loads but fails when it runs
        is kept as failed (:func:`~shardsmith.encode.aot_package.mark_artifact_failed`) and this shape compiles its
        program with ``torch.compile`` instead, in this build and every later one. Raised as it is: a failure that
        may pass (:func:`~shardsmith.encode.aot_package.passing`), and one after which the device does not run a
        kernel (a CUDA error is sticky, and may be an earlier kernel's, reported late: the artifact is not blamed)."""
        name = "x".join(map(str, shape))

        def first(x: torch.Tensor) -> torch.Tensor:
            try:
                y = run(x)
            except Exception as exc:  # noqa: BLE001 (kept beside it, named in the manifest; torch.compile)
                if aot.passing(exc) or not _device_works(x.device):
                    raise
                self._constants.clear()  # (a copy no runner holds)
                with aot.build_lock(artifact):
                    failed = aot.mark_artifact_failed(artifact, exc)
                fallback = self._runners[shape] = self._torch_compiled(program, name, failed, x.device)
                return fallback(x)
            self._runners[shape] = run
            return y

        return first

    def close(self) -> None:
        """Drop the loaded packages: each loader removes the folder it unpacked its package into (a process that
        ends without this leaves it in the temporary folder)."""
        self._runners.clear()
        self._constants.clear()

    def deterministic(self) -> bool:
        """Whether the packages are compiled in Inductor's deterministic mode (the same bytes in every process)."""
        if self.options is None:
            from shardsmith.encode import compile as cc

            self.options = cc.inductor_options()
        return bool(self.options.get("deterministic"))

    def describe(self) -> dict[str, Any]:
        out = {"packages": str(aot.package_dir(self.cache)), "loaded": list(self.loaded), "built": list(self.built),
               "package_s": round(self.seconds, 3)}
        if self.unusable:
            out["unusable"] = dict(self.unusable)
            out["from_program"] = list(self.programs)  # (the exported program, kept beside, compiled)
            out["program_compiled_by"] = {n: self.compiled_by.get(n, "inductor-artifact") for n in self.programs}
            out["artifacts_built"] = list(self.artifacts_built)
        return out


def _identity(recipe, place: str, provenance=None) -> str | None:
    """The model's key (``provenance``: a loaded model's, whose weights' hash is not computed again)."""
    if not _applies(recipe):
        return None
    hashed = (provenance.weights_sha256, provenance.revision) if provenance is not None and \
        provenance.weights == "pretrained" else None
    return aot.model_key(recipe.models.vae, torch.device(place).type, hashed)


def _device_works(device: torch.device) -> bool:
    """Whether ``device`` still runs a kernel and synchronises (after a CUDA error it does not)."""
    if device.type != "cuda":
        return True
    try:
        (torch.ones(1, device=device) + 1).item()
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 (the answer is no)
        return False
    return True


def _applies(recipe) -> bool:
    return recipe.models.compile != "off" and aot.packaged(recipe.models.vae.family)


def attach(vae, recipe, place: str) -> None:
    """Give ``vae`` (loaded from ``recipe.models.vae`` onto ``place``) its packages, where they apply (nothing is
    computed or written until a compile asks for them)."""
    if not _applies(recipe):
        return
    from shardsmith.encode import compile as cc
    from shardsmith.encode.memory_plan import param_bytes

    def block() -> dict[str, Any]:
        return {"spec": vae.spec.to_dict(), "provenance": vae.provenance.to_dict(),
                "weight_bytes": param_bytes(vae.net())}

    vae.packages = PackagedEncoder(cc.cache_dir(), lambda: _identity(recipe, place, vae.provenance), place,
                                   lambda: vae.net(),
                                   block=block)


def from_cache(recipe, place: str, shapes: list[tuple[int, ...]], build: Callable[[], Any]):
    """A :class:`~shardsmith.encode.vae.VaeEncoder` of ``recipe.models.vae`` whose model is not built (``build``
    builds the loaded VAE when something needs the model), where the cache holds every package of ``shapes``;
    else None."""
    model = _identity(recipe, place)
    if model is None or not shapes:
        return None
    from shardsmith.encode import compile as cc
    from shardsmith.encode.spec import EncoderSpec, Provenance
    from shardsmith.encode.vae import VaeEncoder

    cache = cc.cache_dir()
    meta = aot.read_meta(cache, model)
    if meta is None or "spec" not in meta:
        return None
    vae = VaeEncoder(spec=EncoderSpec(**meta["spec"]), provenance=Provenance(**meta["provenance"]), model=None,
                     place=place, build_model=lambda: build().model, weight_bytes=meta["weight_bytes"])
    kept = meta.get("options") or {}
    options = {k: v for k, v in kept.items() if k != "torch"} if kept.get("torch") == torch.__version__ else None
    vae.packages = PackagedEncoder(cache, model, place, vae.net, options)
    if not all(vae.packages.warm(s) for s in shapes):
        return None
    return vae
