"""int8 text encoders (issue 23): ``models.text.quantize`` / ``--load-text-encoder-in-8bit``, through torchao;
recorded in the manifest and the cache stamp; fp8 refused where the device has none."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

pytest.importorskip("torchao")

from test_cli_mistakes import assert_message, invoke  # noqa: E402


@pytest.mark.slow  # 3-7 s under load: the fast lane keeps under two minutes
def test_int8_weights_give_close_embeddings_and_say_so(tmp_path):
    from shardsmith.encode.quantize import quantize_text
    from shardsmith.encode.text import load_text_encoder

    full, q = load_text_encoder("minilm"), quantize_text(load_text_encoder("minilm"), "int8")
    prompts = ["a red fox asleep in snow", "an astronaut riding a horse on the moon"]
    a, b = full.encode(prompts).emb, q.encode(prompts).emb
    assert not torch.equal(a, b)  # int8 weights: other numbers ...
    cos = torch.nn.functional.cosine_similarity(a.flatten(1), b.flatten(1))
    assert bool((cos > 0.99).all()), cos  # ... the same embeddings up to int8 rounding
    assert q.spec.quantize == "int8" and q.spec.to_dict()["quantize"] == "int8"
    assert "quantize" not in full.spec.to_dict()  # full precision: the spec (and older stamps) unchanged
    linear = next(m for m in q.model.modules() if isinstance(m, torch.nn.Linear))
    assert "Int8" in type(linear.weight).__name__ or "AffineQuantized" in type(linear.weight).__name__


@pytest.mark.slow
def test_the_8bit_flag_records_the_quantization_in_the_manifest_and_the_tree_stamp(tmp_path):
    from media_factory import real_photos

    real_photos(tmp_path / "src", 3, seed=2, min_side=64, max_side=96)
    for i, p in enumerate(sorted((tmp_path / "src").glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x1"]},
                                      "models": {"vae": {"family": "sd", "config": "tiny"},
                                                 "text": {"family": "minilm"}, "device": "cpu"},
                                      "outputs": [{"format": "precomputed"}]}))
    code, out = invoke("build", recipe, "--out", tmp_path / "q", "--load-text-encoder-in-8bit", "-q", "--no-report")
    assert code == 0, out
    m = json.loads((tmp_path / "q" / "manifest.json").read_text())
    assert m["models"]["text"]["spec"]["quantize"] == "int8"
    stamp = json.loads(next((tmp_path / "q" / ".precomputed").glob("*.json")).read_text())
    assert "int8" in json.dumps(stamp)
    code, out = invoke("build", recipe, "--out", tmp_path / "full", "-q", "--no-report")
    assert code == 0, out
    full = json.loads(next((tmp_path / "full" / ".precomputed").glob("*.json")).read_text())
    assert full != stamp and "int8" not in json.dumps(full)  # another cache


def test_fp8_without_a_gpu_and_the_flag_without_a_text_encoder_are_refused(tmp_path):
    (tmp_path / "src").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x1"]},
                                      "models": {"vae": {"family": "sd", "config": "tiny"},
                                                 "text": {"family": "minilm", "quantize": "fp8"}, "device": "cpu"},
                                      "outputs": [{"format": "latent_wds"}]}))
    code, out = invoke("build", recipe, "--out", tmp_path / "out")
    assert_message(code, out, "models.text.quantize: fp8 needs a GPU with float8", "use int8")
    data = yaml.safe_load(recipe.read_text())
    del data["models"]["text"]
    recipe.write_text(yaml.safe_dump(data))
    code, out = invoke("build", recipe, "--out", tmp_path / "out", "--load-text-encoder-in-8bit")
    assert_message(code, out, "--load-text-encoder-in-8bit", "no text encoder")
    assert not (tmp_path / "out").exists()
