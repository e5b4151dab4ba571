"""A ``callable`` teacher whose signature Python cannot read, through ``shardsmith distill``:

- a valid callable object whose ``__signature__`` raises, one behind a proxy whose unknown attributes raise
  ``KeyError``, one whose ``__signature__`` is not a Signature, and a plain callable object were tracebacks
  (``RuntimeError`` / ``KeyError`` from the precheck's ``inspect.signature``, ``AttributeError: ... no attribute
  '__qualname__'`` from the teacher's load); now they are accepted (the check is skipped) and sample every prompt
  as the function they wrap does, byte for byte;
- a builtin that cannot be the teacher (``math.hypot``, ``torch.lerp``: no signature to check before the plan)
  was a traceback at the first batch; now its first call failing is one message naming the entry point and the
  fix, exit 2, and no shard is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_build import tree_bytes
from test_cli_mistakes import assert_message, invoke
from test_model_and_value_refusals import _kd_recipe

MODULE = "uninspectable_teachers"
TEACHERS = '''
import math

import torch

from shardsmith.distill.gaussian import velocity as _velocity


class RaisingSignature:
    @property
    def __signature__(self):
        raise RuntimeError("no signature here")

    def __call__(self, x, t, cond):
        return _velocity(x, t, cond)


class Proxy:
    def __getattr__(self, name):
        raise KeyError(name)

    def __call__(self, x, t, cond):
        return _velocity(x, t, cond)


class NotASignature:
    __signature__ = "not a Signature"

    def __call__(self, x, t, cond):
        return _velocity(x, t, cond)


class Plain:
    def __call__(self, x, t, cond):
        return _velocity(x, t, cond)


raising_signature = RaisingSignature()
proxy = Proxy()
not_a_signature = NotASignature()
plain = Plain()
hypot = math.hypot
lerp = torch.lerp
'''

ACCEPTED = [("raising_signature", "RaisingSignature"), ("proxy", "Proxy"), ("not_a_signature", "NotASignature"),
            ("plain", "Plain")]


@pytest.fixture
def teachers(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(TEACHERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return MODULE


def _teacher(entry_point: str) -> dict:
    return {"family": "callable", "entry_point": entry_point, "parameterisation": "flow"}


def _distill(tmp: Path, entry_point: str) -> tuple[int, str, Path]:
    tmp.mkdir(exist_ok=True)
    out = tmp / "out"
    code, output = invoke("distill", _kd_recipe(tmp, _teacher(entry_point)), "--out", out)
    return code, output, out


@pytest.mark.parametrize("fn, cls", ACCEPTED)
def test_the_precheck_accepts_and_the_load_names_a_teacher_whose_signature_cannot_be_read(tmp_path, teachers, fn, cls):
    import torch

    from shardsmith.distill.gaussian import velocity
    from shardsmith.encode.teacher import load_teacher
    from shardsmith.precheck import check_teacher
    from shardsmith.recipe import load_recipe

    check_teacher(load_recipe(_kd_recipe(tmp_path, _teacher(f"{teachers}:{fn}"))))  # no error
    teacher = load_teacher("callable", entry_point=f"{teachers}:{fn}", parameterisation="flow")
    assert teacher.provenance.cls == f"{teachers}.{cls}"
    x, cond = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)), torch.zeros(2, 3, 384)
    assert torch.equal(teacher.predict(x, 0.5, cond), velocity(x, torch.full((2,), 0.5), cond))


@pytest.mark.slow
def test_valid_teachers_whose_signature_cannot_be_read_are_accepted_and_sample_as_the_function(tmp_path, teachers):
    code, output, ref = _distill(tmp_path / "ref", "shardsmith.distill.gaussian:velocity")
    assert code == 0, output
    want = {k: v for k, v in tree_bytes(ref).items() if k.endswith(".tar")}
    assert len(want) >= 1
    for fn, cls in ACCEPTED:
        code, output, out = _distill(tmp_path / fn, f"{teachers}:{fn}")
        assert code == 0 and "Traceback" not in output, (fn, output)
        assert "6 of 6 prompts sampled" in output, (fn, output)
        assert {k: v for k, v in tree_bytes(out).items() if k.endswith(".tar")} == want, fn
        prov = json.loads((out / "manifest.json").read_text())["models"]["teacher"]["provenance"]
        assert prov["cls"] == f"{teachers}.{cls}" and prov["path_or_repo"] == f"{teachers}:{fn}"


@pytest.mark.slow
@pytest.mark.parametrize("fn, error", [("hypot", "ValueError"), ("lerp", "RuntimeError")])
def test_a_builtin_that_cannot_be_the_teacher_fails_its_first_call_with_one_message(tmp_path, teachers, fn, error):
    code, output, out = _distill(tmp_path, f"{teachers}:{fn}")
    assert_message(code, output, f"models.teacher.entry_point '{teachers}:{fn}': its signature cannot be read",
                   "its first call as velocity(x, t, cond)", f"({error}: ", "shardsmith.distill.gaussian:velocity",
                   "def velocity(x, t, cond)")
    assert "done:" not in output
    assert not list(out.rglob("*.tar"))  # no shard holds what it gave
