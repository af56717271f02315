"""cake.layers on CPU tensors: flash-linear-attention 0.6.0's parameters, the state-dict round
trip, the forward against a plain-torch float64 composition written here (with the delta rule of
reference.py, a token-by-token loop), gradients to every parameter, packed documents and padding,
and the training-loop features (checkpoint, save_for_backward, torch.compile, bf16 autocast).

Accuracy gate (bench/workloads.json): rel-RMS error <= 1e-2, max-abs error <= 2e-2 x max|ref|,
all finite. float64 layers are held much closer (1e-9): only the order of the sums differs.
"""

import pytest
import torch
import torch.nn.functional as F

import reference
from conftest import assert_rel
from cake.layers import (FusedRMSNormGated, GatedDeltaNet, KimiDeltaAttention, RMSNorm,
                         ShortConvolution, causal_conv1d)

D = 32
# Layer configurations: FLA's constructor arguments, small enough for the FP64 reference.
GDN_CONFIGS = {
    "gdn": dict(hidden_size=D, head_dim=8, num_heads=2),
    "gdn_gva_bias_neg": dict(hidden_size=D, head_dim=8, num_heads=2, num_v_heads=4,
                             conv_bias=True, allow_neg_eigval=True, expand_v=1),
    "gdn_no_gate": dict(hidden_size=D, head_dim=8, num_heads=2, use_gate=False),
    "gdn_sigmoid_gate": dict(hidden_size=D, head_dim=8, num_heads=1, num_v_heads=2,
                             output_gate_activation="sigmoid"),
}
KDA_CONFIGS = {
    "kda": dict(hidden_size=D, head_dim=8, num_heads=2),
    "kda_gva_expand": dict(hidden_size=D, head_dim=8, num_heads=1, num_v_heads=2, expand_v=2,
                           conv_bias=True, allow_neg_eigval=True),
    "kda_lower_bound": dict(hidden_size=D, head_dim=8, num_heads=2, safe_gate=True,
                            lower_bound=-5.0),
}
CONFIGS = {**{n: (GatedDeltaNet, c) for n, c in GDN_CONFIGS.items()},
           **{n: (KimiDeltaAttention, c) for n, c in KDA_CONFIGS.items()}}
DOCS = [0, 5, 0, 1, 2, 21]  # document lengths: empty, one token, shorter than the conv
CU = torch.tensor(DOCS).cumsum(0)


def make_layer(name, seed=0, dtype=torch.float64):
    cls, config = CONFIGS[name]
    torch.manual_seed(seed)
    layer = cls(**config).to(dtype)
    with torch.no_grad():  # weights large enough that every path matters in the comparison
        for p in layer.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
            elif p.dim() == 1 and p is not layer.A_log and p is not layer.dt_bias:
                p.uniform_(0.5, 1.5)
    return layer


def hidden(T, seed=1, dtype=torch.float64, B=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(dtype)


def assert_within_gate(actual, expected, what, rel_rms=1e-2, max_abs=2e-2):
    assert actual.shape == expected.shape, what
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    a, e = actual.double(), expected.double()
    err = a - e
    rms = (err.square().mean().sqrt() / e.square().mean().sqrt().clamp_min(1e-300)).item()
    worst = (err.abs().max() / e.abs().max().clamp_min(1e-300)).item()
    assert rms <= rel_rms and worst <= max_abs, \
        f"{what}: rel-RMS {rms:.2e} (<= {rel_rms:.0e}), max-abs {worst:.2e} x max|ref| " \
        f"(<= {max_abs:.0e})"


# ---------------------------------------------------------------------------------------------
# The plain-torch composition: every step spelt out from flash-linear-attention's layer maths.
# ---------------------------------------------------------------------------------------------

def plain_conv(x, weight, bias, cu):
    """Depthwise causal conv, a token and a tap at a time, never reading before a document's
    start; SiLU. x [T, C], weight [C, 1, W]."""
    W = weight.shape[-1]
    y = torch.zeros_like(x)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        for t in range(start, end):
            acc = bias.clone() if bias is not None else torch.zeros_like(x[0])
            for i in range(W):
                s = t - (W - 1) + i
                if s >= start:
                    acc = acc + weight[:, 0, i] * x[s]
            y[t] = F.silu(acc)
    return y


def plain_layer(layer, x, cu):
    """The layer's output [1, T, D] in float64 from its parameters (differentiable)."""
    p = {n: t.double() for n, t in layer.named_parameters()}
    cfg = layer
    x = x[0].double()
    lin = lambda name, y: y @ p[name + ".weight"].T  # noqa: E731
    q, k, v = (plain_conv(lin(n + "_proj", x), p[n + "_conv1d.weight"], p.get(n + "_conv1d.bias"),
                          cu) for n in "qkv")
    T, H, HV, K, V = x.shape[0], cfg.num_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
    q, k, v = q.view(1, T, H, K), k.view(1, T, H, K), v.view(1, T, HV, V)
    kda = isinstance(layer, KimiDeltaAttention)
    if kda:
        raw = (lin("f_proj.1", lin("f_proj.0", x))).view(1, T, HV, K) + p["dt_bias"].view(HV, K)
        A = p["A_log"].exp()[:, None]
        if layer.lower_bound is not None:
            g = layer.lower_bound * torch.sigmoid(A * raw)
        else:
            g = -A * F.softplus(raw)
    else:
        g = -p["A_log"].exp() * F.softplus(lin("a_proj", x).view(1, T, HV) + p["dt_bias"])
    beta = torch.sigmoid(lin("b_proj", x)).view(1, T, HV) * (2 if cfg.allow_neg_eigval else 1)
    o, _ = reference.recurrence(q, k, v, g, beta, kda=kda, cu_seqlens=cu, use_qk_l2norm=True)
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + cfg.norm_eps) * p["o_norm.weight"]
    if kda:
        gate = torch.sigmoid(lin("g_proj.1", lin("g_proj.0", x)) + p["g_proj.1.bias"])
    elif cfg.use_gate:
        gate = lin("g_proj", x)
        gate = torch.sigmoid(gate) if cfg.o_norm.activation == "sigmoid" else F.silu(gate)
    else:
        gate = torch.ones(T, HV * V, dtype=torch.float64)
    o = o * gate.view(1, T, HV, V)
    return lin("o_proj", o.reshape(T, HV * V)).unsqueeze(0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_plain_torch_float64(name):
    layer = make_layer(name)
    x = hidden(int(CU[-1]))
    o, attentions, cache = layer(x, cu_seqlens=CU)
    assert attentions is None and cache is None
    want = plain_layer(layer, x, CU)
    assert_within_gate(o, want, name, rel_rms=1e-9, max_abs=1e-9)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_match_plain_torch_float64(name):
    layer = make_layer(name)
    x = hidden(int(CU[-1])).requires_grad_()
    inputs = [x, *layer.parameters()]
    cotangent = hidden(int(CU[-1]), seed=2)
    got = torch.autograd.grad((layer(x, cu_seqlens=CU)[0] * cotangent).sum(), inputs)
    want = torch.autograd.grad((plain_layer(layer, x, CU) * cotangent).sum(), inputs)
    for pname, a, b in zip(["x", *(n for n, _ in layer.named_parameters())], got, want):
        assert_within_gate(a, b, f"d{pname}", rel_rms=1e-9, max_abs=1e-9)


@pytest.mark.parametrize("name", ["gdn_gva_bias_neg", "kda_lower_bound"])
def test_forward_float32_within_gate(name):
    layer = make_layer(name, dtype=torch.float32)
    x = hidden(int(CU[-1]), dtype=torch.float32)
    assert_within_gate(layer(x, cu_seqlens=CU)[0], plain_layer(layer, x, CU), name)


@pytest.mark.parametrize("name", ["gdn", "kda"])
def test_documents_do_not_leak(name):
    """Changing one document's tokens changes no other document's outputs."""
    layer = make_layer(name)
    x = hidden(int(CU[-1]))
    changed = x.clone()
    changed[:, int(CU[3]):int(CU[4])] += 1.0  # the fourth document (two tokens)
    o, o2 = layer(x, cu_seqlens=CU)[0], layer(changed, cu_seqlens=CU)[0]
    diff = (o - o2).abs().amax(-1)[0]
    inside = torch.zeros_like(diff, dtype=torch.bool)
    inside[int(CU[3]):int(CU[4])] = True
    assert (diff[~inside] == 0).all() and (diff[inside] > 0).all()


@pytest.mark.parametrize("name", ["gdn_gva_bias_neg", "kda"])
def test_padded_batch_equals_packed_documents(name):
    """attention_mask [B, T] (FLA's padding form) gives the packed form's outputs, zeros at pads."""
    layer = make_layer(name)
    lengths = [5, 9, 1]
    x = hidden(9, B=3)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    padded = layer(x, attention_mask=mask)[0]
    packed = layer(torch.cat([x[b:b + 1, :n] for b, n in enumerate(lengths)], 1),
                   cu_seqlens=torch.tensor([0, 5, 14, 15]))[0]
    assert torch.equal(padded[mask == 0], torch.zeros_like(padded[mask == 0]))
    assert torch.equal(padded[mask == 1], packed[0])
    # A mask with past columns in front (as FLA takes it): its last T columns count.
    wider = torch.cat([torch.ones(3, 4, dtype=torch.long), mask], 1)
    assert torch.equal(layer(x, attention_mask=wider)[0], padded)
    with pytest.raises(ValueError, match=r"attention_mask must be \[batch_size, seq_len\] = "
                                         r"\[3, >= 9\]"):
        layer(x, attention_mask=mask[:, 1:])


@pytest.mark.parametrize("name", ["gdn", "kda"])
def test_batch_rows_are_documents(name):
    layer = make_layer(name)
    x = hidden(7, B=2)
    rows = layer(x)[0]
    packed = layer(x.reshape(1, 14, D), cu_seqlens=torch.tensor([0, 7, 14]))[0]
    assert torch.equal(rows.reshape(1, 14, D), packed)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_reach_every_parameter(name):
    layer = make_layer(name)
    x = hidden(int(CU[-1])).requires_grad_()
    layer(x, cu_seqlens=CU)[0].square().sum().backward()
    for pname, p in [("x", x), *layer.named_parameters()]:
        assert p.grad is not None, f"{pname}: no gradient"
        assert torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, f"{pname}: {p.grad}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_state_dict_round_trip(name):
    a, b = make_layer(name, seed=0), make_layer(name, seed=1)
    x = hidden(int(CU[-1]))
    assert not torch.equal(a(x, cu_seqlens=CU)[0], b(x, cu_seqlens=CU)[0])
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x, cu_seqlens=CU)[0], b(x, cu_seqlens=CU)[0])


def test_inference_cache_is_refused():
    layer = make_layer("gdn")
    with pytest.raises(NotImplementedError, match="no inference cache"):
        layer(hidden(4), use_cache=True)
    with pytest.raises(NotImplementedError, match="no inference cache"):  # a cache, no flag
        layer(hidden(4), past_key_values=object())


def test_invalid_constructor_arguments():
    with pytest.raises(ValueError, match="num_v_heads"):
        GatedDeltaNet(hidden_size=D, head_dim=8, num_heads=2, num_v_heads=3)
    with pytest.raises(ValueError, match="mode"):
        KimiDeltaAttention(hidden_size=D, head_dim=8, num_heads=2, mode="parallel")
    with pytest.raises(ValueError, match="save_for_backward"):
        GatedDeltaNet(hidden_size=D, head_dim=8, num_heads=2, save_for_backward="all")
    with pytest.raises(ValueError, match=r"head_dim \* expand_v must be an integer, got 8 \* 1.3"):
        KimiDeltaAttention(hidden_size=D, head_dim=8, num_heads=2, expand_v=1.3)


def test_kda_safe_gate_reaches_the_op():
    # safe_gate promises g >= lower_bound >= -5: the op checks the bound, so the layer must pass
    # the flag along
    layer = KimiDeltaAttention(hidden_size=D, head_dim=8, num_heads=2, safe_gate=True,
                               lower_bound=-6.0).double()
    with pytest.raises(ValueError, match=r"lower_bound must be in the safe range \[-5, 0\), "
                                         r"got -6"):
        layer(hidden(5))


def test_host_offsets_are_dropped_with_a_mask():
    """A mask's documents are packed on the device: cu_seqlens_cpu (which describes other
    offsets) does not reach the op, and the call equals the one without it."""
    layer = make_layer("gdn")
    x = hidden(9, B=3)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for b, n in enumerate([5, 9, 1]):
        mask[b, :n] = 1
    want = layer(x, attention_mask=mask)[0]
    got = layer(x, attention_mask=mask, cu_seqlens_cpu=torch.tensor([0, 9, 18, 27]))[0]
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------
# flash-linear-attention 0.6.0's layers (constructed on the CPU: their forward needs a GPU)
# ---------------------------------------------------------------------------------------------

def fla_layers():
    fla = pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")
    import importlib.metadata
    assert importlib.metadata.version("flash-linear-attention") == "0.6.0"
    return {GatedDeltaNet: fla.GatedDeltaNet, KimiDeltaAttention: fla.KimiDeltaAttention}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameters_are_flas(name):
    """Names, shapes and dtypes of every parameter and buffer, and FLA's state dict loads."""
    cls, config = CONFIGS[name]
    fla_cls = fla_layers()[cls]
    ours, theirs = cls(**config), fla_cls(**config)
    shapes = lambda m: {n: (tuple(t.shape), t.dtype) for n, t in m.state_dict().items()}  # noqa
    assert shapes(ours) == shapes(theirs)
    ours.load_state_dict(theirs.state_dict())
    for n, t in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[n], t), n


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_seed_gives_flas_initial_weights(name):
    """Parameters are created in FLA's order from the same draws."""
    cls, config = CONFIGS[name]
    fla_cls = fla_layers()[cls]
    torch.manual_seed(7)
    ours = cls(**config)
    torch.manual_seed(7)
    theirs = fla_cls(**config)
    for n, t in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[n], t), n


def test_short_convolution_signatures_are_flas():
    import inspect
    fla = pytest.importorskip("fla.modules", reason="flash-linear-attention is not installed")
    from fla.modules.causal_conv1d.ops import causal_conv1d as fla_conv1d
    for ours, theirs in ((ShortConvolution.__init__, fla.ShortConvolution.__init__),
                         (ShortConvolution.forward, fla.ShortConvolution.forward)):
        ours, theirs = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        named = [n for n, p in theirs.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert list(ours)[:len(named)] == named
        for n in named:
            assert ours[n].default == theirs[n].default, n
    theirs = [n for n, p in inspect.signature(fla_conv1d).parameters.items()
              if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert list(inspect.signature(causal_conv1d).parameters) == theirs


@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
def test_default_arguments_are_flas(cls):
    import inspect
    fla_cls = fla_layers()[cls]
    ours = inspect.signature(cls.__init__).parameters
    theirs = inspect.signature(fla_cls.__init__).parameters
    for n, p in theirs.items():
        assert n in ours, f"{cls.__name__} lacks FLA's argument {n}"
        assert ours[n].default == p.default, n
    assert list(inspect.signature(cls.forward).parameters) == \
        list(inspect.signature(fla_cls.forward).parameters)


# ---------------------------------------------------------------------------------------------
# The short convolution on its own
# ---------------------------------------------------------------------------------------------

def test_conv_decoding_steps_update_the_cache_in_place():
    """As FLA's: without autograd, one token per sequence is a step that updates cache; the steps
    give the whole sequence's outputs and final state."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 6, generator=gen, dtype=torch.float64)
    conv = ShortConvolution(6, 4, bias=True).double()
    with torch.no_grad():
        whole, final = conv(x, output_final_state=True)
        cache = torch.zeros(2, 6, 4, dtype=torch.float64)
        steps = []
        for t in range(7):
            y, returned = conv(x[:, t:t + 1], cache=cache)
            assert returned is None
            steps.append(y)
        assert_rel(torch.cat(steps, 1), whole, 1e-12)
        assert_rel(cache, final, 1e-12)
        packed = torch.tensor([0, 1, 2])  # two one-token documents: a step too
        y, returned = conv(x[:1, :2], cache=cache, cu_seqlens=packed, output_final_state=True)
        assert returned is cache
        kept = cache.clone()  # a call of several tokens is no step: cache is its initial state
        conv(x[:, :3], cache=cache, output_final_state=True)
        assert torch.equal(cache, kept)
    with pytest.raises(ValueError, match="mask and cu_seqlens cannot be given together"):
        conv(x[:1], mask=torch.ones(1, 7), cu_seqlens=torch.tensor([0, 7]))


def test_conv_mask_zeroes_the_padded_inputs():
    # as FLA's: the mask multiplies x before the convolution (padding reads as zero tokens)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 7, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    conv = ShortConvolution(6, 4, bias=True).double()
    y, final = conv(x, mask=mask, output_final_state=True)
    want, want_final = conv(x * mask[..., None], output_final_state=True)
    assert torch.equal(y, want) and torch.equal(final, want_final)
    assert not torch.equal(y, conv(x)[0])


def test_conv_activation_names_are_flas():
    for activation in (None, "silu", "swish"):
        ShortConvolution(6, 4, activation=activation)
    with pytest.raises(ValueError, match=r"activation must be None, 'silu' or 'swish', got 'relu'"):
        ShortConvolution(6, 4, activation="relu")
    with pytest.raises(ValueError, match=r"backend must be 'triton' or 'cuda', got 'mix'"):
        ShortConvolution(6, 4, backend="mix")


def test_conv_equals_conv1d_per_document():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 29, 6, generator=gen, dtype=torch.float64)
    conv = ShortConvolution(6, 4, bias=True).double()
    y, final = conv(x, cu_seqlens=CU, output_final_state=True)
    for n, (s, e) in enumerate(zip(CU[:-1].tolist(), CU[1:].tolist())):
        doc = x[0, s:e].T.unsqueeze(0)                                     # [1, C, L]
        assert torch.equal(final[n], F.pad(doc, (4, 0))[0, :, -4:])  # zeros before the start
        if e > s:
            want = F.silu(F.conv1d(F.pad(doc, (3, 0)), conv.weight, conv.bias, groups=6))
            assert torch.allclose(y[0, s:e], want[0].T, rtol=0, atol=1e-12)


def test_conv_initial_state_continues_the_documents():
    """Two halves with the first's final state as the second's initial state give the whole."""
    gen = torch.Generator().manual_seed(4)
    a, b = (torch.randn(1, n, 5, generator=gen, dtype=torch.float64) for n in (9, 2))
    c, d = (torch.randn(1, n, 5, generator=gen, dtype=torch.float64) for n in (3, 7))
    w = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    whole, whole_final = causal_conv1d(torch.cat([a, b, c, d], 1), w, output_final_state=True,
                                       activation="silu", cu_seqlens=torch.tensor([0, 11, 21]))
    first, state = causal_conv1d(torch.cat([a, c], 1), w, output_final_state=True,
                                 activation="silu", cu_seqlens=torch.tensor([0, 9, 12]))
    second, final = causal_conv1d(torch.cat([b, d], 1), w, initial_state=state,
                                  output_final_state=True, activation="silu",
                                  cu_seqlens=torch.tensor([0, 2, 9]))
    assert torch.allclose(torch.cat([first[:, :9], second[:, :2], first[:, 9:], second[:, 2:]], 1),
                          whole, rtol=0, atol=1e-12)
    assert torch.equal(final, whole_final)


# ---------------------------------------------------------------------------------------------
# The output norms on their own
# ---------------------------------------------------------------------------------------------

def test_bf16_output_norms_are_the_float32_computation_rounded():
    """As FLA's: a bfloat16 input (and gate, and weight) is normalised in float32 and rounded to
    bfloat16 once, at the end."""
    gen = torch.Generator().manual_seed(8)
    x, g = (torch.randn(3, 5, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    weight = torch.empty(16).uniform_(0.5, 1.5, generator=gen).to(torch.bfloat16)
    x32 = x.float()
    normalised = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + 1e-5) * weight.float()
    plain = RMSNorm(16).to(torch.bfloat16)
    plain.weight.data.copy_(weight)
    assert torch.equal(plain(x), normalised.to(torch.bfloat16))
    for activation, act in (("swish", F.silu), ("sigmoid", torch.sigmoid)):
        gated = FusedRMSNormGated(16, activation=activation).to(torch.bfloat16)
        gated.weight.data.copy_(weight)
        got = gated(x, g)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, (normalised * act(g.float())).to(torch.bfloat16)), activation
    with pytest.raises(ValueError, match=r"activation must be one of .*, got 'relu'"):
        FusedRMSNormGated(16, activation="relu")


# ---------------------------------------------------------------------------------------------
# Training-loop features
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gdn", "kda"])
def test_activation_checkpoint_gives_the_same_gradients(name):
    layer = make_layer(name)
    x = hidden(int(CU[-1])).requires_grad_()

    def grads(fn):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        fn().square().sum().backward()
        return [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]

    plain = grads(lambda: layer(x, cu_seqlens=CU)[0])
    checkpointed = grads(lambda: torch.utils.checkpoint.checkpoint(
        lambda h: layer(h, cu_seqlens=CU)[0], x, use_reentrant=False))
    for a, b in zip(plain, checkpointed):
        assert torch.equal(a, b)


def test_save_for_backward_mode_reaches_the_op():
    """The layer's mode is what the op receives: every valid mode runs (the CPU reference
    recomputes in each, so the results agree bitwise), an invalid one set later is the op's
    ValueError."""
    layer = make_layer("gdn")
    x = hidden(int(CU[-1]))
    results = []
    for mode in ("saved", "inverse", "recompute", None):
        layer.save_for_backward = mode
        results.append(layer(x, cu_seqlens=CU)[0])
    assert all(torch.equal(results[0], r) for r in results)
    layer.save_for_backward = "everything"
    with pytest.raises(ValueError, match="save_for_backward"):
        layer(x.requires_grad_(), cu_seqlens=CU)


def _model(dtype):
    torch.manual_seed(0)
    return torch.nn.ModuleList([GatedDeltaNet(hidden_size=D, head_dim=8, num_heads=2),
                                KimiDeltaAttention(hidden_size=D, head_dim=8, num_heads=2)]
                               ).to(dtype)


def _run(model, x, cu):
    for layer in model:
        x = x + layer(x, cu_seqlens=cu)[0]
    return x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compile_has_no_graph_break(dtype):
    """torch.compile traces both layers in one graph (the ops' fake implementations) and gives
    eager's outputs and gradients (the same ops: equal up to rounding)."""
    model = _model(dtype)
    x = hidden(int(CU[-1]), dtype=dtype).requires_grad_()
    explanation = torch._dynamo.explain(_run)(model, x, CU)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(_run, backend="aot_eager", fullgraph=True)
    eager_out, compiled_out = _run(model, x, CU), compiled(model, x, CU)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert_within_gate(compiled_out, eager_out, "compiled output", tol, tol)
    eager_grads = torch.autograd.grad(eager_out.sum(), [x, *model.parameters()])
    compiled_grads = torch.autograd.grad(compiled_out.sum(), [x, *model.parameters()])
    for a, b in zip(eager_grads, compiled_grads):
        assert_within_gate(b, a, "compiled gradient", tol, tol)


def test_bf16_autocast():
    """Under CPU autocast the projections run in bfloat16; the outputs stay within the gate of
    the float32 model's, and every parameter gets a finite gradient."""
    model = _model(torch.float32)
    x = hidden(int(CU[-1]), dtype=torch.float32)
    want = _run(model, x, CU)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(model, x, CU)
        assert all(layer(x, cu_seqlens=CU)[0].dtype == torch.bfloat16 for layer in model)
    assert_within_gate(got, want, "autocast output")
    got.float().square().sum().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("name,layout,W", [("gdn_gva_bias_neg", "zigzag_per_document", 3),
                                          ("gdn", "contiguous", 4),
                                          ("kda_gva_expand", "zigzag", 2),
                                          ("kda_lower_bound", "zigzag_per_document", 4)])
def test_context_parallel_layer_equals_single_rank(name, layout, W):
    """A layer called on each rank's shard with cp_context (virtual ranks, FP64) gives the
    single-rank layer's output and x gradient on every token, and parameter gradients whose sum
    over ranks is the single-rank one; documents shorter than the convolution cross ranks."""
    import copy

    import cake.kcp as kcp

    docs = [0, 40, 3, 1, 70, 2, 30]
    cu = torch.tensor(docs).cumsum(0)
    layer = make_layer(name)
    x = hidden(cu[-1].item()).requires_grad_()
    dy = hidden(cu[-1].item(), seed=2)
    y, _, _ = layer(x, cu_seqlens=cu)
    (y * dy).sum().backward()
    want = {n: p.grad for n, p in layer.named_parameters()}

    def rank(ex):
        ctx = kcp.build_context(cu, exchange=ex, layout=layout)
        mine = copy.deepcopy(layer)  # each rank's own parameters and gradients
        mine.zero_grad(set_to_none=True)
        x_local = kcp.shard(x.detach(), ctx).requires_grad_()
        y_local, _, _ = mine(x_local, cp_context=ctx)
        (y_local * kcp.shard(dy, ctx)).sum().backward()
        return (kcp.unshard(y_local.detach(), ctx), kcp.unshard(x_local.grad, ctx),
                {n: p.grad for n, p in mine.named_parameters()})

    ranks = kcp.VirtualWorld(W, timeout=60.0).run(rank)
    for r, (y_r, dx_r, _) in enumerate(ranks):
        torch.testing.assert_close(y_r, y.detach(), rtol=1e-9, atol=1e-9, msg=f"y, rank {r}")
        torch.testing.assert_close(dx_r, x.grad, rtol=1e-9, atol=1e-9, msg=f"dx, rank {r}")
    for n, g in want.items():
        total = sum(r[2][n] for r in ranks)
        torch.testing.assert_close(total, g, rtol=1e-9, atol=1e-9, msg=f"d{n} over ranks")


def test_context_parallel_layer_argument_errors():
    import cake.kcp as kcp

    layer = make_layer("gdn")
    cu = torch.tensor([0, 10, 30])
    ctx = kcp.build_context(cu, world_size=1)
    x = hidden(30)
    with pytest.raises(ValueError, match="cp_context must be a cake.kcp.Context"):
        layer(x, cp_context="ctx")
    with pytest.raises(ValueError, match="pass neither attention_mask nor cu_seqlens"):
        layer(x, cp_context=ctx, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"\(nor cu_seqlens_cpu\)"):
        layer(x, cp_context=ctx, cu_seqlens_cpu=cu)
    with pytest.raises(ValueError, match="pass neither attention_mask nor cu_seqlens"):
        layer(x, cp_context=ctx, attention_mask=torch.ones(1, 30, dtype=torch.long))
    with pytest.raises(ValueError, match=r"hidden_states must be this rank's shard \[1, T_local = "
                                         r"30, hidden_size\]"):
        layer(x[:, :29], cp_context=ctx)


@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
def test_host_offsets_reach_the_op_as_segments(cls, monkeypatch):
    """cu_seqlens_cpu passed to a layer reaches its op: with the kernels' condition forced on the
    CPU (cake.segments), two long documents at 2 value heads go through the segment route (GDN;
    KDA's op runs the plain op, cake.segments says why), and the output and every gradient equal
    those of the call without it (float64)."""
    import cake.segments as segments

    taken, offered = [], []
    run, context_for = segments.run, segments.context_for
    monkeypatch.setattr(segments, "runs_kernels", lambda q: True)
    monkeypatch.setattr(segments, "run", lambda *a, **kw: taken.append(a[0].name) or run(*a, **kw))
    monkeypatch.setattr(segments, "context_for",
                        lambda *a: offered.append(a[4] is not None) or context_for(*a))
    torch.manual_seed(3)
    layer = cls(hidden_size=D, head_dim=8, num_heads=1, num_v_heads=2).double()
    cu = torch.tensor([0, 4000, 7500])
    x = hidden(7500)

    def step(**kwargs):
        layer.zero_grad(set_to_none=True)
        xd = x.detach().requires_grad_()
        o = layer(xd, cu_seqlens=cu, **kwargs)[0]
        o.square().sum().backward()
        return {"o": o.detach(), "dx": xd.grad, **{n: p.grad for n, p in layer.named_parameters()}}

    plain = step()
    assert taken == [] and not any(offered)
    routed = step(cu_seqlens_cpu=cu.clone())
    assert any(offered)
    assert len(taken) == (1 if cls is GatedDeltaNet else 0)
    for name, want in plain.items():
        err = (routed[name] - want).abs().max().item()
        assert err <= 1e-9 * max(want.abs().max().item(), 1e-30), name
