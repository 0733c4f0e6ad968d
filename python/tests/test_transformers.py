"""attn_implementation="qkv" in Hugging Face transformers, against the same models with "eager".

Oracle: transformers' eager attention on the very same random weights (models built from small
configs, every weight perturbed away from its initial value). Tolerances: both sides compute in
float32 and differ only in the order of the softmax and P·V sums (qkv's online softmax over key
tiles vs eager's full row), so logits of O(1-10) agree to a few float32 ulps per layer (observed
<= 1e-6): 1e-5 absolute, and gradients (one more pass of the same sums) to 1e-4 relative to each
tensor's largest entry. Greedy generate() must give the same token ids. Padded positions (query rows that may attend
to no key) are excluded from comparisons: eager gives them a uniform average, qkv zeros; they are
attended by no real token, so the real positions are unaffected (which the tests check).
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import qkv.torch  # noqa: E402
import qkv.transformers  # noqa: E402,F401
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

ATOL = 1e-5


def _perturbed(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def gpt2(seed=0, **over):
    cfg = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=97,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, attn_implementation="eager",
                                  **over)
    torch.manual_seed(seed)
    return _perturbed(transformers.GPT2LMHeadModel(cfg), seed)


def llama(seed=0, **over):
    """Llama with grouped-query attention: 8 query heads on 2 key/value heads."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2,
                                   num_hidden_layers=2, vocab_size=97, max_position_embeddings=128,
                                   attn_implementation="eager", **over)
    torch.manual_seed(seed)
    return _perturbed(transformers.LlamaForCausalLM(cfg), seed)


def mistral(seed=0):
    """Mistral with a sliding window of 5 keys (shorter than the prompts) and GQA 4 on 2."""
    cfg = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                     num_key_value_heads=2, num_hidden_layers=2, vocab_size=97, sliding_window=5,
                                     max_position_embeddings=128, attn_implementation="eager")
    torch.manual_seed(seed)
    return _perturbed(transformers.MistralForCausalLM(cfg), seed)


def gemma2(seed=0, **over):
    """Gemma 2: attention logits capped by c · tanh(s / c) (c = 0.5, small enough to bite on these
    scores), sliding layers of 6 keys beside global ones, GQA 4 on 2, query_pre_attn_scalar as scale."""
    kw = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              num_hidden_layers=2, vocab_size=97, max_position_embeddings=128, sliding_window=6,
              attn_logit_softcapping=0.5, final_logit_softcapping=None, query_pre_attn_scalar=16,
              layer_types=["sliding_attention", "full_attention"], attn_implementation="eager")
    cfg = transformers.Gemma2Config(**{**kw, **over})
    torch.manual_seed(seed)
    return _perturbed(transformers.Gemma2ForCausalLM(cfg), seed)


def gpt_oss(seed=0, sinks=True):
    """gpt-oss: a learned sink logit per head (drawn N(0, 1) here; zeros without ``sinks``), sliding
    layers of 6 keys beside global ones, GQA 4 on 2, 4 experts (2 per token)."""
    cfg = transformers.GptOssConfig(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=16, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                                    vocab_size=97, max_position_embeddings=128, sliding_window=6,
                                    layer_types=["sliding_attention", "full_attention"], attn_implementation="eager")
    torch.manual_seed(seed)
    model = _perturbed(transformers.GptOssForCausalLM(cfg), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(4, generator=g) if sinks else torch.zeros(4))
    return model


def bert(seed=0, **over):
    kw = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, vocab_size=97,
              max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              attn_implementation="eager")
    cfg = transformers.BertConfig(**{**kw, **over})
    torch.manual_seed(seed)
    return _perturbed(transformers.BertModel(cfg), seed)


def batch(lengths, total, left, seed=3):
    """Token ids [B, total] and attention_mask: row b has lengths[b] real tokens, padded left or right."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (len(lengths), total), generator=g)
    am = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        if left:
            am[b, total - n:] = 1
        else:
            am[b, :n] = 1
    return ids * am, am


def both(model, fn):
    """fn(model) with attn_implementation 'eager' and then 'qkv' on the same weights."""
    model.set_attn_implementation("eager")
    want = fn(model)
    model.set_attn_implementation("qkv")
    try:
        got = fn(model)
    finally:
        model.set_attn_implementation("eager")
    return want, got


def close(got, want, mask=None, atol=ATOL, what=""):
    d = (got - want).abs()
    if mask is not None:
        d = d[mask.bool()]
    err = d.max().item()
    print(f"{what}: max |qkv - eager| = {err:.3g} (tolerance {atol:g})")
    assert err <= atol, what


def test_registered_with_both_interfaces():
    assert AttentionInterface._global_mapping["qkv"] is qkv.transformers.attention_forward
    assert AttentionMaskInterface._global_mapping["qkv"] is qkv.transformers.mask


@pytest.mark.parametrize("make", [gpt2, llama, mistral], ids=["gpt2", "llama_gqa", "mistral_window"])
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_decoder_logits_equal_eager(make, left):
    model = make()
    ids, am = batch([12, 7, 3], 12, left)
    want, got = both(model, lambda m: m(input_ids=ids, attention_mask=am).logits)
    close(got, want, am, what=f"{make.__name__} logits")


@pytest.mark.parametrize("make", [gpt2, llama, mistral], ids=["gpt2", "llama_gqa", "mistral_window"])
def test_greedy_generate_equals_eager(make):
    """Prefill of a left-padded batch, then one-token decode steps on the KV cache."""
    model = make()
    ids, am = batch([9, 5, 2], 9, left=True)
    kw = dict(attention_mask=am, max_new_tokens=10, do_sample=False, pad_token_id=0, output_scores=True,
              return_dict_in_generate=True)
    want, got = both(model, lambda m: m.generate(ids, **kw))
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.scores, want.scores)):
        close(a, b, what=f"{make.__name__} decode step {step} scores")


def test_static_cache_generate_equals_eager():
    """A StaticCache: keys padded to the cache size, queries not at the bottom of the mask."""
    model = llama()
    ids, am = batch([9, 5, 2], 9, left=True)
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static",
              output_scores=True, return_dict_in_generate=True)
    want, got = both(model, lambda m: m.generate(ids, **kw))
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.scores, want.scores)):
        close(a, b, what=f"static cache decode step {step} scores")


def test_causal_structure_is_used_and_exact(monkeypatch):
    """An unpadded prompt runs as qkv's causal option (no dense mask), a padded one with a mask."""
    seen = []
    real = qkv.torch.attention

    def spy(q, k, v, **kw):
        seen.append((kw["mask"] is None, kw["causal"], kw["align"], kw["window_left"]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(qkv.transformers._qtorch, "attention", spy)
    ids, am = batch([10], 10, left=True)
    model = mistral()
    both(model, lambda m: m(input_ids=ids, attention_mask=am).logits)
    assert seen and all(s == (True, True, "bottom_right", 4) for s in seen), seen   # window 5 = 4 left + self


@pytest.mark.parametrize("right_pad", [True, False])
def test_bert_padding_becomes_key_lengths(monkeypatch, right_pad):
    seen = []
    real = qkv.torch.attention

    def spy(q, k, v, **kw):
        seen.append((kw["mask"], kw["key_lengths"]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(qkv.transformers._qtorch, "attention", spy)
    model = bert()
    ids, am = batch([11, 4, 8], 11, left=not right_pad)
    want, got = both(model, lambda m: m(input_ids=ids, attention_mask=am).last_hidden_state)
    close(got, want, am, what="bert hidden states")
    assert seen
    for m, kl in seen:
        if right_pad:   # right padding: key lengths, no mask at all
            assert m is None and kl.tolist() == [11, 4, 8]
        else:           # left padding is no prefix: a [B, 1, 1, S] key mask, broadcast (stride 0) over queries
            assert kl is None and m.dtype == torch.bool and m.stride(2) == 0


def test_training_gradients_equal_eager():
    model = llama()
    ids, am = batch([12, 9], 12, left=False)
    labels = ids.masked_fill(am == 0, -100)

    def grads(m):
        m.zero_grad()
        m.train()
        m(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
        m.eval()
        return {n: p.grad.clone() for n, p in m.named_parameters()}

    want, got = both(model, grads)
    for n in want:
        scale = want[n].abs().max().item()
        err = (got[n] - want[n]).abs().max().item()
        assert err <= 1e-4 * scale + 1e-7, f"{n}: {err:.3g} vs scale {scale:.3g}"
    print(f"llama gradients: {len(want)} tensors within 1e-4 of their scale")


def test_bert_training_gradients_equal_eager():
    model = bert()
    ids, am = batch([11, 6], 11, left=False)

    def grads(m):
        m.zero_grad()
        m.train()
        h = m(input_ids=ids, attention_mask=am).last_hidden_state
        (h * am[..., None]).square().sum().backward()
        m.eval()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    want, got = both(model, grads)
    assert want.keys() == got.keys()
    for n in want:
        scale = want[n].abs().max().item()
        assert (got[n] - want[n]).abs().max().item() <= 1e-4 * scale + 1e-7, n


def test_output_attentions_is_qkvs_pattern():
    model = gpt2()
    ids, am = batch([8, 5], 8, left=True)
    want, got = both(model, lambda m: m(input_ids=ids, attention_mask=am, output_attentions=True).attentions)
    assert len(got) == len(want) == 2
    rows = am.bool()[:, None, :, None].expand(-1, 4, -1, 8)   # real query rows only
    for a, b in zip(got, want):
        assert a is not None and a.shape == b.shape
        close(a, b, rows, atol=1e-6, what="attention weights")   # probabilities in [0, 1]: float32 rounding


def test_mask_function_registration_carries_the_padding():
    """Without qkv's mask function transformers passes no mask: padding would be silently lost."""
    model = gpt2()
    ids, am = batch([10, 4], 10, left=True)
    want, got = both(model, lambda m: m(input_ids=ids, attention_mask=am).logits)
    close(got, want, am, what="with the mask function")
    saved = AttentionMaskInterface._global_mapping.pop("qkv")
    try:
        _, lost = both(model, lambda m: m(input_ids=ids, attention_mask=am).logits)
    finally:
        AttentionMaskInterface._global_mapping["qkv"] = saved
    # Row 1's four real tokens would attend to its six left-padding keys: its real logits change.
    err = (lost - want)[am.bool()].abs().max().item()
    print(f"without the mask function: real positions off by {err:.3g}")
    assert err > 1e-2


def test_future_tokens_do_not_leak():
    """Causality checked directly: changing the last token leaves every earlier logit unchanged."""
    model = llama()
    model.set_attn_implementation("qkv")
    ids, _ = batch([10], 10, left=False)
    a = model(input_ids=ids).logits
    ids2 = ids.clone()
    ids2[0, -1] = (ids2[0, -1] + 1) % 97
    b = model(input_ids=ids2).logits
    assert torch.equal(a[0, :-1], b[0, :-1])


def test_attention_dropout_runs_in_training_and_is_off_in_eval():
    model = bert(attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.0)
    ids, am = batch([5, 3], 5, left=False)
    model.eval()
    want = model(input_ids=ids, attention_mask=am).last_hidden_state
    model.set_attn_implementation("qkv")
    # eval mode: no dropout (p = 0, as transformers passes), eager's output within the tolerance of the
    # other BERT tests here.
    torch.testing.assert_close(model(input_ids=ids, attention_mask=am).last_hidden_state, want, rtol=0, atol=1e-5)
    model.train()
    torch.manual_seed(0)
    a = model(input_ids=ids, attention_mask=am).last_hidden_state
    torch.manual_seed(0)
    b = model(input_ids=ids, attention_mask=am).last_hidden_state
    assert torch.equal(a, b)                     # the seed comes from torch's generator: reproducible
    assert not torch.allclose(a, want, atol=1e-3)  # and dropout did act
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # The attention weights returned in training are the dropped, rescaled ones that multiplied V (as eager's).
    out = model(input_ids=ids[:1, :3], attention_mask=am[:1, :3], output_attentions=True)
    w = out.attentions[0]
    assert ((w == 0) | (w > 0)).all() and (w.sum(-1) != 1).any()


def test_unsupported_features_raise_naming_model_and_layer():
    model = bert()
    model.set_attn_implementation("qkv")
    ids, am = batch([5], 5, left=False)
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="'position_bias'"):
        qkv.transformers.attention_forward(model.encoder.layer[0].attention.self, q, q, q, None,
                                           position_bias=torch.zeros(1, 2, 3, 3))


# Gemma 2 (softcap) and gpt-oss (sinks) through attn_implementation="qkv": the variants ride on qkv's
# kernels. Each test first checks that the variant changes eager's logits by far more than the
# tolerance, so that a qkv run that ignored it could not pass.
def _variant_matters(make_with, make_without, ids, am):
    a = make_with().eval()(input_ids=ids, attention_mask=am).logits
    b = make_without().eval()(input_ids=ids, attention_mask=am).logits
    d = (a - b).abs()[am.bool()].max().item()
    assert d > 100 * ATOL, f"the variant moves eager's logits by only {d:.3g}"


@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("family", ["gemma2_softcap", "gpt_oss_sinks"])
def test_softcap_and_sinks_models_logits_equal_eager(family, left):
    make, without = ((gemma2, lambda: gemma2(attn_logit_softcapping=None)) if family == "gemma2_softcap"
                     else (gpt_oss, lambda: gpt_oss(sinks=False)))
    ids, am = batch([12, 7, 3], 12, left)
    _variant_matters(make, without, ids, am)
    want, got = both(make(), lambda m: m(input_ids=ids, attention_mask=am).logits)
    close(got, want, am, what=f"{family} logits")


@pytest.mark.parametrize("make", [gemma2, gpt_oss], ids=["gemma2_softcap", "gpt_oss_sinks"])
def test_softcap_and_sinks_models_generate_equal_eager(make):
    """Left-padded prefill, then decode steps on the KV cache (sliding layers past their window)."""
    model = make()
    ids, am = batch([9, 5, 2], 9, left=True)
    kw = dict(attention_mask=am, max_new_tokens=8, do_sample=False, pad_token_id=0, output_scores=True,
              return_dict_in_generate=True)
    want, got = both(model, lambda m: m.generate(ids, **kw))
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.scores, want.scores)):
        close(a, b, what=f"{make.__name__} decode step {step} scores")


@pytest.mark.parametrize("make", [gemma2, gpt_oss], ids=["gemma2_softcap", "gpt_oss_sinks"])
def test_softcap_and_sinks_models_gradients_equal_eager(make):
    """Training step gradients of every parameter, the gpt-oss sink logits included."""
    model = make()
    ids, am = batch([12, 9], 12, left=False)
    labels = ids.masked_fill(am == 0, -100)

    def grads(m):
        m.zero_grad()
        m.train()
        m(input_ids=ids, attention_mask=am, labels=labels).loss.backward()
        m.eval()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    want, got = both(model, grads)
    assert want.keys() == got.keys()
    if make is gpt_oss:
        assert any(n.endswith("self_attn.sinks") for n in want)
    for n in want:
        scale = want[n].abs().max().item()
        err = (got[n] - want[n]).abs().max().item()
        assert err <= 1e-4 * scale + 1e-7, f"{n}: {err:.3g} vs scale {scale:.3g}"
    print(f"{make.__name__} gradients: {len(want)} tensors within 1e-4 of their scale")


def test_from_pretrained_with_qkv(tmp_path):
    model = llama()
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="qkv")
    assert loaded.config._attn_implementation == "qkv"
    ids, am = batch([7, 3], 7, left=True)
    model.set_attn_implementation("eager")
    close(loaded(input_ids=ids, attention_mask=am).logits, model(input_ids=ids, attention_mask=am).logits, am,
          what="from_pretrained")
