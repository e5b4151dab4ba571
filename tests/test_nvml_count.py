"""A build's ``auto`` device asked of NVML, without importing torch before its plan and workers start
(shardsmith.encode.nvml_count): the same answer torch gives, and torch's import where NVML cannot answer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shardsmith.encode import nvml_count
from shardsmith.encode.nvml_count import torch_build, visible

PHOTOS = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "photos"

STUB_C = r"""
int nvmlInit_v2(void) { return INIT_RC; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = COUNT; return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = DRIVER; return 0; }
"""


@pytest.mark.parametrize("var", [None, "", "0", "1", "0,1", "1,0", "3", "0,3,1", "1,1", "0,-1,1", "-1", "2gpu,0",
                                 " 1 , 0", "abc", "0,abc,1", "+1", "7,0", "-", "+", "0,+", "-x", "0,1,-",
                                 "0,0,-", "1e0", "0x1"])
@pytest.mark.parametrize("raw", [0, 1, 2, 4])
def test_visible_devices_are_counted_as_torch_counts_them(monkeypatch, var, raw):
    """torch's own parser of CUDA_VISIBLE_DEVICES, cut where NVML has no such device, gives the same count."""
    import torch.cuda

    if var is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", var)
    try:
        parsed = torch.cuda._parse_visible_devices()
    except ValueError:  # torch cannot read it: neither do we, and torch answers
        assert visible(var, raw) is None
        return
    expected = next((i for i, x in enumerate(parsed) if x >= raw), len(parsed))
    assert visible(var, raw) == expected


def test_uuid_lists_are_left_to_torch():
    assert visible("GPU-8b2c1f3e-0000", 2) is None
    assert visible("MIG-GPU-8b2c1f3e/1/0", 2) is None


def test_torch_build_reads_cuda_and_hip_from_the_version_file():
    cuda = "from typing import Optional\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
    assert torch_build(cuda) == ("13.0", None)
    assert torch_build("__version__ = '2.13.0+cpu'\ncuda = None\nhip = None\n") == (None, None)
    assert torch_build("cuda: Optional[str] = None\nhip: Optional[str] = '6.4.1'\n") == (None, "6.4.1")
    for odd in ("cuda, hip = '12.8', None\n", "from ._v import cuda\nhip = None\n", "cuda = None\n",
                "cuda = {'12.8': 1}\nhip = None\n"):  # only torch can tell: never read as a CPU build
        with pytest.raises(ValueError):
            torch_build(odd)
    import torch

    assert torch_build((Path(torch.__file__).parent / "version.py").read_text()) == (torch.version.cuda,
                                                                                  torch.version.hip)


def test_this_machines_torch_build_answers_without_nvml(monkeypatch):
    """A CPU build of torch sees no CUDA device: 0, NVML never asked; a CUDA build without NVML: torch's turn."""
    import torch

    monkeypatch.setattr(nvml_count, "_nvml", lambda: None)
    assert nvml_count.device_count() == (None if torch.version.cuda else 0)


def test_resolve_device_quick_takes_nvmls_count_and_leaves_every_error_to_torch(monkeypatch):
    from shardsmith.precheck import DeviceError, resolve_device

    monkeypatch.setattr(nvml_count, "device_count", lambda: 2)
    assert resolve_device("auto", "models.device", quick=True) == "cuda"
    assert resolve_device("cuda", "models.device", quick=True) == "cuda"
    assert resolve_device("cuda:1", "models.device", quick=True) == "cuda:1"
    monkeypatch.setattr(nvml_count, "device_count", lambda: 0)
    assert resolve_device("auto", "models.device", quick=True) == "cpu"
    import torch

    if not torch.cuda.is_available():  # NVML's 0 for cuda: the error is torch's, naming the key and the fix
        with pytest.raises(DeviceError, match="models.device is cuda, but torch .* sees no CUDA device"):
            resolve_device("cuda", "models.device", quick=True)
    monkeypatch.setattr(nvml_count, "device_count", lambda: None)  # NVML cannot tell: torch answers
    assert resolve_device("auto", "models.device", quick=True) == ("cuda" if torch.cuda.is_available() else "cpu")


def _stand_ins(tmp_path: Path, *, cuda: str | None, count: int, driver: int, init_rc: int = 0) -> dict:
    """A stand-in torch (its version.py; importing it fails loudly) and a stub libnvidia-ml.so.1; the env."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stub NVML library (CI installs gcc)")
    site, lib = tmp_path / "site", tmp_path / "lib"
    (site / "torch").mkdir(parents=True)
    lib.mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('the stand-in torch was imported')\n")
    (site / "torch" / "version.py").write_text(f"from typing import Optional\n__version__ = '2.11.0'\n"
                                               f"cuda: Optional[str] = {cuda!r}\nhip: Optional[str] = None\n")
    (tmp_path / "nvml.c").write_text(STUB_C)
    subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", f"-DINIT_RC={init_rc}", f"-DCOUNT={count}",
                    f"-DDRIVER={driver}", "-o", str(lib / "libnvidia-ml.so.1"), str(tmp_path / "nvml.c")], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path]), "LD_LIBRARY_PATH": str(lib)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


_ASK = r'''
import json, sys
from shardsmith.encode.nvml_count import device_count
from shardsmith.encode.decoder_choice import resolve_decoder
from shardsmith.precheck import resolve_device
count = device_count()
out = {"count": count}
if count is not None:
    out["decoder"] = resolve_decoder("auto", resolve_device("auto", "models.device", quick=True), 14)
out["torch_imported"] = "torch" in sys.modules
print(json.dumps(out))
'''


@pytest.mark.parametrize("cuda,count,driver,init_rc,visible_var,expected", [
    ("13.0", 2, 13000, 0, None, {"count": 2, "decoder": "cpu-draft"}),
    ("13.0", 2, 13020, 0, "1", {"count": 1, "decoder": "cpu-draft"}),
    ("13.0", 2, 13000, 0, "", {"count": 0, "decoder": "cpu"}),
    ("12.8", 0, 12080, 0, None, {"count": 0, "decoder": "cpu"}),
    ("13.0", 1, 12080, 0, None, {"count": None}),  # a driver older than torch's CUDA: torch must say
    ("13.0", 1, 13000, 999, None, {"count": None}),  # NVML fails to start: torch must say
    (None, 1, 13000, 0, None, {"count": 0, "decoder": "cpu"}),  # torch's CPU build: no CUDA, whatever NVML says
])
def test_nvml_answers_for_a_cuda_build_of_torch_without_importing_it(tmp_path, cuda, count, driver, init_rc,
                                                                     visible_var, expected):
    env = _stand_ins(tmp_path, cuda=cuda, count=count, driver=driver, init_rc=init_rc)
    if visible_var is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_var
    r = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {**expected, "torch_imported": False}


_BUILD = r'''
import json, sys
import shardsmith.build as b
report = sys.argv.pop(1)
_workers = b.Workers
def _counted(*a, **k):
    with open(report, "w") as f:
        json.dump({"torch_before_workers": "torch" in sys.modules}, f)
    return _workers(*a, **k)
b.Workers = _counted
from shardsmith.cli import main
main()
'''


@pytest.mark.slow
def test_an_auto_device_image_build_forks_its_workers_before_importing_torch(tmp_path):
    """``models.device: auto`` (the default): the decoder's and the offload's settling ask NVML, so the plan
    and the decode workers start at once, and the latents are the bytes of a ``cpu`` build."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine auto is cuda: the bytes are not a CPU build's")
    outs = {}
    for device in ("auto", "cpu"):
        rec = tmp_path / f"{device}.yaml"
        rec.write_text(yaml.safe_dump({
            "sources": [{"path": str(PHOTOS)}], "split": {"holdout": 0.0, "seed": 1},
            "geometry": {"buckets": ["64x64x1"]}, "models": {"vae": {"family": "sd", "config": "tiny"},
                                                            "device": device, "batch_size": 4},
            "outputs": [{"format": "latent_wds", "dir": "lat"}]}))
        out = tmp_path / device
        seen = tmp_path / f"{device}.json"
        r = subprocess.run([sys.executable, "-c", _BUILD, str(seen), "build", str(rec), "--out", str(out), "--no-report",
                            "-q"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(seen.read_text()) == {"torch_before_workers": False}
        outs[device] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((out / "lat").glob("*.tar"))}
        assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 6
    assert outs["auto"] and outs["auto"] == outs["cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("asked", ["auto", "cpu-draft"])
def test_a_gpu_nvml_sees_and_torch_cannot_use_is_said_and_recorded(tmp_path, monkeypatch, capsys, asked):
    """NVML counts a device, torch has none (a broken CUDA install): the decoder was settled for a GPU, the
    models run on the CPU, and the build says so and records the decoder it used. A recipe that asked for
    ``cpu-draft`` itself got what it asked for: no warning."""
    import torch

    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    monkeypatch.setattr(nvml_count, "device_count", lambda: 1)
    m = build(recipe_from_dict({
        "sources": [{"path": str(PHOTOS)}], "split": {"holdout": 0.0, "seed": 1},
        "geometry": {"buckets": ["64x64x1"]}, "images": {"decoder": asked},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "batch_size": 4},
        "outputs": [{"format": "latent_wds", "dir": "lat"}]}), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 6 and m["models"]["device"] == "cpu"
    assert m["models"]["image_decoder"] == "pil-draft"
    err = capsys.readouterr().err
    warned = "NVML reports a CUDA device, but torch cannot use it" in err
    assert warned == (asked == "auto")
    if warned:
        assert "models.device: cpu" in err
