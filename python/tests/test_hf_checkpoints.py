"""Hugging Face checkpoints (model.safetensors + config.json, as `save_pretrained` writes them) run by qkv.

Oracle: the Hugging Face `transformers` implementation itself (GPT2LMHeadModel, LlamaForCausalLM), on
the very same weights, in float32 and eager attention; the checkpoints are hf_tiny.py's (random,
every tensor perturbed, so a wrong layout changes the logits far beyond the tolerance).
"""

import json

import numpy as np
import pytest
import torch

import qkv

from hf_tiny import TOKENS, gpt2, llama  # tiny perturbed checkpoints, shared with tests/inspect


def hf_logits(m, tokens):
    with torch.no_grad():
        return m(torch.tensor([tokens])).logits[0].double().numpy()


def check(model, ref, tokens, what):
    """All positions at once (prefill), then the same positions one token at a time through the KV cache."""
    want = hf_logits(ref, tokens)
    scale = np.abs(want).max()
    model.reset()
    got = model.forward(tokens, all_logits=True)
    err = np.abs(got - want).max() / scale
    model.reset()
    step = np.stack([model.forward([t]) for t in tokens])
    err_step = np.abs(step - want).max() / scale
    print(f"{what}: max |logit| {scale:.2f}, max error / max |logit|: prefill {err:.2e}, decode {err_step:.2e}")
    # Both sides compute in float32 with different summation orders over widths ≤ 256: the error
    # is a few ulps of the largest logit (measured ≈ 1e-7 to 1e-6); a wrong layout gives O(1).
    assert err < 2e-5 and err_step < 2e-5


def test_gpt2(tmp_path):
    ref = gpt2(tmp_path)
    model = qkv.Model.load(tmp_path / "model.safetensors")  # config.json found in the folder
    c = model.config
    assert (c["dim"], c["n_layers"], c["n_heads"], c["hidden_dim"], c["seq_len"], c["pos"], c["norm"], c["mlp"],
            c["bias"], c["tied_embeddings"]) == (64, 2, 4, 256, 32, "learned", "layernorm", "gelu", True, True)
    check(model, ref, TOKENS, "GPT-2")


def test_gpt2_exact_gelu_and_bf16_file(tmp_path):
    # activation_function "gelu" is the erf form; a bf16 file is widened exactly, so the reference
    # is the bf16-rounded model in float32.
    ref = gpt2(tmp_path, seed=1, dtype=torch.bfloat16, activation_function="gelu")
    model = qkv.Model.load(tmp_path / "model.safetensors")
    assert model.config["mlp"] == "gelu_exact"
    check(model, ref, TOKENS, "GPT-2, exact GELU, bf16 file")


@pytest.mark.parametrize("tied", [False, True])
def test_llama_gqa(tmp_path, tied):
    ref = llama(tmp_path, seed=2, tied=tied)
    model = qkv.Model.load(tmp_path / "model.safetensors", config=str(tmp_path / "config.json"))
    c = model.config
    assert (c["n_heads"], c["n_kv_heads"], c["pos"], c["norm"], c["mlp"], c["tied_embeddings"]) == (
        8, 4, "rotary", "rmsnorm", "swiglu", tied)
    check(model, ref, TOKENS, f"Llama GQA 8/4, tied={tied}")


def test_llama_greedy_generation_matches_transformers(tmp_path):
    ref = llama(tmp_path, seed=3)
    model = qkv.Model.load(tmp_path)  # the folder: its model.safetensors and config.json
    with torch.no_grad():
        want = ref.generate(torch.tensor([[1, 7, 9]]), max_new_tokens=20, do_sample=False,
                            pad_token_id=0)[0].tolist()
    model.reset()
    out = [1, 7, 9]
    logits = model.forward(out)
    while len(out) < len(want):
        out.append(int(np.argmax(logits)))
        logits = model.forward([out[-1]])
    assert out == want


def expect_refusal(tmp_path, changes, message):
    """The checkpoint in tmp_path with `changes` made to its config.json: loading it is refused, naming `message`."""
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        qkv.Model.load(tmp_path / "model.safetensors")
    print(e.value)
    assert message in str(e.value)


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "mistral"}, '"model_type" "mistral" is not supported'),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, '"rope_scaling"'),
    ({"hidden_act": "gelu"}, '"hidden_act"'),
    ({"attention_bias": True}, '"attention_bias"'),
    ({"num_key_value_heads": 3}, "n_kv_heads"),
    ({"hidden_size": 32}, '"head_dim"'),
    ({"intermediate_size": 128},
     '"model.layers.0.mlp.gate_proj.weight" (qkv\'s layers.0.feed_forward.w1.weight) is [160, 64]'),
])
def test_llama_config_errors(tmp_path, changes, message):
    llama(tmp_path)
    expect_refusal(tmp_path, changes, message)


@pytest.mark.parametrize("changes, message", [
    ({"scale_attn_by_inverse_layer_idx": True}, '"scale_attn_by_inverse_layer_idx"'),
    ({"activation_function": "relu"}, '"activation_function"'),
    ({"n_inner": 128}, '"transformer.h.0.mlp.c_fc.weight" (qkv\'s layers.0.feed_forward.w1.weight) is [64, 256]'),
])
def test_gpt2_config_errors(tmp_path, changes, message):
    gpt2(tmp_path)
    expect_refusal(tmp_path, changes, message)


def test_unknown_tensor_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file
    gpt2(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["transformer.h.0.attn.extra"] = torch.zeros(3)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r'tensor "transformer.h.0.attn.extra" \[3\] is not a parameter'):
        qkv.Model.load(tmp_path / "model.safetensors")
