"""qkv: attention, exactly and fast, on the CPU.

    import qkv
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)   # as torch's, on NumPy or torch
    res = qkv.attention(q, k, v, causal=True, align="bottom_right", return_lse=True)
    res.out, res.lse, res.kernel.name

    import qkv.torch        # autograd: qkv.torch.scaled_dot_product_attention
    mha = qkv.MultiHeadAttention(d_model=64, n_heads=4, seed=0)
    delta = mha(x, causal=True)                                        # x [B, S, 64] -> Δe [B, S, 64]
    mha.save("block.safetensors"); qkv.MultiHeadAttention.load("block.safetensors")

    model = qkv.Model.load("stories260K.bin"); tok = qkv.Tokenizer.load("tok512.bin", 512)
    model.generate(tok, "Once upon a time", steps=64, temperature=0)   # llama2.c's greedy story
    model.trace(tok.encode("a fluffy blue creature")).layers[0].pattern  # [H, S, S], every head

Arrays may be NumPy (float32, float64, ml_dtypes.bfloat16), torch CPU tensors or any DLPack
producer; they are read in place through their strides, and outputs come back in the same kind.

Errors: a bad argument raises ValueError or TypeError; qkv.IoError (an OSError) a read or write the
system refused; qkv.FormatError (an OSError and a ValueError) a truncated or corrupt file;
qkv.NonFiniteError (a RuntimeError) numbers that became NaN or ±inf, such as a model's logits.
"""

import os as _os

# libgomp (the OpenMP runtime of oneDNN's GEMMs, loaded with the module below) reads its waiting
# policy once, when it loads. Unless the user chose one, its threads wait as qkv's own do: 2000
# spin rounds, then sleep, instead of spinning ~5 ms after each GEMM (docs/threads.md).
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "2000"

from ._qkv import FormatError, IoError, NonFiniteError, active_isa, cpu_isa, num_threads, set_isa, set_num_threads
from .functional import (AttentionGrads, AttentionGradsSinks, AttentionResult, AttentionResultScores, KernelInfo,
                         alibi_slopes, attention, attention_backward, dropout_mask, scaled_dot_product_attention)
from .kvcache import KVCache, attention_kvcache
from .onnx_op import OnnxAttentionOutputs, onnx_attention
from .mha import MhaResult, MultiHeadAttention
from .encoder import Encoder
from .model import BatchGeneration, Generation, LayerTrace, Model, ModelTrace, Tokenizer
from ._inspect import Inspection, inspect

__all__ = [
    "AttentionGrads", "AttentionGradsSinks", "AttentionResult", "AttentionResultScores", "BatchGeneration", "Encoder",
    "FormatError", "Generation", "Inspection", "IoError", "KVCache", "KernelInfo", "NonFiniteError",
    "LayerTrace", "MhaResult", "Model", "ModelTrace", "MultiHeadAttention", "OnnxAttentionOutputs", "Tokenizer",
    "active_isa", "alibi_slopes", "attention", "attention_backward", "attention_kvcache", "cpu_isa", "dropout_mask",
    "inspect", "num_threads", "onnx_attention",
    "scaled_dot_product_attention", "set_isa", "set_num_threads",
]
from ._qkv import __version__  # noqa: E402  (CMakeLists.txt's project VERSION, through the module)


def __getattr__(name):
    # `qkv.torch` without an explicit `import qkv.torch`; torch itself is imported only then.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    if name in ("flash_attn_func", "flash_attn_varlen_func"):  # FlashAttention 2's names; imports torch
        from . import flash_attn

        return getattr(flash_attn, name)
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")
