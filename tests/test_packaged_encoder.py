"""A compiled image VAE runs its encoder network from AOTInductor packages kept in the compile cache: the first
build compiles the package, a second build on the machine loads it without building the model (no diffusers
import, no trace) and writes the same bytes. On the CPU (Inductor's C++ backend); ``tests/test_compile_cuda.py``
checks the same on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from media_factory import real_photos
from shardsmith.atomic import atomic_write_json
from shardsmith.encode import aot_package, packaged_encoder, posterior
from shardsmith.encode import compile as cc
from shardsmith.recipe import recipe_from_dict
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SRC = Path(__file__).resolve().parents[1] / "src"


def _recipe(photos, compile: str = "on", device: str = "cpu") -> dict:
    return {"sources": [{"path": str(photos)}], "geometry": {"buckets": ["32x32x1"]},
            "images": {"upscale": True}, "split": {"holdout": 0},
            "models": {"vae": {"family": "sd"}, "batch_size": 3, "compile": compile, "device": device},
            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_posterior_is_diffusers_to_the_bit(dtype):
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    moments = (torch.randn(3, 8, 5, 7, generator=torch.Generator().manual_seed(1)) * 30).to(dtype)
    theirs = DiagonalGaussianDistribution(moments)
    mean, std = posterior.mean_std(moments)
    assert torch.equal(mean, theirs.mean) and torch.equal(std, theirs.std)
    ours = posterior.sample(moments, torch.Generator().manual_seed(7))
    assert ours.dtype == dtype and torch.equal(ours, theirs.sample(torch.Generator().manual_seed(7)))


def test_the_cache_is_ours_where_torch_set_its_temporary_default(tmp_path, monkeypatch):
    # importing diffusers with torchao installed makes Inductor put its default (a temporary folder) into the
    # variable; before, the compile cache then went there instead of the user's cache folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", cc._torch_default_dir())
    assert cc.cache_dir() == tmp_path / "shardsmith" / "inductor"
    assert cc.use_cache_dir() == tmp_path / "shardsmith" / "inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "shardsmith" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own: kept
    assert cc.cache_dir() == tmp_path / "mine"


def test_a_vae_is_made_from_the_cache_only_with_every_shape_packaged(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    recipe = recipe_from_dict(_recipe(tmp_path))
    model = aot_package.model_key(recipe.models.vae, "cpu")
    built = []
    assert packaged_encoder.from_cache(recipe, "cpu", [(3, 3, 32, 32)], built.append) is None  # nothing kept
    aot_package.write_meta(tmp_path, model, {"spec": {"kind": "image_vae", "family": "sd", "latent_channels": 4,
                                                      "spatial": 8, "temporal": 1, "store": "mean"},
                                             "provenance": {"cls": "AutoencoderKL", "weights": "random-weights"},
                                             "weight_bytes": 1234})
    enc = packaged_encoder.PackagedEncoder(tmp_path, model, "cpu", built.append)
    enc.path((3, 3, 32, 32)).parent.mkdir(parents=True, exist_ok=True)
    enc.path((3, 3, 32, 32)).write_bytes(b"")
    assert packaged_encoder.from_cache(recipe, "cpu", [(3, 3, 32, 32)], built.append) is None  # not verified
    enc.path((3, 3, 32, 32)).with_suffix(".verified.json").write_text('{"ok": false, "why": "died"}')
    assert packaged_encoder.from_cache(recipe, "cpu", [(3, 3, 32, 32)], built.append) is None  # does not load
    enc.path((3, 3, 32, 32)).with_suffix(".verified.json").write_text('{"ok": true, "why": "loaded and ran"}')
    assert packaged_encoder.from_cache(recipe, "cpu", [(3, 3, 32, 32), (3, 3, 64, 32)], built.append) is None
    vae = packaged_encoder.from_cache(recipe, "cpu", [(3, 3, 32, 32)], built.append)
    assert vae.model is None and vae.weight_bytes == 1234 and vae.spec.latent_channels == 4 and not built
    assert vae.device == torch.device("cpu") and vae.provenance.is_random
    # off, or a family that compiles with torch.compile: never from packages
    assert packaged_encoder.from_cache(recipe_from_dict(_recipe(tmp_path, compile="off")), "cpu",
                                       [(3, 3, 32, 32)], built.append) is None
    video = _recipe(tmp_path)
    video["models"]["vae"] = {"family": "ltx"}
    assert aot_package.packaged("sd") and not aot_package.packaged("ltx")
    assert packaged_encoder.from_cache(recipe_from_dict(video), "cpu", [(3, 3, 32, 32)], built.append) is None


BUILD = """
import json, sys
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
m = build(recipe_from_dict(json.loads(sys.argv[1])), sys.argv[2], quiet=True, workers=1)
traces = sys.modules["torch._dynamo.utils"].counters["stats"]["unique_graphs"] if "torch._dynamo.utils" in sys.modules else 0
print(json.dumps({"compile": m["models"]["compile"], "diffusers": "diffusers" in sys.modules,
                  "dynamo": "torch._dynamo" in sys.modules, "traces": traces, "written": m["counts"]["written"]}))
"""


def _latents(shards: Path) -> dict[str, torch.Tensor]:
    import io
    import tarfile

    out = {}
    for tar in sorted(shards.glob("*.tar")):
        with tarfile.open(tar) as tf:
            for member in tf.getmembers():
                if member.name.endswith(".pth"):
                    out[member.name] = torch.load(io.BytesIO(tf.extractfile(member).read()), weights_only=True)
    return out


def _build(recipe: dict, out: Path, cache: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", BUILD, json.dumps(recipe), str(out)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_compiled_build_loads_the_package_without_the_model(tmp_path):
    real_photos(tmp_path / "p", 7, seed=5, min_side=40, max_side=90)
    cache = tmp_path / "cache"
    first = _build(_recipe(tmp_path / "p"), tmp_path / "a", cache)
    c = first["compile"]
    assert (c["backend"], c["compiled"], c["warm_cache"], c["built"], c["loaded"], c["model_built"]) == (
        "aot_inductor", True, False, ["3x3x32x32"], [], True)
    assert len(aot_package.packages(cache)) == 1 and c["deterministic"] is True
    second = _build(_recipe(tmp_path / "p"), tmp_path / "b", cache)
    c = second["compile"]
    assert (c["compiled"], c["warm_cache"], c["built"], c["loaded"], c["model_built"]) == (
        True, True, [], ["3x3x32x32"], False)
    assert second["diffusers"] is False and second["dynamo"] is False and second["written"] == 7
    assert tree_bytes(tmp_path / "b") == tree_bytes(tmp_path / "a")
    # through the CLI (which ends its process at once): the folder each package is unpacked into is removed
    (tmp_path / "r.yaml").write_text(json.dumps(_recipe(tmp_path / "p")))
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(tmp_path / "r.yaml"), "--out",
                        str(tmp_path / "cli"), "-q", "--no-report"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert tree_bytes(tmp_path / "cli") == tree_bytes(tmp_path / "a")
    assert not list((tmp_path / "tmp").glob("aotinductor_*"))  # before: one left per build
    # the packaged encoder computes what the eager one does, to the compiler's rounding
    eager = _build(_recipe(tmp_path / "p", compile="off"), tmp_path / "e", cache)
    assert eager["compile"]["compiled"] is False and eager["diffusers"] is True
    ours, theirs = _latents(tmp_path / "a" / "lat"), _latents(tmp_path / "e" / "lat")
    assert ours.keys() == theirs.keys() and len(ours) == 7
    for k in ours:
        assert ours[k].shape == theirs[k].shape == (4, 4, 4) and ours[k].dtype == torch.float32
        torch.testing.assert_close(ours[k], theirs[k], atol=1e-4, rtol=1e-4)


def _traces() -> int:
    """Graphs Dynamo has traced in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_a_package_that_does_not_load_here_runs_its_program_compiled_ahead_instead(tmp_path, monkeypatch):
    # torch 2.11's CUDA package loader died of a segmentation fault on an H100: only a package that a child process
    # loaded and ran is loaded into the build; here the child dies the same way. The build compiles the package's
    # exported program (kept beside it) with Inductor into an artifact (kept beside it) instead, so a later build
    # needs no model there either, and no trace
    from shardsmith.build import build

    monkeypatch.setattr(aot_package, "_VERIFY", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    real_photos(tmp_path / "p", 5, seed=9, min_side=40, max_side=90)
    why = f"torch {torch.__version__}: the package died of signal 11"
    traced = _traces()
    m = build(recipe_from_dict(_recipe(tmp_path / "p")), tmp_path / "a", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert (c["compiled"], c["built"], c["loaded"], c["unusable"], c["from_program"], c["model_built"]) == (
        True, ["3x3x32x32"], [], {"3x3x32x32": why}, ["3x3x32x32"], True)
    assert (c["program_compiled_by"], c["artifacts_built"]) == ({"3x3x32x32": "inductor-artifact"}, ["3x3x32x32"])
    assert c["coordesc_cache"]["kernels_tuned"] == 0  # (a CPU build: no Triton kernel is tuned)
    assert {"_coordinate_descent_tuning", "populate_cache"} <= set(c["coordesc_cache"]["mended"])
    assert m["counts"]["written"] == 5
    package, = aot_package.packages(tmp_path / "cache")
    assert aot_package.verdict(package) == {"ok": False, "why": why}
    assert aot_package.program_path(package).is_file()
    artifact = aot_package.artifact_path(package, torch.device("cpu"))
    assert artifact.is_file() and aot_package.constants_path(artifact).is_file()
    shared = artifact.parent / json.loads(aot_package.constants_path(artifact).read_text())["file"]
    assert shared.is_file() and shared.name.startswith("constants-")
    # the verdict is kept: the next build neither loads nor rebuilds the package; it loads the kept artifact,
    # without building the model and without a trace, and writes the same bytes
    m = build(recipe_from_dict(_recipe(tmp_path / "p")), tmp_path / "b", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert (c["built"], c["loaded"], c["unusable"], c["from_program"], c["model_built"], c["artifacts_built"]) == (
        [], [], {"3x3x32x32": why}, ["3x3x32x32"], False, [])
    assert tree_bytes(tmp_path / "b") == tree_bytes(tmp_path / "a")
    assert _traces() == traced  # (torch.compile of the program, before: a trace in every build)
    # the loader crashed, so the machine's verdict is kept too: another shape is not compiled into a package at
    # all (no package compile, no verifying child: only its program is exported), and the manifest says where the
    # verdict is
    loader = aot_package.loader_path(tmp_path / "cache", packaged_encoder._device_name("cpu"))
    assert json.loads(loader.read_text()) == {"ok": False, "why": why, "package": package.name}
    other = {**_recipe(tmp_path / "p"), "geometry": {"buckets": ["40x40x1"]}}
    m = build(recipe_from_dict(other), tmp_path / "c", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert (c["compiled"], c["built"], c["loaded"], c["from_program"], c["model_built"], m["counts"]["written"]) == (
        True, [], [], ["3x3x40x40"], True, 5)
    assert c["unusable"]["3x3x40x40"].startswith(why + "; packages are not built on this machine since (")
    assert str(loader) in c["unusable"]["3x3x40x40"] and "delete it to try again" in c["unusable"]["3x3x40x40"]
    assert aot_package.packages(tmp_path / "cache") == [package]
    assert len(list((tmp_path / "cache" / "aot").glob("*" + aot_package.PROGRAM_SUFFIX))) == 2
    m = build(recipe_from_dict(other), tmp_path / "d", quiet=True, workers=1)
    assert (m["models"]["compile"]["model_built"], m["counts"]["written"]) == (False, 5)
    assert tree_bytes(tmp_path / "d") == tree_bytes(tmp_path / "c")
    # a program kept without its artifact (a cache of the code before artifacts, or one deleted): compiled from the
    # program, without the model, into the same bytes
    assert len(list(artifact.parent.glob("constants-*.pt"))) == 1  # (the 40x40 program's artifact shares them)
    for path in (artifact, aot_package.constants_path(artifact)):
        path.unlink()
    m = build(recipe_from_dict(_recipe(tmp_path / "p")), tmp_path / "e", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert (c["model_built"], c["artifacts_built"], m["counts"]["written"]) == (False, ["3x3x32x32"], 5)
    assert tree_bytes(tmp_path / "e") == tree_bytes(tmp_path / "a")
    assert _traces() == traced


class _TwoConvs(torch.nn.Module):
    """A stand-in encoder network: what :class:`~shardsmith.encode.packaged_encoder._Moments` packages."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder, self.quant_conv = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 1)


def _program_only_cache(cache: Path, x: torch.Tensor) -> tuple[packaged_encoder.PackagedEncoder, Path]:
    """A cache whose package did not load here and whose exported program is kept (as a first build, or another
    GPU's worker, leaves it), but no artifact yet."""
    net = _TwoConvs().eval()
    enc = packaged_encoder.PackagedEncoder(cache, "m", "cpu", lambda: net, options={})
    path = enc.path(tuple(x.shape))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    path.with_suffix(".verified.json").write_text(json.dumps({"ok": False, "why": "died of signal 11"}))
    with torch.inference_mode(False):
        aot_package.save_program(aot_package.export(packaged_encoder._Moments(net), torch.zeros_like(x).contiguous(
            memory_format=torch.channels_last)), aot_package.program_path(path))
    return enc, path


@pytest.mark.slow
def test_a_kept_program_is_compiled_into_its_artifact_from_inside_inference_mode(tmp_path, monkeypatch):
    """The encoder runs in inference mode; the program read back there must still compile (its weights were
    inference tensors, which a trace refuses: every --gpus worker but the first met that)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x = torch.randn(2, 3, 16, 16)
    enc, path = _program_only_cache(tmp_path / "cache", x)
    with torch.inference_mode():
        out = enc(x)
    c = enc.describe()
    assert (c["program_compiled_by"], c["artifacts_built"]) == ({"2x3x16x16": "inductor-artifact"}, ["2x3x16x16"])
    net = _TwoConvs().eval()
    with torch.no_grad():
        torch.testing.assert_close(out, net.quant_conv(net.encoder(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_an_artifact_that_loads_but_fails_when_it_runs_is_kept_as_failed(tmp_path, monkeypatch):
    """The artifact loads, and its first call raises: that batch and every later one run the program compiled
    with torch.compile instead, the manifest says why, and the verdict is kept for the next build."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    calls = []

    def broken(path, device, loaded=None):
        def run(x):
            calls.append(1)
            raise RuntimeError("CUDA error: no kernel image is available\nsecond line")
        return run

    monkeypatch.setattr(aot_package, "load_artifact", broken)
    x = torch.randn(2, 3, 16, 16)
    enc, path = _program_only_cache(tmp_path / "cache", x)
    oom = packaged_encoder.PackagedEncoder(tmp_path / "cache", "m", "cpu", lambda: None, options={})
    monkeypatch.setattr(aot_package, "load_artifact", lambda path, device, loaded=None: (
        lambda x: (_ for _ in ()).throw(RuntimeError("Triton Error [CUDA]: out of memory"))))
    with torch.inference_mode(), pytest.raises(RuntimeError, match="out of memory"):
        oom(x)  # (it may pass: raised, nothing kept, no torch.compile)
    assert (oom.compiled_by, oom.artifacts_built) == ({}, ["2x3x16x16"]) and not list(path.parent.glob("*.failed.json"))
    monkeypatch.setattr(aot_package, "load_artifact", broken)
    net = _TwoConvs().eval()
    with torch.no_grad():
        want = net.quant_conv(net.encoder(x))
    with torch.inference_mode():
        first, second = enc(x), enc(x)
    artifact = aot_package.artifact_path(path, torch.device("cpu"))
    marker = artifact.with_name(artifact.name + ".failed.json")
    why = (f"torch.compile (the Inductor artifact failed here (RuntimeError: CUDA error: no kernel image is "
           f"available); {marker} keeps that verdict: delete it to try again)")
    assert (enc.describe()["program_compiled_by"], enc.describe()["artifacts_built"], len(calls)) == (
        {"2x3x16x16": why}, [], 1)  # (the artifact the first encoder built)
    for out in (first, second):
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    again = packaged_encoder.PackagedEncoder(tmp_path / "cache", "m", "cpu", lambda: net, options={})
    with torch.inference_mode():
        torch.testing.assert_close(again(x), want, atol=1e-5, rtol=1e-5)
    assert (again.describe()["program_compiled_by"], len(calls)) == ({"2x3x16x16": why}, 1)


@pytest.mark.slow
def test_the_artifacts_of_two_shapes_share_one_copy_of_their_constants(tmp_path, monkeypatch):
    """One model's weights are kept once for all its shapes' artifacts, on disk and in memory; an artifact kept
    before constants were shared (its constants beside it, with their place) still loads."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    net = _TwoConvs().eval()
    xs = [torch.randn(2, 3, 16, 16), torch.randn(1, 3, 24, 8)]
    paths = []
    for x in xs:
        enc, path = _program_only_cache(tmp_path / f"c{len(paths)}", x)
        paths.append(path)
    cache = tmp_path / "cache" / "aot"
    cache.mkdir(parents=True)
    for path in paths:  # (both shapes' programs in one cache)
        for f in path.parent.iterdir():
            f.rename(cache / f.name)
    enc = packaged_encoder.PackagedEncoder(tmp_path / "cache", "m", "cpu", lambda: net, options={})
    with torch.inference_mode():
        outs = [enc(x) for x in xs]
    with torch.no_grad():
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, net.quant_conv(net.encoder(x)), atol=1e-5, rtol=1e-5)
    assert sorted(enc.describe()["artifacts_built"]) == ["1x3x24x8", "2x3x16x16"]
    shared, = cache.glob("constants-*.pt")
    assert len(enc._constants) == 1 and len(enc._constants[shared.name]) == 4  # (two convs: weight, bias)
    artifacts = sorted(cache.glob("*" + aot_package.ARTIFACT_SUFFIX))
    assert len(artifacts) == 2 and {json.loads(aot_package.constants_path(a).read_text())["file"]
                                    for a in artifacts} == {shared.name}
    # the layout before: the constants beside the artifact, with the pixels' place among the inputs
    shared.unlink()  # (a cache cleaned by hand): the artifacts are built again, not given up for torch.compile
    again = packaged_encoder.PackagedEncoder(tmp_path / "cache", "m", "cpu", lambda: net, options={})
    with torch.inference_mode():
        again(xs[0])
    assert (again.describe()["artifacts_built"], again.compiled_by, shared.is_file()) == (["2x3x16x16"], {}, True)
    x = xs[1]
    artifact = aot_package.artifact_path(enc.path(tuple(x.shape)), torch.device("cpu"))
    ref = aot_package.constants_path(artifact)
    at = json.loads(ref.read_text())["at"]
    torch.save({"at": at, "constants": torch.load(shared, weights_only=True)}, ref.with_suffix(".pt"))
    ref.unlink()
    run = aot_package.load_artifact(artifact, torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(run(x.contiguous(memory_format=torch.channels_last)), net.quant_conv(net.encoder(x)),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_an_artifact_is_run_first_in_a_child_and_one_that_crashes_there_is_not_loaded(tmp_path, monkeypatch):
    """A child loads and runs a new artifact on zeros before the build does: where that crashes (as torch 2.11's
    package loader did on the leased H100s), the build compiles the program with torch.compile, and the verdict is
    kept; where it runs, the verdict is kept too and no later build starts a child."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    net = _TwoConvs().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = net.quant_conv(net.encoder(x))
    enc, path = _program_only_cache(tmp_path / "crash", x)
    monkeypatch.setattr(aot_package, "_VERIFY_ARTIFACT", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with torch.inference_mode():
        torch.testing.assert_close(enc(x), want, atol=1e-5, rtol=1e-5)
    artifact = aot_package.artifact_path(path, torch.device("cpu"))
    assert aot_package.artifact_failed(artifact).startswith(
        "the Inductor artifact failed here (RuntimeError: a child loading and running it died of signal 11); ")
    assert enc.compiled_by["2x3x16x16"] == f"torch.compile ({aot_package.artifact_failed(artifact)})"
    assert not aot_package.artifact_verified(artifact)
    monkeypatch.undo()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    enc, path = _program_only_cache(tmp_path / "runs", x)
    with torch.inference_mode():
        torch.testing.assert_close(enc(x), want, atol=1e-5, rtol=1e-5)
    artifact = aot_package.artifact_path(path, torch.device("cpu"))
    assert aot_package.artifact_verified(artifact) and enc.compiled_by == {}

    def no_child(*a, **k):
        raise AssertionError("verified already: no child")

    monkeypatch.setattr(aot_package, "verify_artifact", no_child)
    again = packaged_encoder.PackagedEncoder(tmp_path / "runs", "m", "cpu", lambda: net, options={})
    with torch.inference_mode():
        torch.testing.assert_close(again(x), want, atol=1e-5, rtol=1e-5)
    assert (again.compiled_by, again.artifacts_built) == ({}, [])


def test_constants_are_named_by_their_content_and_an_artifact_without_them_is_not_complete(tmp_path):
    """Scalars hash too (a 0-dim bf16 tensor has no byte view of its own); the name changes with any value, dtype
    or stride; an artifact whose shared constants or reference went missing is built again, not run."""
    scalar, w = torch.tensor(0.5, dtype=torch.bfloat16), torch.arange(6, dtype=torch.float32).reshape(2, 3)
    name = aot_package.shared_constants(tmp_path, [scalar, w])
    assert name == aot_package.shared_constants(tmp_path, [scalar.clone(), w.clone()])
    assert len({name, aot_package.shared_constants(tmp_path, [scalar + 1, w]),
                aot_package.shared_constants(tmp_path, [scalar, w.double()]),
                aot_package.shared_constants(tmp_path, [scalar, w.t().contiguous().t()])}) == 4
    artifact = tmp_path / ("k.cpu" + aot_package.ARTIFACT_SUFFIX)
    assert not aot_package.artifact_complete(artifact)
    artifact.write_bytes(b"compiled")
    assert not aot_package.artifact_complete(artifact)  # (no reference to its constants)
    aot_package.constants_path(artifact).write_text(json.dumps({"at": 0, "file": name.name}))
    assert not aot_package.artifact_complete(artifact)  # (the shared file is gone)
    torch.save([scalar, w], name)
    assert aot_package.artifact_complete(artifact)
    aot_package.constants_path(artifact).unlink()
    torch.save({"at": 0, "constants": [scalar, w]}, aot_package.constants_path(artifact).with_suffix(".pt"))
    assert aot_package.artifact_complete(artifact)  # (the layout before constants were shared)


def test_out_of_memory_in_any_form_may_pass():
    assert aot_package.passing(torch.OutOfMemoryError("CUDA out of memory"))
    assert aot_package.passing(RuntimeError("Triton Error [CUDA]: out of memory"))
    assert aot_package.passing(OSError(28, "No space left on device"))
    assert not aot_package.passing(RuntimeError("CUDA error: no kernel image is available"))


def test_an_artifact_failure_that_may_pass_is_not_kept(tmp_path, monkeypatch):
    """Out of memory or a file system error: torch.compile for this build, and the next build tries again."""
    x = torch.randn(2, 3, 16, 16)
    _, path = _program_only_cache(tmp_path / "cache", x)
    artifact = aot_package.artifact_path(path, torch.device("cpu"))
    why = aot_package.mark_artifact_failed(artifact, OSError(28, "No space left on device"))
    assert why.endswith("; the next build tries again") and aot_package.artifact_failed(artifact) is None
    why = aot_package.mark_artifact_failed(artifact, torch.OutOfMemoryError("CUDA out of memory"))
    assert aot_package.artifact_failed(artifact) is None
    why = aot_package.mark_artifact_failed(artifact, RuntimeError("no kernel"))
    assert aot_package.artifact_failed(artifact) == why and why.startswith(
        "the Inductor artifact failed here (RuntimeError: no kernel); ")


@pytest.mark.slow
def test_an_artifact_that_fails_here_is_said_kept_and_the_program_compiled_with_torch_compile(tmp_path, monkeypatch):
    from shardsmith.build import build

    monkeypatch.setattr(aot_package, "_VERIFY", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def failing(*a, **k):
        calls.append(1)
        raise RuntimeError("no kernel for this GPU\nsecond line")

    monkeypatch.setattr(aot_package, "build_artifact", failing)
    real_photos(tmp_path / "p", 4, seed=3, min_side=40, max_side=90)
    traced = _traces()
    m = build(recipe_from_dict(_recipe(tmp_path / "p")), tmp_path / "a", quiet=True, workers=1)
    c = m["models"]["compile"]
    package, = aot_package.packages(tmp_path / "cache")
    marker = aot_package.artifact_path(package, torch.device("cpu")).with_name(
        aot_package.artifact_path(package, torch.device("cpu")).name + ".failed.json")
    why = (f"torch.compile (the Inductor artifact failed here (RuntimeError: no kernel for this GPU); {marker} keeps "
           "that verdict: delete it to try again)")
    assert (c["program_compiled_by"], c["artifacts_built"], m["counts"]["written"]) == ({"3x3x32x32": why}, [], 4)
    assert marker.is_file() and len(calls) == 1 and _traces() > traced
    # the verdict is kept: the next build goes to torch.compile at once, without the model, to the same bytes
    m = build(recipe_from_dict(_recipe(tmp_path / "p")), tmp_path / "b", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert (c["program_compiled_by"], c["model_built"], len(calls)) == ({"3x3x32x32": why}, False, 1)
    assert tree_bytes(tmp_path / "b") == tree_bytes(tmp_path / "a")


def test_two_processes_wanting_one_package_build_it_once(tmp_path, monkeypatch):
    # two GPUs' workers starting cold want the same package: the second waits on the first's build, then loads it
    import threading
    import time

    built, started = [], threading.Event()

    def fake_build(self, path, shape, x, package):
        started.set()
        built.append(shape)
        time.sleep(0.3)
        path.write_bytes(b"package")

    monkeypatch.setattr(packaged_encoder.PackagedEncoder, "_build", fake_build)
    monkeypatch.setattr(aot_package, "verify", lambda path, *a, **k: atomic_write_json(
        path.with_suffix(".verified.json"), {"ok": True, "why": "ran"}) or {"ok": True, "why": "ran"})
    monkeypatch.setattr(aot_package, "load", lambda path, device: (lambda x: x * 2))
    encoders = [packaged_encoder.PackagedEncoder(tmp_path, "model", "cpu", net=None) for _ in range(2)]
    x = torch.ones(2, 3, 8, 8)
    first = threading.Thread(target=encoders[0], args=(x,))
    first.start()
    assert started.wait(10)
    assert torch.equal(encoders[1](x), x * 2)  # waited for the first's build (the lock), then loaded its package
    first.join()
    assert built == [(2, 3, 8, 8)]
    assert (encoders[0].built, encoders[0].loaded, encoders[1].built, encoders[1].loaded) == (
        ["2x3x8x8"], [], [], ["2x3x8x8"])


def test_a_tiled_retry_goes_through_diffusers_tiles_not_the_packages():
    # a single item that ran out of memory is retried with the model's tiled encoding (stage.encode_staged);
    # packages are untiled, so that retry must not run them
    from shardsmith.encode.vae import load_vae

    vae = load_vae("sd", config="tiny", dtype="float32", device="cpu")
    calls = []

    class _Packages:
        active = True

        def __call__(self, x):
            calls.append(tuple(x.shape))
            return vae.model.quant_conv(vae.model.encoder(x))

    vae.packages = _Packages()
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    vae.encode(x)
    assert calls == [(1, 3, 64, 64)]
    vae.model.enable_tiling()
    assert vae.encode(x).shape == (1, 4, 8, 8) and calls == [(1, 3, 64, 64)]


def test_a_pretrained_vae_s_key_is_the_same_from_its_files_and_from_its_loaded_provenance(tmp_path, monkeypatch):
    # a cold build keys its packages from the loaded model's provenance (the weights are not hashed again); a warm
    # build, which loads no model, hashes the files: both must name the same packages
    from shardsmith.encode import spec
    from shardsmith.encode.vae import load_vae

    load_vae("sd", config="tiny", device="cpu").model.save_pretrained(tmp_path / "vae")
    recipe = recipe_from_dict({**_recipe(tmp_path), "models": {"vae": {"family": "sd", "pretrained": str(tmp_path / "vae")},
                                                               "compile": "on", "device": "cpu"}})
    vae = load_vae("sd", pretrained=str(tmp_path / "vae"), device="cpu")
    from_files = packaged_encoder._identity(recipe, "cpu")
    monkeypatch.setattr(spec, "hash_pretrained", lambda *a, **k: pytest.fail("the weights were hashed again"))
    assert from_files is not None and packaged_encoder._identity(recipe, "cpu", vae.provenance) == from_files
