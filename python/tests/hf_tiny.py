"""Tiny Hugging Face GPT-2 and Llama checkpoints for the tests that compare qkv with transformers
(python/tests/test_hf_checkpoints.py, tests/inspect/test_hf.py).

The weights are random but every tensor, LayerNorm gains and biases included, is perturbed away
from its initial value, so that a wrong name, a missing transpose, a wrong third of the fused
c_attn or a wrong rotary row order changes the logits far beyond any test's tolerance. Each maker
saves the model as `save_pretrained` does (model.safetensors + config.json) in `folder` and
returns it in float32, eager attention (`output_attentions` gives the patterns).
"""
import torch
import transformers

TOKENS = [5, 17, 3, 60, 42, 8, 91, 23, 77, 1, 64, 30]


def perturbed(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def gpt2(folder, seed=0, dtype=torch.float32, vocab_size=97, **over):
    """GPT-2: LayerNorm, biases, learned positions, tied embeddings; 2 layers × 4 heads, d 64."""
    cfg = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, n_positions=32, vocab_size=vocab_size,
                                  attn_implementation="eager", **over)
    torch.manual_seed(seed)
    m = perturbed(transformers.GPT2LMHeadModel(cfg), seed)
    m.to(dtype).save_pretrained(folder)
    return m.float()


def llama(folder, seed=0, tied=False, dtype=torch.float32, vocab_size=97):
    """Llama: RMSNorm, rotary, SwiGLU, GQA 8 query / 4 kv heads; 2 layers, d 64."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_attention_heads=8,
                                   num_key_value_heads=4, num_hidden_layers=2, vocab_size=vocab_size,
                                   max_position_embeddings=32, tie_word_embeddings=tied, rms_norm_eps=1e-5,
                                   attn_implementation="eager")
    torch.manual_seed(seed)
    m = perturbed(transformers.LlamaForCausalLM(cfg), seed)
    m.to(dtype).save_pretrained(folder)
    return m.float()
