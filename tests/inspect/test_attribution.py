"""`qkv inspect --format json`'s direct logit attribution and logit lens against a PyTorch twin.

The twin is tools/torch_model.py (an independent fp32 PyTorch model reading the same checkpoint);
here its layer loop is replayed step by step to keep what the attribution needs: the residual
after every layer and each head's Δe_h = W_O[:, head h] · (P·V)_h. The replay's logits must equal
the twin's own forward. From those, in float64:

    σ       = √(mean(x_L²) + eps)                      (RMSNorm; stories260K)
    push_h  = W_U[t] · (g ⊙ Δe_h / σ)                  per head, t each of the ten likeliest tokens
    lens_l  = softmax(W_U · norm(x_l))                 x_l the residual after layer l (l = −1: embedding)

Tolerance: qkv and the twin run the same f32 model with different summation orders, so their
activations differ by a few f32 ulps amplified through 5 layers: we see pushes and logits differ
by < 1e-6·(1 + |value|) and allow 1e-5·(1 + |value|), printing the max difference seen.
Probabilities are compared absolutely within 1e-5 (we see < 1e-6).

Environment (ctest sets them): QKV_BIN, QKV_MODEL_DIR (the folder holding stories260K.bin).
"""
import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
from torch_model import TorchModel, load_llama2c  # noqa: E402

QKV = os.environ.get("QKV_BIN")
MODEL_DIR = os.environ.get("QKV_MODEL_DIR")
PROMPT = "a fluffy blue creature roamed the verdant forest"
TOL = 1e-5


def replay(tm, tokens, ablate=()):
    """The twin's forward (TorchModel.forward, all positions, no cache), keeping the embedding,
    the residual after each layer [S, C] and every head's Δe_h [H, S, C]. `ablate` holds
    (layer, head, "zero" | "mean"): that head's output (P·V)_h [S, D] is replaced by zeros or by its
    mean over the positions before W_O (qkv::HeadAblation's definition)."""
    c, p = tm.c, tm.p
    S, H, Hkv, D = len(tokens), c["n_heads"], c["n_kv_heads"], tm.hd
    x = p["tok_embeddings.weight"][torch.tensor(tokens)]
    if c["pos"] == "learned":
        x = x + p["pos_embeddings.weight"][:S]
    embed, resid, deltas, qk = x.clone(), [], [], []
    allowed = torch.arange(S)[None, :] <= torch.arange(S)[:, None]
    for l in range(c["n_layers"]):
        pre = f"layers.{l}."
        h = tm._norm(x, pre + "attention_norm")
        q = tm._lin(h, pre + "attention.wq").view(S, H, D)
        k = tm._lin(h, pre + "attention.wk").view(S, Hkv, D)
        v = tm._lin(h, pre + "attention.wv").view(S, Hkv, D)
        if c["pos"] == "rotary":
            q, k = tm._rope(q, 0), tm._rope(k, 0)
        qk.append((q.clone(), k.clone()))  # after rotary: [S, H, D], [S, Hkv, D]
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(D)
        att = torch.einsum("hst,thd->hsd", torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1), v)
        for al, ah, kind in ablate:
            if al == l:
                att[ah] = att[ah].mean(0, keepdim=True).expand(S, D) if kind == "mean" else 0.0
        wo = p[pre + "attention.wo.weight"].view(-1, H, D)  # [C, H, D]
        deltas.append(torch.einsum("hsd,chd->hsc", att, wo))  # Δe_h [H, S, C]
        x = x + tm._lin(att.transpose(0, 1).reshape(S, H * D), pre + "attention.wo")
        h = tm._norm(x, pre + "ffn_norm")
        if c["mlp"] == "swiglu":
            h = F.silu(tm._lin(h, pre + "feed_forward.w1")) * tm._lin(h, pre + "feed_forward.w3")
        else:
            h = F.gelu(tm._lin(h, pre + "feed_forward.w1"), approximate="tanh")
        x = x + tm._lin(h, pre + "feed_forward.w2")
        resid.append(x.clone())
    return embed, resid, deltas, qk, F.linear(tm._norm(x, "norm"), tm.wcls)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    assert QKV and MODEL_DIR, "QKV_BIN and QKV_MODEL_DIR must be set (ctest sets them)"
    out = tmp_path_factory.mktemp("attr")
    model = os.path.join(MODEL_DIR, "stories260K.bin")
    subprocess.run([QKV, "inspect", "--model", model, "--prompt", PROMPT, "--out", str(out), "--format", "json"],
                   check=True, capture_output=True)
    doc = json.loads((out / "inspect.json").read_text())
    cfg, params = load_llama2c(model)
    tm = TorchModel(cfg, params)
    ids = [t["id"] for t in doc["tokens"]]
    embed, resid, deltas, qk, logits = replay(tm, ids)
    assert torch.equal(logits, tm.forward(ids)), "the replay is not the twin's forward"
    return doc, cfg, tm, embed, resid, deltas, qk, logits


def close(a, b):
    return abs(a - b) <= TOL * (1 + abs(b))


def test_attribution_matches_the_twin(both):
    doc, cfg, tm, embed, resid, deltas, qk, logits = both
    A = doc["attribution"]
    L, H = cfg["n_layers"], cfg["n_heads"]
    xL = resid[-1][-1].double()
    sigma = math.sqrt(float(xL.pow(2).mean()) + cfg["norm_eps"])
    assert abs(A["sigma"] - sigma) <= 1e-5 * sigma
    g, W = tm.p["norm.weight"].double(), tm.wcls.double()
    worst = 0.0
    assert [t["id"] for t in A["tokens"]] == [t["id"] for t in doc["next_tokens"]]
    for t in A["tokens"]:
        for l in range(L):
            for h in range(H):
                want = float(W[t["id"]] @ (g * deltas[l][h, -1].double() / sigma))
                got = t["heads"][l][h]
                worst = max(worst, abs(got - want) / (1 + abs(want)))
                assert close(got, want), f"token {t['id']} layer {l} head {h}: qkv {got}, twin {want}"
        # The parts sum to the model's logit, and to the twin's.
        assert close(t["sum"], float(logits[-1, t["id"]])), (t["sum"], float(logits[-1, t["id"]]))
        assert abs(t["sum"] - t["logit"]) <= 1e-5 * (1 + abs(t["logit"]))
        # The MLP part of layer l: the twin's residual step minus its heads (no biases in Llama).
        for l in range(L):
            before = embed[-1] if l == 0 else resid[l - 1][-1]
            mlp = (resid[l][-1] - before).double() - deltas[l][:, -1].double().sum(0)
            want = float(W[t["id"]] @ (g * mlp / sigma))
            assert close(t["mlp"][l], want), f"token {t['id']} layer {l} MLP: qkv {t['mlp'][l]}, twin {want}"
    # Each head's strongest pushes: the twin's ranking over the whole vocabulary.
    for l in range(L):
        for h in range(H):
            z = W @ (g * deltas[l][h, -1].double() / sigma)
            top = torch.topk(z, 5).indices.tolist()
            got = [x["id"] for x in A["up"][l][h]]
            assert got[0] == top[0] or close(float(z[got[0]]), float(z[top[0]])), (l, h, got, top)
            for x in A["up"][l][h] + A["down"][l][h]:
                assert close(x["value"], float(z[x["id"]]))
            assert close(A["down"][l][h][0]["value"], float(z.min()))
    print(f"attribution: max |qkv − twin| / (1 + |twin|) = {worst:.3g} (allowed {TOL})")


def test_lens_matches_the_twin(both):
    doc, cfg, tm, embed, resid, deltas, qk, logits = both
    Z = doc["lens"]
    S = len(doc["tokens"])
    assert Z["pos0"] == 0 and len(Z["rows"]) == cfg["n_layers"] + 1
    worst = 0.0
    for r, x in enumerate([embed] + resid):
        p = torch.softmax(F.linear(tm._norm(x, "norm"), tm.wcls).double(), -1)  # [S, V]
        row = Z["rows"][r]
        assert [t["id"] for t in row["top"]][:1] == [int(p[-1].argmax())]
        for t in row["top"]:
            worst = max(worst, abs(t["prob"] - float(p[-1, t["id"]])))
            assert abs(t["prob"] - float(p[-1, t["id"]])) <= 1e-5, (r, t)
        assert len(row["positions"]) == S
        for s, t in enumerate(row["positions"]):
            assert abs(t["prob"] - float(p[s].max())) <= 1e-5, (r, s, t)
    # The last row is the model's own prediction.
    assert [t["id"] for t in Z["rows"][-1]["top"]] == [t["id"] for t in doc["next_tokens"]]
    print(f"lens: max |p qkv − p twin| = {worst:.3g} (allowed 1e-5)")


def test_query_key_vectors_match_the_twin(both):
    """The anatomy's q (last queries) and k (every key), after rotary, are the twin's."""
    doc, cfg, tm, embed, resid, deltas, qk, logits = both
    q0, S = doc["qk_q0"], len(doc["tokens"])
    assert q0 == max(0, S - 4)
    worst = 0.0
    for l, (q, k) in enumerate(qk):
        got_q = torch.tensor(doc["layers"][l]["q"], dtype=torch.float64)  # [H, S − q0, D]
        got_k = torch.tensor(doc["layers"][l]["k"], dtype=torch.float64)  # [Hkv, S, D]
        want_q, want_k = q[q0:].transpose(0, 1).double(), k.transpose(0, 1).double()
        for got, want in ((got_q, want_q), (got_k, want_k)):
            err = float(((got - want).abs() / (1 + want.abs())).max())
            worst = max(worst, err)
            assert err <= TOL, (l, err)
    print(f"q, k: max |qkv − twin| / (1 + |twin|) = {worst:.3g} (allowed {TOL})")


def effect(logits, ids, predicted):
    """What the ablation table reports, from the twin's logits [S, V], in float64: the probability
    of the unablated prediction and the top token at the last position, and the mean cross-entropy
    of the prompt's own next tokens."""
    lp = torch.log_softmax(logits.double(), -1)
    loss = float(-lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean())
    return float(lp[-1, predicted].exp()), int(lp[-1].argmax()), loss


def test_ablation_table_matches_the_twin(both):
    """Every single-head ablation (zero and mean) rerun in the twin: the predicted token's new
    probability and the loss agree within the tolerance above (probabilities absolutely within
    1e-5), and the new top token is the twin's unless its two best logits are within 1e-4."""
    doc, cfg, tm, embed, resid, deltas, qk, logits = both
    T = doc["ablation"]
    ids = [t["id"] for t in doc["tokens"]]
    predicted = doc["next_tokens"][0]["id"]
    p0, _, loss0 = effect(logits, ids, predicted)
    assert abs(T["p_predicted"] - p0) <= 1e-5 and close(T["loss"], loss0)
    worst, moved = 0.0, 0
    for kind in ("zero", "mean"):
        for l in range(cfg["n_layers"]):
            for h in range(cfg["n_heads"]):
                z = replay(tm, ids, [(l, h, kind)])[-1]
                p, top, loss = effect(z, ids, predicted)
                got = T[kind][l][h]
                worst = max(worst, abs(got["p_predicted"] - p), abs(got["loss"] - loss) / (1 + loss))
                assert abs(got["p_predicted"] - p) <= 1e-5, (kind, l, h, got["p_predicted"], p)
                assert close(got["loss"], loss), (kind, l, h, got["loss"], loss)
                two = torch.topk(z[-1].double(), 2).values
                assert got["top"]["id"] == top or float(two[0] - two[1]) < 1e-4, (kind, l, h, got["top"], top)
                moved += abs(p - p0) > 1e-3
    # The table is not flat: some heads matter to this prediction (zero ablation of 3.3 takes p from 0.83 to 0.65).
    assert moved > 10, moved
    print(f"ablation table: max |qkv − twin| = {worst:.3g} over {2 * cfg['n_layers'] * cfg['n_heads']} reruns")


@pytest.mark.parametrize("ablate", [["3.3"], ["1.2:mean", "4.0"]])
def test_ablated_run_matches_the_twin(tmp_path, both, ablate):
    """`--ablate` runs the whole page on the ablated model: its next tokens, the patterns of the
    later layers (which see the changed residual) and the ablated head's own Δe are the twin's."""
    doc0, cfg, tm, *_ = both
    model = os.path.join(MODEL_DIR, "stories260K.bin")
    args = [QKV, "inspect", "--model", model, "--prompt", PROMPT, "--out", str(tmp_path), "--format", "json",
            "--ablation-table", "off"]
    for a in ablate:
        args += ["--ablate", a]
    subprocess.run(args, check=True, capture_output=True)
    doc = json.loads((tmp_path / "inspect.json").read_text())
    spec = []
    for a in ablate:
        head, _, kind = a.partition(":")
        spec.append((int(head.split(".")[0]), int(head.split(".")[1]), kind or "zero"))
    assert doc["ablated"] == [{"layer": l, "head": h, "kind": k} for l, h, k in spec]
    assert "ablation" not in doc
    ids = [t["id"] for t in doc["tokens"]]
    embed, resid, deltas, qk, logits = replay(tm, ids, spec)
    p = torch.softmax(logits[-1].double(), -1)
    for t in doc["next_tokens"]:
        assert abs(t["prob"] - float(p[t["id"]])) <= 1e-5, t
    S, first = len(ids), min(l for l, _, _ in spec)
    changed = 0.0
    allowed = torch.arange(S)[None, :] <= torch.arange(S)[:, None]
    for l in range(cfg["n_layers"]):
        q, k = qk[l]
        k = k.repeat_interleave(cfg["n_heads"] // cfg["n_kv_heads"], dim=1)
        scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(tm.hd)
        want = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        got = torch.tensor([hd["pattern"] for hd in doc["layers"][l]["heads"]])
        assert float((got - want).abs().max()) <= 1e-5, l
        before = torch.tensor([hd["pattern"] for hd in doc0["layers"][l]["heads"]])
        if l > first:
            changed = max(changed, float((got - before).abs().max()))
        else:
            assert float((got - before).abs().max()) <= 1e-6, l
    assert changed > 1e-3, "ablation left every later pattern as it was"
    for l, h, kind in spec:
        norms = doc["layers"][l]["heads"][h]["delta_norm"]
        want = deltas[l][h].norm(dim=-1)
        assert all(abs(a - float(b)) <= 1e-5 * (1 + float(b)) for a, b in zip(norms, want)), (l, h)
        if kind == "zero":
            assert max(norms) == 0.0
