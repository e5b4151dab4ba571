"""How many CUDA devices torch would see, asked without importing torch (a second or more before a build's plan).

torch answers the same question this way itself under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``: its build's CUDA
version, NVML's device count, and ``CUDA_VISIBLE_DEVICES`` parsed as torch parses it.

Contract
- :func:`device_count()`: the count, or ``None`` where only torch can tell (torch not installed; a ROCm build;
  no NVML library, or NVML failing; a driver whose CUDA is older than torch's CUDA major; device UUIDs in
  ``CUDA_VISIBLE_DEVICES``): the caller then imports torch and asks it. A CPU build of torch is 0, without
  NVML. Reads ``torch/version.py`` as text and never imports torch.
- :func:`torch_build(text)`: pure: ``(cuda, hip)`` versions (``None`` where the file says so) from that file's
  text; a ``ValueError`` where it does not assign both plainly.
- :func:`visible(var, raw)`: pure: how many of ``raw`` NVML devices ``CUDA_VISIBLE_DEVICES=var`` leaves, as
  torch counts them (``None`` for UUID lists).
"""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import os
from pathlib import Path

MAX_UNSET = 64  # torch's device list where CUDA_VISIBLE_DEVICES is unset: every NVML device, up to 64


def torch_build(text: str) -> tuple[str | None, str | None]:
    """``(cuda, hip)`` from the text of torch's ``version.py`` (``cuda: Optional[str] = '13.0'``); a ``ValueError``
    where the file does not assign both a literal string or ``None`` (only torch can tell then)."""
    found: dict[str, str | None] = {}
    for node in ast.parse(text).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and node.value is not None:
            value = ast.literal_eval(node.value)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"torch's version.py gives {target.id} = {value!r}")
            found[target.id] = value
    if set(found) != {"cuda", "hip"}:
        raise ValueError(f"torch's version.py does not assign {' and '.join(sorted({'cuda', 'hip'} - set(found)))}")
    return found["cuda"], found["hip"]


def _leading_int(s: str) -> int | None:
    """torch's ``_strtoul``: the integer a string starts with (sign allowed first), -1 where none; ``None``
    where torch's parser raises (a sign and no digit after it)."""
    end = 0
    while end < len(s) and (s[end].isdigit() or (end == 0 and s[end] in "+-")):
        end += 1
    if end == 0:
        return -1
    try:
        return int(s[:end])
    except ValueError:
        return None


def visible(var: str | None, raw: int) -> int | None:
    """Devices left of ``raw`` by ``CUDA_VISIBLE_DEVICES=var`` (``None``: unset), counted as torch does: the
    ordinals up to the first negative or unparsable one, none at all where one repeats, cut at the first
    ordinal NVML does not have. ``None`` for ``GPU-``/``MIG-`` UUID lists (only torch maps those) and where
    torch's parser raises (an element read up to a lone sign: ``-``, ``+x``)."""
    if var is None:
        return min(raw, MAX_UNSET)
    if var.startswith(("GPU-", "MIG-")):
        return None
    ordinals: list[int] = []
    for elem in var.split(","):
        x = _leading_int(elem.strip())
        if x is None:
            return None
        if x in ordinals:
            return 0
        if x < 0:
            break
        ordinals.append(x)
    for i, x in enumerate(ordinals):
        if x >= raw:
            return i
    return len(ordinals)


def _nvml() -> tuple[int, int] | None:
    """NVML's ``(device count, driver CUDA version as 1000 * major + 10 * minor)``, or ``None``."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if lib.nvmlInit_v2() != 0:
            return None
        count, driver = ctypes.c_uint(0), ctypes.c_int(0)
        try:
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return None
            if lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(driver)) != 0:
                return None
        finally:
            lib.nvmlShutdown()
    except AttributeError:  # a library without these symbols
        return None
    return count.value, driver.value


def device_count() -> int | None:
    """See the module contract."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        cuda, hip = torch_build((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    if hip is not None:
        return None
    if cuda is None:
        return 0
    nvml = _nvml()
    if nvml is None:
        return None
    raw, driver = nvml
    try:
        if driver // 1000 < int(cuda.split(".")[0]):
            return None
    except ValueError:
        return None
    return visible(os.environ.get("CUDA_VISIBLE_DEVICES"), raw)
