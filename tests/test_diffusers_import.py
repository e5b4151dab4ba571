"""A command whose only model is a diffusers VAE imports diffusers without transformers (its import sat on the
build's critical path), writes the same latents as a library build, and leaves transformers importable."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shardsmith.encode.diffusers_import import _kept_out

PHOTOS = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "photos"

# the CLI's build in this interpreter; after it, what it imported and what diffusers believes
_PROBE = r'''
import importlib, json, sys
b = importlib.import_module("shardsmith.build")
report = sys.argv[3]
if len(sys.argv) > 4 and sys.argv[4] == "gpu-memory":  # models.offload auto's estimate runs, as on a GPU
    from shardsmith.encode import offload
    offload.free_bytes = lambda device: 80 * 2**30
_build = b.build
def _reported(*a, **k):
    manifest = _build(*a, **k)
    import diffusers.utils.import_utils as iu
    out = {"imported": sorted(m for m in ("transformers", "torchao", "scipy", "peft", "xformers") if m in sys.modules),
           "diffusers_sees_transformers": iu.is_transformers_available()}
    from transformers import AutoConfig  # importable again after the lean import
    out["transformers_imports"] = AutoConfig.__name__
    with open(report, "w") as f:
        json.dump(out, f)
    return manifest
b.build = _reported
from shardsmith.cli import main
sys.argv = ["shardsmith", "build", sys.argv[1], "--out", sys.argv[2], "--no-report", "-q"]
main()
'''


def _audio_recipe(tmp_path: Path) -> Path:
    """An audio-only build (LTX-2's audio VAE, tiny config) of three real speech files at their own rates."""
    from video_factory import audio_file

    src = tmp_path / "speech"
    src.mkdir()
    for i, (rate, layout) in enumerate(((16000, "mono"), (44100, "stereo"), (22050, "mono"))):
        audio_file(src / f"s{i}.wav", kind="speech", duration=1.3, rate=rate, layout=layout)
    rec = tmp_path / "audio.yaml"
    rec.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}], "split": {"holdout": 0.0, "seed": 1},
        "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "device": "cpu", "batch_size": 2},
        "audio": {"durations": "1.0"}, "outputs": [{"format": "latent_wds", "dir": "lat"}]}))
    return rec


def _recipe(tmp_path: Path, models: dict) -> Path:
    rec = tmp_path / "recipe.yaml"
    rec.write_text(yaml.safe_dump({
        "sources": [{"path": str(PHOTOS)}], "split": {"holdout": 0.0, "seed": 1},
        "geometry": {"buckets": ["64x64x1"]}, "models": {**models, "device": "cpu", "batch_size": 4},
        "outputs": [{"format": "latent_wds", "dir": "lat"}]}))
    return rec


def _shards(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*.tar"))}


def _cli(rec: Path, out: Path, report: Path, env: dict | None = None, *extra: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _PROBE, str(rec), str(out), str(report), *extra], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("vae,written", [("image", 6), ("audio", 3)])
def test_a_vae_only_command_keeps_transformers_out_and_writes_the_library_builds_bytes(tmp_path, vae, written):
    """An image VAE's build, and LTX-2's audio VAE's (its mel filterbank is shardsmith's own arithmetic)."""
    from shardsmith.build import build
    from shardsmith.recipe import load_recipe

    rec = _recipe(tmp_path, {"vae": {"family": "sd", "config": "tiny"}}) if vae == "image" else _audio_recipe(tmp_path)
    seen = _cli(rec, tmp_path / "cli", tmp_path / "report.json")
    assert seen == {"imported": [], "diffusers_sees_transformers": True, "transformers_imports": "AutoConfig"}
    build(load_recipe(rec), tmp_path / "lib", quiet=True)  # a library caller: the usual import
    cli, lib = _shards(tmp_path / "cli"), _shards(tmp_path / "lib")
    assert cli and cli == lib
    assert json.loads((tmp_path / "cli" / "manifest.json").read_text())["counts"]["written"] == written


@pytest.mark.slow
def test_the_lean_import_leaves_out_exactly_transformers_torchao_and_scipy(tmp_path):
    code = r'''
import json, sys
from shardsmith.encode import diffusers_import as d
if sys.argv[1] == "allowed":
    d.allow()
d.model_class("AutoencoderKL", lean=sys.argv[2] == "lean")
print(json.dumps(sorted(m for m in ("transformers", "torchao", "scipy", "diffusers") if m in sys.modules)))
'''
    seen = {}
    for allowed, lean in (("allowed", "lean"), ("library", "lean"), ("allowed", "plain")):
        r = subprocess.run([sys.executable, "-c", code, allowed, lean], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        seen[allowed, lean] = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["allowed", "lean"] == ["diffusers"]
    has_torchao = importlib.util.find_spec("torchao") is not None
    usual = ["diffusers", "scipy", "transformers"] + (["torchao"] if has_torchao else [])
    assert sorted(seen["library", "lean"]) == sorted(usual)  # a library caller's process: as usual
    assert sorted(seen["allowed", "plain"]) == sorted(usual)


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["-", "gpu-memory"])
def test_a_build_with_a_text_model_imports_transformers_without_scipy_torchao_or_peft(tmp_path, memory):
    """A VAE and a text encoder (the LTX-2 video workload's pair): the VAE's class lean, then transformers' core
    without the packages a text encoder's forward never uses (they were 1.3 s of the CPU machine's import); the
    same bytes as a library build, which imports as usual. With GPU memory to ask (``models.offload: auto``),
    the estimate, which builds both models on the meta device before the load, imports them the same way (it
    imported them as usual, so on a GPU the load's lean imports never ran)."""
    from shardsmith.build import build
    from shardsmith.recipe import load_recipe

    rec = _recipe(tmp_path, {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "t5", "config": "tiny"}})
    rec.write_text(rec.read_text().replace("latent_wds", "precomputed").replace("dir: lat", "dir: pre"))
    seen = _cli(rec, tmp_path / "cli", tmp_path / "report.json", None, memory)
    assert seen == {"imported": ["transformers"], "diffusers_sees_transformers": True,
                    "transformers_imports": "AutoConfig"}
    models = json.loads((tmp_path / "cli" / "manifest.json").read_text())["models"]
    assert ("no GPU" in models["offload"]["reason"]) == (memory == "-"), models["offload"]  # (else: estimated)
    build(load_recipe(rec), tmp_path / "lib", quiet=True)
    files = {}
    for side in ("cli", "lib"):
        root = tmp_path / side / "pre"
        files[side] = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted(root.rglob("*.pt"))}
    assert len([f for f in files["cli"] if f.startswith("conditions/")]) == 6 and files["cli"] == files["lib"]


_CORE = r'''
import json, sys
if sys.argv[3] == "needs-scipy":  # a module of transformers' core that imports scipy first (as a package might)
    import importlib.abc
    class NeedsScipy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "transformers.loss.loss_for_object_detection":
                import scipy.optimize  # noqa: F401 (ImportError while it is kept out)
            return None
    sys.meta_path.insert(0, NeedsScipy())
from shardsmith.encode import diffusers_import as d
if sys.argv[1] == "allowed":
    d.allow()
d.model_class("AutoencoderKL", lean=True)
d.transformers_core(lean=sys.argv[2] == "lean")
from transformers.utils import import_utils as iu
from transformers import T5Config, T5EncoderModel
import torch
m = T5EncoderModel(T5Config(d_model=16, num_layers=1, num_heads=2, d_ff=32, d_kv=8, vocab_size=50))
shape = list(m(torch.ones(1, 3, dtype=torch.long)).last_hidden_state.shape)
print(json.dumps([sorted(n for n in ("scipy", "torchao", "peft", "transformers") if n in sys.modules),
                  iu.is_scipy_available(), shape]))
'''


@pytest.mark.slow
def test_transformers_core_keeps_out_scipy_torchao_and_peft_only_in_a_lean_command(tmp_path):
    """Kept out in a command's lean import, and available again after it; a library caller's process, a plain
    import, and a lean import that fails (a module needing scipy) all import as usual, and the model runs."""
    seen = {}
    for allowed, lean, hook in (("allowed", "lean", "-"), ("library", "lean", "-"), ("allowed", "plain", "-"),
                                ("allowed", "lean", "needs-scipy")):
        r = subprocess.run([sys.executable, "-c", _CORE, allowed, lean, hook], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        seen[allowed, lean, hook] = json.loads(r.stdout.strip().splitlines()[-1])
    usual = sorted(["scipy", "transformers"] + [m for m in ("torchao", "peft") if importlib.util.find_spec(m)])
    assert seen["allowed", "lean", "-"] == [["transformers"], True, [1, 3, 16]]
    for key in (("library", "lean", "-"), ("allowed", "plain", "-")):
        assert seen[key] == [usual, True, [1, 3, 16]], key
    # the failed lean import's completed modules keep what they decided (its quantisers: no torchao)
    assert seen["allowed", "lean", "needs-scipy"] == [["scipy", "transformers"], True, [1, 3, 16]]


def test_kept_out_hides_a_module_within_and_restores_it_after():
    name = "mailbox"  # a standard module nothing here imports
    was = sys.modules.get(name)
    with _kept_out((name,)):
        assert importlib.util.find_spec(name) is None
        with pytest.raises(ImportError):
            __import__(name)
    assert sys.modules.get(name) is was
    import json as json_mod

    with _kept_out(("json",)):  # an imported module comes back as it was
        assert sys.modules["json"] is None
    assert sys.modules["json"] is json_mod


def _installed_stub(site: Path, name: str, version: str, modules: dict[str, str]) -> None:
    """A package ``name`` as pip installs it (its dist-info names the version diffusers checks) whose
    ``modules`` (dotted name below the package -> source; "" the package itself) import transformers first."""
    dist = site / f"{name}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "top_level.txt").write_text(name + "\n")
    for mod, body in modules.items():
        path = site / name / (mod.replace(".", "/") + ".py" if mod else "__init__.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import transformers  # (the installed package cannot be imported without it)\n" + body)


@pytest.mark.slow
@pytest.mark.parametrize("stub", ["peft", "xformers"])
def test_a_vae_only_command_builds_where_a_package_diffusers_imports_needs_transformers(tmp_path, stub):
    """peft (which diffusers imports wherever it is installed) is kept out with transformers; xformers stands for
    a package not kept out that cannot import without transformers: the import falls back to the usual one. A
    traceback before either (the lean import raised ImportError on a machine with peft, as most have)."""
    site = tmp_path / "site"
    if stub == "peft":
        _installed_stub(site, "peft", "0.21.2", {
            "": "", "helpers": "def disable_input_dtype_casting(*a, **k): pass\n",
            "tuners.__init__": "", "tuners.tuners_utils": "class BaseTunerLayer: pass\n"})
    else:
        _installed_stub(site, "xformers", "0.0.33", {"": "", "ops": ""})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    rec = _recipe(tmp_path, {"vae": {"family": "sd", "config": "tiny"}})
    seen = _cli(rec, tmp_path / "cli", tmp_path / "report.json", env=env)
    if stub == "peft":  # kept out: neither it nor transformers was imported for the build
        assert seen["imported"] == []
    else:  # the usual import: the package and transformers came in
        assert seen["imported"] == sorted(["transformers", "xformers"] + [m for m in ("torchao", "scipy")
                                                                          if importlib.util.find_spec(m)])
    assert seen["diffusers_sees_transformers"] is True and seen["transformers_imports"] == "AutoConfig"
    assert json.loads((tmp_path / "cli" / "manifest.json").read_text())["counts"]["written"] == 6


@pytest.mark.slow
def test_the_lean_import_does_not_map_every_installed_distribution(tmp_path):
    """diffusers' import asks importlib.metadata for every distribution's top-level names (1.4 s of the critical
    path on the leased GPU image); in a command's import (lean, or with transformers for a text model) the map is
    made only where it is looked up, and its answers are the real ones."""
    code = r'''
import importlib.metadata as m, json, sys
calls = []
real = m.packages_distributions
m.packages_distributions = lambda: (calls.append(1), real())[1]
from shardsmith.encode import diffusers_import as d
if sys.argv[1] == "allowed":
    d.allow()
d.model_class("AutoencoderKL", lean=sys.argv[2] == "lean")
from diffusers.utils import import_utils as iu
made_by_import = len(calls)
same = dict(iu._package_map) == real() and iu._is_package_available("torch") == iu._is_package_available("torch")
print(json.dumps([made_by_import, len(calls), same, m.packages_distributions is not d.LazyPackageMap]))
'''
    seen = {}
    for allowed, lean in (("allowed", "lean"), ("allowed", "plain"), ("library", "plain")):
        r = subprocess.run([sys.executable, "-c", code, allowed, lean], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        seen[allowed, lean] = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["allowed", "lean"] == seen["allowed", "plain"] == [0, 1, True, True]  # (a command, lean or not)
    assert seen["library", "plain"][:3] == [1, 1, True]  # a library caller's process: as diffusers does it


def test_a_lazy_package_map_is_made_once_at_its_first_lookup(monkeypatch):
    from shardsmith.encode import diffusers_import as d

    calls = []
    monkeypatch.setattr(d, "_packages_distributions", lambda: (calls.append(1), {"cv2": ["opencv-python"]})[1])
    lazy = d.LazyPackageMap()
    assert calls == []
    assert lazy["cv2"] == ["opencv-python"] and "PIL" not in lazy and len(lazy) == 1 and list(lazy) == ["cv2"]
    assert lazy.get("x") is None and calls == [1]
