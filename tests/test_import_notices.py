"""Other libraries' import-time notices stay off a command's stderr (``shardsmith.import_notices``), and a
random-weight model cast to bf16 no longer warns about float32 modules it does not have."""

from __future__ import annotations

import subprocess
import sys

import pytest

NOTICES = ("Failed to load", "Unable to import `torchao` Tensor objects", "is an Enum subclass",
           "should be kept in float32")

IMPORTS = "import torchao; from diffusers import AutoencoderKL; import diffusers.quantizers.torchao.torchao_quantizer"


def _stderr(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr


def _notices(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(n in line for n in NOTICES)]


@pytest.mark.slow
def test_the_cli_keeps_import_notices_of_torchao_diffusers_and_torch_off_stderr():
    pytest.importorskip("torchao")
    bare = _notices(_stderr(IMPORTS))
    if not bare:
        pytest.skip("this environment's torchao, diffusers and torch print no import notice to silence")
    assert _notices(_stderr("import shardsmith.cli; " + IMPORTS)) == [], bare


@pytest.mark.slow
def test_a_random_weight_model_cast_to_bf16_prints_no_float32_module_warning():
    direct = "import torch; from diffusers import AutoencoderKL; AutoencoderKL().to(torch.bfloat16)"
    if not any("should be kept in float32" in line for line in _stderr(direct).splitlines()):
        pytest.skip("this diffusers does not warn on a cast")
    out = _stderr("from shardsmith.encode.vae import load_vae; v = load_vae('sd', config='tiny', dtype='bfloat16'); "
                  "import torch; assert next(v.model.parameters()).dtype == torch.bfloat16")
    assert not [line for line in out.splitlines() if "should be kept in float32" in line], out
