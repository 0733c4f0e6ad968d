"""qkv as a drop-in for torch.nn.functional.scaled_dot_product_attention, forward and backward.

    python3 examples/python/torch_dropin.py
"""
import torch
import torch.nn.functional as F

import qkv
import qkv.torch  # differentiable: qkv's forward and backward kernels under torch.autograd

torch.manual_seed(0)
B, H, S, D = 2, 4, 128, 64
q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))

# Inference: the same signature and semantics as torch's function.
out = qkv.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
print(f"forward: max |qkv - torch| = {(out - ref).abs().max():.2e}")

# Training: gradients flow through qkv's backward kernel.
y = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
y.square().sum().backward()
grads = [t.grad.clone() for t in (q, k, v)]
for t in (q, k, v):
    t.grad = None
F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
worst = max((g - t.grad).abs().max().item() for g, t in zip(grads, (q, k, v)))
print(f"backward: max |dq, dk, dv difference| = {worst:.2e}")

# f32 against f32, values and gradients of size ~1: both within a few 1e-6 of each other.
assert (out - ref).abs().max() < 1e-5 and worst < 1e-4
