"""The PyTorch autograd twin of qkv's training model (src/model/trainable.hpp), independent of qkv's C++
code: the oracle of its gradients (golden files, tests/train/make_golden.py) and the peer of its
training benchmark (bench/train_model_torch.py).

One nn.Module over qkv's model config (the keys of qkv's model.json: dim, hidden_dim, n_layers,
n_heads, n_kv_heads, vocab_size, seq_len, pos, norm, mlp, tied_embeddings, bias, norm_eps,
rope_theta) whose parameters carry qkv's tensor names (include/qkv/model.hpp, Weights::tensors()):

    x = wte[tokens] (+ wpe[pos])                         tokens [B, T]
    per layer:  x += wo(attn(rope(wq(n1(x))), rope(wk(n1(x))), wv(n1(x))))   causal, GQA by repeat
                x += w2(act(w1(n2(x))) [* w3(n2(x))])
    loss = cross_entropy(wcls(norm(x)), targets)         the mean over all B·T positions

Rotary turns interleaved pairs (x[2i], x[2i+1]) as llama2.c (qkv's layout), with angles computed in
the parameters' dtype. sdpa=True runs attention through F.scaled_dot_product_attention (the fast
peer); the default is the explicit softmax (the oracle).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def param_shapes(c):
    """qkv's Weights::tensors(): (name, shape) in qkv's order."""
    C, D, H, Hkv, Hd = c["dim"], c["dim"] // c["n_heads"], c["n_heads"], c["n_kv_heads"], c["hidden_dim"]
    ln, bias = c["norm"] == "layernorm", c["bias"]
    out = [("tok_embeddings.weight", (c["vocab_size"], C))]
    if c["pos"] == "learned":
        out.append(("pos_embeddings.weight", (c["seq_len"], C)))
    for l in range(c["n_layers"]):
        p = f"layers.{l}."
        out.append((p + "attention_norm.weight", (C,)))
        if ln and bias:
            out.append((p + "attention_norm.bias", (C,)))
        for m, rows in (("wq", H * D), ("wk", Hkv * D), ("wv", Hkv * D)):
            out.append((p + f"attention.{m}.weight", (rows, C)))
            if bias:
                out.append((p + f"attention.{m}.bias", (rows,)))
        out.append((p + "attention.wo.weight", (C, H * D)))
        if bias:
            out.append((p + "attention.wo.bias", (C,)))
        out.append((p + "ffn_norm.weight", (C,)))
        if ln and bias:
            out.append((p + "ffn_norm.bias", (C,)))
        out.append((p + "feed_forward.w1.weight", (Hd, C)))
        if bias:
            out.append((p + "feed_forward.w1.bias", (Hd,)))
        out.append((p + "feed_forward.w2.weight", (C, Hd)))
        if bias:
            out.append((p + "feed_forward.w2.bias", (C,)))
        if c["mlp"] == "swiglu":
            out.append((p + "feed_forward.w3.weight", (Hd, C)))
    out.append(("norm.weight", (C,)))
    if ln and bias:
        out.append(("norm.bias", (C,)))
    if not c["tied_embeddings"]:
        out.append(("output.weight", (c["vocab_size"], C)))
    return out


class TwinModel(nn.Module):
    def __init__(self, cfg, dtype=torch.float32, sdpa=False):
        super().__init__()
        self.c, self.sdpa = cfg, sdpa
        self.names = [n for n, _ in param_shapes(cfg)]
        # nn.Module names cannot hold dots: the parameters sit in a list, in qkv's order.
        self.params = nn.ParameterList([nn.Parameter(torch.zeros(s, dtype=dtype)) for _, s in param_shapes(cfg)])
        self.p = dict(zip(self.names, self.params))
        D = cfg["dim"] // cfg["n_heads"]
        if cfg["pos"] == "rotary":
            i = torch.arange(0, D, 2, dtype=dtype)
            freq = 1.0 / (cfg["rope_theta"] ** (i / D))
            ang = torch.outer(torch.arange(cfg["seq_len"], dtype=dtype), freq)  # [P, D/2]
            self.register_buffer("cos", torch.cos(ang), persistent=False)
            self.register_buffer("sin", torch.sin(ang), persistent=False)

    def named(self):
        """{qkv name: parameter}."""
        return dict(zip(self.names, self.params))

    def _norm(self, x, prefix):
        c, p = self.c, self.p
        if c["norm"] == "rmsnorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["norm_eps"]) * p[prefix + ".weight"]
        return F.layer_norm(x, (c["dim"],), p[prefix + ".weight"], p.get(prefix + ".bias"), c["norm_eps"])

    def _lin(self, x, prefix):
        return F.linear(x, self.p[prefix + ".weight"], self.p.get(prefix + ".bias"))

    def _rope(self, x):  # x [B, T, heads, D]: pairs (2i, 2i+1) turn by the angle of position t
        T = x.shape[1]
        a, b = x[..., 0::2], x[..., 1::2]
        cos, sin = self.cos[:T, None, :], self.sin[:T, None, :]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def forward(self, idx, targets):
        c, p = self.c, self.p
        B, T = idx.shape
        H, Hkv, D = c["n_heads"], c["n_kv_heads"], c["dim"] // c["n_heads"]
        x = p["tok_embeddings.weight"][idx]
        if c["pos"] == "learned":
            x = x + p["pos_embeddings.weight"][:T]
        for l in range(c["n_layers"]):
            pre = f"layers.{l}."
            h = self._norm(x, pre + "attention_norm")
            q = self._lin(h, pre + "attention.wq").view(B, T, H, D)
            k = self._lin(h, pre + "attention.wk").view(B, T, Hkv, D)
            v = self._lin(h, pre + "attention.wv").view(B, T, Hkv, D)
            if c["pos"] == "rotary":
                q, k = self._rope(q), self._rope(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            if self.sdpa:
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = q @ k.transpose(-1, -2) / math.sqrt(D)
                scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
                att = torch.softmax(scores, -1) @ v
            x = x + self._lin(att.transpose(1, 2).reshape(B, T, H * D), pre + "attention.wo")
            h = self._norm(x, pre + "ffn_norm")
            if c["mlp"] == "swiglu":
                h = F.silu(self._lin(h, pre + "feed_forward.w1")) * self._lin(h, pre + "feed_forward.w3")
            else:
                h = F.gelu(self._lin(h, pre + "feed_forward.w1"), approximate="none" if c["mlp"] == "gelu_exact" else "tanh")
            x = x + self._lin(h, pre + "feed_forward.w2")
        wcls = p["tok_embeddings.weight"] if c["tied_embeddings"] else p["output.weight"]
        logits = F.linear(self._norm(x, "norm"), wcls)
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
