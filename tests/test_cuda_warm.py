"""The GPU library warm-up beside the model imports (encode/cuda_warm.py): which library calls each recipe starts
with, that the warm-up runs every one of them without drawing a random number or touching a global flag, that it
starts a thread on a CUDA device only, and that the encode stage starts it before it imports diffusers."""

from __future__ import annotations

import threading

import pytest
import torch

from shardsmith.encode import cuda_warm
from shardsmith.recipe import recipe_from_dict


def _recipe(models: dict):
    """A recipe with these ``models`` and an output that needs them (a latent one with a VAE, else prompts)."""
    data = {"sources": [{"name": "s", "kind": "folder", "path": "/nonexistent"}], "models": models}
    if "vae" in models:
        data.update(outputs=[{"name": "lat", "format": "latent_wds"}], geometry={"buckets": ["64x64x1"]})
    elif "audio_vae" in models:
        data.update(outputs=[{"name": "lat", "format": "latent_wds"}], audio={"durations": [2.0]})
    else:
        data.update(outputs=[{"name": "p", "format": "prompt_wds"}])
    return recipe_from_dict(data)


@pytest.mark.parametrize("models,want", [
    ({"vae": {"family": "sd", "dtype": "bfloat16"}}, [("conv2d", "bfloat16")]),
    ({"vae": {"family": "ltx2"}, "text": {"family": "t5", "dtype": "bfloat16"}},
     [("conv3d", "float32"), ("matmul", "bfloat16")]),
    ({"vae": {"family": "wan", "dtype": "float16"}}, [("conv3d", "float16")]),
    ({"text": {"family": "minilm"}}, [("matmul", "float32")]),
    ({"audio_vae": {"family": "ltx2_audio"}}, [("stft", "float32"), ("matmul", "float32"), ("conv2d", "float32")]),
])
def test_ops_are_the_library_calls_each_encoder_starts_with(models, want):
    assert cuda_warm.ops(_recipe(models)) == want


def test_every_op_runs_without_randomness_or_global_flags(monkeypatch):
    failures = []
    monkeypatch.setattr(cuda_warm.log, "debug", lambda *a: failures.append(a))
    todo = [(op, dt) for op in ("matmul", "stft", "conv2d", "conv3d") for dt in ("float32", "bfloat16")]
    rng = torch.get_rng_state()
    flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.get_num_threads())
    cuda_warm._run("cpu", todo)
    assert failures == []  # every op is valid as written (on the GPU they run the same)
    assert torch.equal(torch.get_rng_state(), rng)  # a random-weight model's values do not move
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.get_num_threads()) == flags


def test_a_fault_is_left_to_the_real_batches(monkeypatch):
    seen = []
    monkeypatch.setattr(cuda_warm.log, "debug", lambda *a: seen.append(a))
    cuda_warm._run("cpu", [("conv2d", "no_such_dtype")])  # returns; the fault is logged at debug level only
    assert seen and "no_such_dtype" in str(seen[0][1])


def test_a_thread_only_on_a_cuda_device(monkeypatch):
    rec = _recipe({"vae": {"family": "sd"}})
    assert cuda_warm.start(rec, "cpu") is None
    ran = []
    monkeypatch.setattr(cuda_warm, "_run", lambda device, todo: ran.append((device, todo)))
    t = cuda_warm.start(rec, "cuda:1")
    assert isinstance(t, threading.Thread) and t.daemon and t.name == "shardsmith-cuda-warm"
    t.join()
    assert ran == [("cuda:1", [("conv2d", "float32")])]


def test_the_stage_starts_it_before_the_models_load(monkeypatch):
    """The point of the warm-up: its thread runs while EncodeStage.from_recipe imports diffusers and builds the
    models (in the build's preload, a --gpus worker or a Ray actor alike), not after; it gets the resolved
    device."""
    from shardsmith.encode import stage as stage_mod

    class Stop(Exception):
        pass

    order = []
    monkeypatch.setattr(cuda_warm, "start", lambda recipe, device: order.append(("warm", device)))

    def load_vae(*a, **k):
        order.append("load")
        raise Stop

    monkeypatch.setattr(stage_mod, "load_vae", load_vae)
    with pytest.raises(Stop):
        stage_mod.EncodeStage.from_recipe(_recipe({"vae": {"family": "sd"}, "device": "cpu"}))
    assert order == [("warm", "cpu"), "load"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_models_load_as_without_it(monkeypatch):
    """The warm-up thread runs beside a random-weight model drawn on the GPU: the weights and a batch's latents
    are the same bytes as a load without it."""
    from shardsmith.encode.preload import ModelPreload

    rec = _recipe({"vae": {"family": "sd", "dtype": "bfloat16"}, "device": "cuda"})

    def load(warm: bool):
        if not warm:
            monkeypatch.setattr(cuda_warm, "start", lambda recipe, device: None)
        stage = ModelPreload(rec).start().result()
        host = torch.zeros((stage.batch_size, 1, 64, 64, 3), dtype=torch.uint8)
        host[..., 0] = 200
        z = stage.encode_staged(host)
        state = {k: v.detach().cpu().clone() for k, v in stage.vae.model.state_dict().items()}
        stage.close()
        return state, torch.stack(z).cpu()

    with_warm, z1 = load(True)
    without, z2 = load(False)
    assert with_warm.keys() == without.keys() and all(torch.equal(with_warm[k], without[k]) for k in with_warm)
    assert torch.equal(z1, z2)
