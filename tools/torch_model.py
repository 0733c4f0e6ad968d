"""A straightforward PyTorch transformer, independent of qkv's C++ code: the oracle for qkv's model
(golden logits, tools/make_golden_model.py) and the peer of its benchmarks (bench/model_torch.py).

It reads the same files qkv reads — llama2.c checkpoints and safetensors + config JSON with qkv's
tensor names (include/qkv/model.hpp) — and computes, in fp32 eager PyTorch:

    x = wte[tokens] (+ wpe[pos])
    per layer:  x += wo(attn(rope(wq(n1(x))), rope(wk(n1(x))), wv(n1(x))))   causal, GQA by repeat
                x += w2(act(w1(n2(x))) [* w3(n2(x))])
    logits = wcls(norm(x))

Rotary embedding uses complex multiplication of interleaved pairs, as Meta's Llama code does.
"""
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F


def load_llama2c(path):
    """llama2.c's legacy checkpoint → (config dict, {name: tensor})."""
    with open(path, "rb") as f:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", f.read(28))
        data = np.frombuffer(f.read(), dtype="<f4")
    tied = vocab > 0
    vocab = abs(vocab)
    cfg = dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
               vocab_size=vocab, seq_len=seq_len, pos="rotary", norm="rmsnorm", mlp="swiglu",
               tied_embeddings=tied, bias=False, norm_eps=1e-5, rope_theta=10000.0)
    hd = dim // n_heads
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        t = torch.from_numpy(data[at:at + n].copy()).reshape(shape)
        at += n
        return t

    p = {"tok_embeddings.weight": take(vocab, dim)}
    order = [("attention_norm.weight", (dim,)), ("attention.wq.weight", (n_heads * hd, dim)),
             ("attention.wk.weight", (n_kv * hd, dim)), ("attention.wv.weight", (n_kv * hd, dim)),
             ("attention.wo.weight", (dim, n_heads * hd)), ("ffn_norm.weight", (dim,)),
             ("feed_forward.w1.weight", (hidden, dim)), ("feed_forward.w2.weight", (dim, hidden)),
             ("feed_forward.w3.weight", (hidden, dim))]
    for name, shape in order:
        for l in range(n_layers):
            p[f"layers.{l}.{name}"] = take(*shape)
    p["norm.weight"] = take(dim)
    take(seq_len * hd)  # the legacy rotary tables
    if not tied:
        p["output.weight"] = take(vocab, dim)
    assert at == data.size, "file size does not match its header"
    return cfg, p


def load_safetensors(path, config_path):
    from safetensors.torch import load_file
    with open(config_path) as f:
        cfg = json.load(f)
    defaults = dict(pos="rotary", norm="rmsnorm", mlp="swiglu", tied_embeddings=True, bias=False,
                    norm_eps=1e-5, rope_theta=10000.0)
    cfg = {**defaults, **cfg}
    return cfg, {k: v.float() for k, v in load_file(path).items()}


class TorchModel:
    def __init__(self, cfg, params, sdpa=False, dtype=torch.float32):
        """sdpa: attention through F.scaled_dot_product_attention (PyTorch's fused kernels, the
        benchmark peer at its best) instead of the explicit softmax formula (the test oracle).
        dtype: every parameter, activation and the cache in this dtype (torch.bfloat16: the
        benchmark's bf16 peer; rotary angles are applied in fp32 and rounded back)."""
        self.sdpa = sdpa
        self.c = cfg
        self.dtype = dtype
        self.p = {k: v.to(dtype) for k, v in params.items()} if dtype != torch.float32 else params
        C, H = cfg["dim"], cfg["n_heads"]
        self.hd = C // H
        if cfg["pos"] == "rotary":
            i = torch.arange(0, self.hd, 2, dtype=torch.float32)
            freqs = 1.0 / (cfg["rope_theta"] ** (i / self.hd))
            ang = torch.outer(torch.arange(cfg["seq_len"], dtype=torch.float32), freqs)
            self.rot = torch.polar(torch.ones_like(ang), ang)  # [P, D/2] complex
        self.wcls = self.p["tok_embeddings.weight"] if cfg["tied_embeddings"] else self.p["output.weight"]

    def new_cache(self):
        """Per layer, preallocated keys and values [P, Hkv, D] and the number of positions held."""
        c = self.c
        shape = (c["seq_len"], c["n_kv_heads"], self.hd)
        return {"len": 0, "k": [torch.zeros(shape, dtype=self.dtype) for _ in range(c["n_layers"])],
                "v": [torch.zeros(shape, dtype=self.dtype) for _ in range(c["n_layers"])]}

    def _norm(self, x, prefix):
        c, p = self.c, self.p
        if c["norm"] == "rmsnorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["norm_eps"]) * p[prefix + ".weight"]
        return F.layer_norm(x, (c["dim"],), p[prefix + ".weight"], p.get(prefix + ".bias"), c["norm_eps"])

    def _lin(self, x, prefix):
        return F.linear(x, self.p[prefix + ".weight"], self.p.get(prefix + ".bias"))

    def _rope(self, x, pos0):  # x [S, heads, D]
        S = x.shape[0]
        xc = torch.view_as_complex(x.float().reshape(S, x.shape[1], -1, 2))
        return torch.view_as_real(xc * self.rot[pos0:pos0 + S, None, :]).reshape(x.shape).to(x.dtype)

    @torch.no_grad()
    def forward(self, tokens, cache=None, pos0=0, all_logits=True):
        """tokens: list of ints at positions pos0…; cache from new_cache() (appended to), or None."""
        c, p = self.c, self.p
        S, H, Hkv, D = len(tokens), c["n_heads"], c["n_kv_heads"], self.hd
        x = p["tok_embeddings.weight"][torch.tensor(tokens)]
        if c["pos"] == "learned":
            x = x + p["pos_embeddings.weight"][pos0:pos0 + S]
        for l in range(c["n_layers"]):
            pre = f"layers.{l}."
            h = self._norm(x, pre + "attention_norm")
            q = self._lin(h, pre + "attention.wq").view(S, H, D)
            k = self._lin(h, pre + "attention.wk").view(S, Hkv, D)
            v = self._lin(h, pre + "attention.wv").view(S, Hkv, D)
            if c["pos"] == "rotary":
                q, k = self._rope(q, pos0), self._rope(k, pos0)
            if cache is not None:
                cache["k"][l][pos0:pos0 + S] = k
                cache["v"][l][pos0:pos0 + S] = v
                k, v = cache["k"][l][:pos0 + S], cache["v"][l][:pos0 + S]
            Skv = k.shape[0]
            Sq = S
            if not all_logits and l == c["n_layers"] - 1:
                # Past this point the last layer's other rows feed nothing (their keys and values
                # are cached above): finish the layer for the last position only, as qkv's
                # Model::forward does, so both sides do the same work.
                q, x, Sq = q[-1:], x[-1:], 1
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            # query s (position pos0 + s) sees keys t ≤ Skv − S + s
            if self.sdpa:
                qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
                if Sq == 1:
                    o = F.scaled_dot_product_attention(qh, kh, vh)
                elif Sq == Skv:
                    o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
                else:
                    allowed = torch.arange(Skv)[None, :] <= (Skv - Sq + torch.arange(Sq))[:, None]
                    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
                att = o.transpose(0, 1).reshape(Sq, H * D)
            else:
                scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(D)
                allowed = torch.arange(Skv)[None, :] <= (Skv - Sq + torch.arange(Sq))[:, None]
                scores = scores.masked_fill(~allowed, float("-inf"))
                att = torch.einsum("hst,thd->shd", torch.softmax(scores, -1), v).reshape(Sq, H * D)
            x = x + self._lin(att, pre + "attention.wo")
            h = self._norm(x, pre + "ffn_norm")
            if c["mlp"] == "swiglu":
                h = F.silu(self._lin(h, pre + "feed_forward.w1")) * self._lin(h, pre + "feed_forward.w3")
            else:
                h = F.gelu(self._lin(h, pre + "feed_forward.w1"), approximate="tanh")
            x = x + self._lin(h, pre + "feed_forward.w2")
        if cache is not None:
            cache["len"] = pos0 + S
        if not all_logits:
            x = x[-1:]
        return F.linear(self._norm(x, "norm"), self.wcls)
