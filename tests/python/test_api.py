"""cake.chunk_gated_delta_rule and cake.chunk_kda on the CPU against reference.py (plain-torch FP64
token-by-token recurrence with autograd): outputs, final states and every gradient."""

import random

import pytest
import torch

import cake
import reference
from conftest import (assert_rel, assert_same_results, call_cake, call_reference,
                      check_against_reference, cotangents, gradients, leaf_names, leaves,
                      make_case, record_argument)

VARIANTS = [pytest.param(False, id="gdn"), pytest.param(True, id="kda")]
DOCS = [0, 30, 71, 100]  # three documents, one crossing a chunk boundary

# ---------------------------------------------------------------------------------------------
# Outputs and gradients against the reference, every option
# ---------------------------------------------------------------------------------------------

OPTION_SETS = {
    "plain": {},
    "l2norm": {"l2norm": True},
    "gate": {"gate": True},
    "gate_dt_bias": {"gate": True, "dt_bias": True},
    "beta_sigmoid": {"beta_sigmoid": True},
    "neg_eigval": {"beta_sigmoid": True, "allow_neg_eigval": True},
    "all": {"l2norm": True, "gate": True, "dt_bias": True, "beta_sigmoid": True,
            "allow_neg_eigval": True},
}


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_matches_reference_with_states(kda, option_set):
    t, opts = make_case(101, kda=kda, cu=DOCS, initial_state=True, **OPTION_SETS[option_set])
    check_against_reference(kda, t, opts, seed=101)


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("option_set", ["plain", "all"])
@pytest.mark.parametrize("initial_state", [False, True], ids=["no_h0", "h0"])
def test_matches_reference_without_final_state(kda, option_set, initial_state):
    t, opts = make_case(102, kda=kda, cu=DOCS, output_final_state=False,
                        initial_state=initial_state, **OPTION_SETS[option_set])
    check_against_reference(kda, t, opts, seed=102)


def _random_config(seed):
    r = random.Random(seed)
    kda = r.random() < 0.5
    cu = [0]
    for _ in range(r.randint(1, 4)):
        cu.append(cu[-1] + r.choice([0, 1, 2, r.randint(1, 140)]))
    cu[-1] = max(cu[-1], 1)
    H = r.choice([1, 2])
    gate = r.random() < 0.5
    kw = dict(kda=kda, cu=cu, H=H, HV=H * r.choice([1, 2, 3]), K=r.choice([1, 3, 8, 17]),
              V=r.choice([1, 5, 8, 16]), initial_state=r.random() < 0.7,
              l2norm=r.random() < 0.5, gate=gate, dt_bias=gate and r.random() < 0.5,
              beta_sigmoid=r.random() < 0.5, output_final_state=r.random() < 0.8)
    if kda and gate and r.random() < 0.5:
        kw.update(lower_bound=-r.uniform(0.5, 5), A_log=r.random() < 0.5)
    kw["allow_neg_eigval"] = kw["beta_sigmoid"] and r.random() < 0.5
    if r.random() < 0.3:
        kw["scale"] = r.uniform(-1, 2)
    return kw


@pytest.mark.parametrize("seed", range(16))
def test_random_configurations(seed):
    kw = _random_config(1500 + seed)
    t, opts = make_case(1500 + seed, **kw)
    check_against_reference(kw["kda"], t, opts, seed=1500 + seed)


KDA_LOWER_BOUND = {
    "A_log": {"A_log": True, "dt_bias": False},
    "A_log_dt_bias": {"A_log": True, "dt_bias": True},
    "no_A_log": {"A_log": False, "dt_bias": False},
    "no_A_log_dt_bias": {"A_log": False, "dt_bias": True},
}


@pytest.mark.parametrize("params", list(KDA_LOWER_BOUND))
def test_kda_lower_bound_gate(params):
    t, opts = make_case(103, kda=True, cu=DOCS, initial_state=True, gate=True, lower_bound=-3.0,
                        **KDA_LOWER_BOUND[params])
    assert ("A_log" in t) == KDA_LOWER_BOUND[params]["A_log"]
    check_against_reference(True, t, opts, seed=103)


def test_kda_lower_bound_is_applied():
    # The gate with a lower bound must differ from the softplus gate and stay in (lower_bound, 0).
    t, opts = make_case(104, kda=True, T=20, gate=True, lower_bound=-2.0)
    o_lb, _ = call_cake(True, t, opts)
    o_sp, _ = call_cake(True, t, {k: v for k, v in opts.items() if k != "lower_bound"})
    assert not torch.allclose(o_lb, o_sp)
    g = reference.gate(t["g"].detach(), t["A_log"], None, -2.0, kda=True)
    assert (g > -2.0).all() and (g < 0).all()


@pytest.mark.parametrize("kda", VARIANTS)
def test_custom_scale(kda):
    t, opts = make_case(105, kda=kda, cu=[0, 40, 90], initial_state=True, scale=0.37)
    check_against_reference(kda, t, opts, seed=105)


@pytest.mark.parametrize("kda", VARIANTS)
def test_default_scale_is_inverse_sqrt_k(kda):
    t, opts = make_case(106, kda=kda, T=12, K=16, V=8)
    o, _ = call_cake(kda, t, opts)
    o2, _ = call_cake(kda, t, dict(opts, scale=0.25))
    assert torch.equal(o, o2)
    o3, _ = call_cake(kda, t, dict(opts, scale=0.5))
    assert_rel(o3, 2 * o, 1e-12, "o at twice the scale")


@pytest.mark.parametrize("kda", VARIANTS)
def test_unequal_head_dims(kda):
    t, opts = make_case(107, kda=kda, cu=[0, 10, 75], K=12, V=5, initial_state=True,
                        l2norm=True)
    check_against_reference(kda, t, opts, seed=107)


# ---------------------------------------------------------------------------------------------
# Variable-length documents
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
def test_varlen_chunk_edges(kda):
    lengths = [1, 63, 64, 65, 130]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    t, opts = make_case(201, kda=kda, cu=cu, initial_state=True, gate=True, dt_bias=True)
    check_against_reference(kda, t, opts, seed=201)


@pytest.mark.parametrize("kda", VARIANTS)
def test_varlen_many_short_documents(kda):
    gen = torch.Generator().manual_seed(202)
    lengths = torch.randint(1, 6, (40,), generator=gen).tolist()
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    t, opts = make_case(202, kda=kda, cu=cu, initial_state=True, cu_dtype=torch.int32)
    check_against_reference(kda, t, opts, seed=202)


@pytest.mark.parametrize("kda", VARIANTS)
def test_varlen_single_token_documents(kda):
    t, opts = make_case(203, kda=kda, cu=list(range(0, 8)), initial_state=True, l2norm=True)
    check_against_reference(kda, t, opts, seed=203)


@pytest.mark.parametrize("kda", VARIANTS)
def test_varlen_zero_length_documents(kda):
    # Empty documents (first, middle, last): their final state is their initial state and the
    # gradient of the initial state is the gradient of the final state.
    cu = [0, 0, 5, 5, 70, 70]
    t, opts = make_case(204, kda=kda, cu=cu, initial_state=True)
    check_against_reference(kda, t, opts, seed=204)
    o, ht = call_cake(kda, t, opts)
    h0 = t["initial_state"]
    for n in (0, 2, 4):
        assert torch.equal(ht[n], h0[n].detach())
    do, dht = cotangents(o, ht, 204)
    dh0 = gradients(o, ht, do, dht, [h0])[0]
    for n in (0, 2, 4):
        assert_rel(dh0[n], dht[n], 1e-15, f"dh0 of empty document {n}")


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("B", [1, 2])
def test_empty_sequence(kda, B):
    # No tokens at all: o is empty and the final state is the initial state.
    t, opts = make_case(205, kda=kda, B=B, T=0, initial_state=True)
    o, ht = call_cake(kda, t, opts)
    assert o.shape == (B, 0, 2, 8)
    assert torch.equal(ht, t["initial_state"].detach())
    (dh0,) = torch.autograd.grad(ht.sum(), [t["initial_state"]])
    assert torch.equal(dh0, torch.ones_like(dh0))


# ---------------------------------------------------------------------------------------------
# Grouped value heads
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("ratio", [1, 2, 3])
def test_gva_ratios(kda, ratio):
    t, opts = make_case(300 + ratio, kda=kda, cu=[0, 17, 80], H=2, HV=2 * ratio,
                        initial_state=True, l2norm=True)
    check_against_reference(kda, t, opts, seed=300 + ratio)


@pytest.mark.parametrize("kda", VARIANTS)
def test_gva_head_mapping(kda):
    # Value heads hv = 0..2 read q/k head 0 and hv = 3..5 read head 1 (hv // (HV // H)):
    # changing k of head 1 changes exactly the outputs of value heads 3..5.
    t, opts = make_case(310, kda=kda, T=20, H=2, HV=6)
    o, _ = call_cake(kda, t, opts)
    k2 = t["k"].detach().clone()
    k2[:, :, 1] = torch.roll(k2[:, :, 1], 1, dims=-1)
    o2, _ = call_cake(kda, dict(t, k=k2), opts)
    assert torch.equal(o[:, :, :3], o2[:, :, :3])
    for hv in range(3, 6):
        assert not torch.allclose(o[:, :, hv], o2[:, :, hv]), hv


# ---------------------------------------------------------------------------------------------
# torch.autograd.gradcheck: every tensor input requires grad
# ---------------------------------------------------------------------------------------------

def _gradcheck(kda, t, opts):
    names = leaf_names(t)
    cu = t.get("cu_seqlens")

    def fn(*xs):
        tt = dict(zip(names, xs))
        if cu is not None:
            tt["cu_seqlens"] = cu
        o, ht = call_cake(kda, tt, opts)
        return (o, ht) if ht is not None else o

    assert torch.autograd.gradcheck(fn, tuple(leaves(t)), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("kda", VARIANTS)
def test_gradcheck_states_varlen(kda):
    t, opts = make_case(401, kda=kda, cu=[0, 2, 2, 7], H=1, HV=2, K=3, V=2,
                        initial_state=True)
    _gradcheck(kda, t, opts)


@pytest.mark.parametrize("kda", VARIANTS)
def test_gradcheck_all_transforms(kda):
    t, opts = make_case(402, kda=kda, cu=[0, 3, 6], H=1, HV=2, K=3, V=2, initial_state=True,
                        l2norm=True, gate=True, dt_bias=True, beta_sigmoid=True,
                        allow_neg_eigval=True)
    _gradcheck(kda, t, opts)


def test_gradcheck_kda_lower_bound():
    t, opts = make_case(403, kda=True, B=2, T=3, H=1, HV=2, K=3, V=2, initial_state=True,
                        gate=True, dt_bias=True, lower_bound=-4.0)
    _gradcheck(True, t, opts)


@pytest.mark.parametrize("kda", VARIANTS)
def test_gradcheck_batched_gva(kda):
    t, opts = make_case(404, kda=kda, B=2, T=4, H=1, HV=2, K=2, V=3, initial_state=True)
    _gradcheck(kda, t, opts)


@pytest.mark.parametrize("kda", VARIANTS)
def test_gradient_of_final_state_only(kda):
    # o unused: the backward gets no dout; final_state unused: no dht.
    t, opts = make_case(405, kda=kda, cu=[0, 9, 30], initial_state=True)
    o, ht = call_cake(kda, t, opts)
    ro, rht = call_reference(kda, t, opts)
    inputs = leaves(t)
    got = torch.autograd.grad(ht.square().sum(), inputs, allow_unused=True)
    want = torch.autograd.grad(rht.square().sum(), inputs, allow_unused=True)
    for name, a, b in zip(leaf_names(t), got, want):
        assert a is not None, name
        assert_rel(a, b if b is not None else torch.zeros_like(a), 1e-9, f"d{name}")
    o, ht = call_cake(kda, t, opts)
    ro, rht = call_reference(kda, t, opts)
    got = torch.autograd.grad(o.sum(), inputs, allow_unused=True)
    want = torch.autograd.grad(ro.sum(), inputs, allow_unused=True)
    for name, a, b in zip(leaf_names(t), got, want):
        assert_rel(a, b, 1e-9, f"d{name}")


# ---------------------------------------------------------------------------------------------
# Reduced precision inputs
# ---------------------------------------------------------------------------------------------

# Relative rounding error of one rounding to the dtype (half an ulp) with some slack.
ROUNDING = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
def test_low_precision_dtypes(kda, dtype):
    # The op computes in FP64 from the given values and rounds once when writing: outputs and
    # gradients in the input's dtype, within one rounding of the FP64 result on the same values.
    t, opts = make_case(501, kda=kda, cu=[0, 50, 90], initial_state=True, dtype=dtype,
                        l2norm=True)
    assert t["initial_state"].dtype == torch.float32
    o, ht = call_cake(kda, t, opts)
    assert o.dtype == dtype and ht.dtype == torch.float32
    exact = {n: x.detach().double().requires_grad_() for n, x in t.items() if x.is_floating_point()}
    exact["cu_seqlens"] = t["cu_seqlens"]
    ro, rht = call_cake(kda, exact, opts)
    assert ro.dtype == torch.float64
    ulp = ROUNDING[dtype]
    floor = 2.0 ** -24 if dtype == torch.float16 else 1e-300  # float16 subnormals
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert ((o.double() - ro).abs() <= ulp * ro.abs() + floor).all()
    assert ((ht.double() - rht).abs() <= 2.0 ** -24 * rht.abs() + 1e-300).all()
    do, dht = cotangents(ro, rht, 501)
    got = gradients(o, ht, do.to(dtype).double(), dht.float().double(), leaves(t))
    want = gradients(ro, rht, do.to(dtype).double(), dht.float().double(), leaves(exact))
    for name, x, a, b in zip(leaf_names(t), leaves(t), got, want):
        assert a.dtype == x.dtype, f"d{name}: {a.dtype} != {x.dtype}"
        tol = 2.0 ** -24 if x.dtype == torch.float32 else ulp
        assert torch.isfinite(a).all(), name
        assert ((a.double() - b).abs() <= tol * b.abs() + floor).all(), f"d{name}"


def test_mixed_dtypes_gate_and_beta_float32():
    # As in flash-linear-attention: bf16 q, k, v with float32 g and beta; each gradient takes its
    # input's dtype and o takes q's.
    t, opts = make_case(502, kda=False, T=40, dtype=torch.bfloat16)
    t["g"] = t["g"].detach().float().requires_grad_()
    t["beta"] = t["beta"].detach().float().requires_grad_()
    o, ht = call_cake(False, t, opts)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    grads = torch.autograd.grad(o.float().sum() + ht.sum(), leaves(t))
    for x, gr in zip(leaves(t), grads):
        assert gr.dtype == x.dtype and torch.isfinite(gr).all()
    ro, _ = call_reference(False, t, opts)
    assert ((o.double() - ro).abs() <= 2.0 ** -8 * ro.abs() + 1e-12).all()


# ---------------------------------------------------------------------------------------------
# Adversarial values
# ---------------------------------------------------------------------------------------------

def _set(t, **values):
    out = dict(t)
    for name, value in values.items():
        out[name] = torch.full_like(t[name], value).requires_grad_()
    return out


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("g_value", [-20.0, 0.0], ids=["g-20", "g0"])
def test_extreme_decay(kda, g_value):
    t, opts = make_case(601, kda=kda, cu=[0, 70, 200], initial_state=True)
    check_against_reference(kda, _set(t, g=g_value), opts, seed=601)


@pytest.mark.parametrize("kda", VARIANTS)
def test_extreme_decay_mixed(kda):
    # Strong decay in a few tokens only, elsewhere none: cumulative gates span -1000 in a chunk.
    t, opts = make_case(602, kda=kda, cu=[0, 150], initial_state=True)
    g = torch.zeros_like(t["g"])
    g[:, 3::7] = -50.0
    t["g"] = g.requires_grad_()
    check_against_reference(kda, t, opts, seed=602)


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("beta_value", [1e-9, 1.0 - 1e-9, 1.0], ids=["0", "1-", "1"])
def test_extreme_beta(kda, beta_value):
    t, opts = make_case(603, kda=kda, cu=[0, 65, 100], initial_state=True)
    check_against_reference(kda, _set(t, beta=beta_value), opts, seed=603)


@pytest.mark.parametrize("kda", VARIANTS)
def test_extreme_raw_gate_and_beta(kda):
    # Large raw inputs through softplus and sigmoid must not overflow.
    t, opts = make_case(604, kda=kda, cu=[0, 30, 70], gate=True, dt_bias=True,
                        beta_sigmoid=True, initial_state=True)
    g = t["g"].detach().clone()
    g[:, ::2] = 800.0
    g[:, 1::2] = -800.0
    beta = t["beta"].detach().clone()
    beta[:, ::3] = 800.0
    beta[:, 1::3] = -800.0
    t["g"], t["beta"] = g.requires_grad_(), beta.requires_grad_()
    check_against_reference(kda, t, opts, seed=604)


# ---------------------------------------------------------------------------------------------
# Layouts and equivalences
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
def test_state_v_first(kda):
    t, opts = make_case(701, kda=kda, cu=[0, 30, 90], K=8, V=5, initial_state=True)
    h0 = t["initial_state"]
    h0_vk = h0.detach().transpose(-1, -2).contiguous().requires_grad_()
    o, ht = call_cake(kda, t, opts)
    o2, ht2 = call_cake(kda, dict(t, initial_state=h0_vk), dict(opts, state_v_first=True))
    assert ht2.shape == (2, 2, 5, 8)
    assert torch.equal(o, o2)
    assert torch.equal(ht2.transpose(-1, -2), ht)
    do, dht = cotangents(o, ht, 701)
    (dh0,) = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), [h0])
    (dh0_vk,) = torch.autograd.grad((o2 * do).sum() + (ht2 * dht.transpose(-1, -2)).sum(), [h0_vk])
    assert torch.equal(dh0_vk.transpose(-1, -2), dh0)
    # without an initial state, the final state alone comes [N, HV, V, K]
    t.pop("initial_state")
    _, ht = call_cake(kda, t, opts)
    _, ht3 = call_cake(kda, t, dict(opts, state_v_first=True))
    assert torch.equal(ht3, ht.transpose(-1, -2))


@pytest.mark.parametrize("kda", VARIANTS)
def test_batch_equals_packed(kda):
    B, T = 3, 70
    tb, opts = make_case(702, kda=kda, B=B, T=T, initial_state=True, gate=True, dt_bias=True)
    packed = {n: (x.detach().reshape(1, B * T, *x.shape[2:]) if x.shape[:2] == (B, T)
                  else x.detach()).requires_grad_() for n, x in tb.items()}
    packed["cu_seqlens"] = torch.arange(0, B * T + 1, T)
    o, ht = call_cake(kda, tb, opts)
    o2, ht2 = call_cake(kda, packed, opts)
    assert_rel(o2.reshape(o.shape), o, 1e-13, "o")
    assert_rel(ht2, ht, 1e-13, "final_state")
    do, dht = cotangents(o, ht, 702)
    ga = gradients(o, ht, do, dht, leaves(tb))
    gb = gradients(o2, ht2, do.reshape(o2.shape), dht, leaves(packed))
    for name, a, b in zip(leaf_names(tb), ga, gb):
        assert_rel(b.reshape(a.shape), a, 1e-13, f"d{name}")
    # and both equal the reference
    check_against_reference(kda, tb, opts, seed=702)


@pytest.mark.parametrize("kda", VARIANTS)
def test_non_contiguous_inputs(kda):
    t, opts = make_case(703, kda=kda, cu=[0, 20, 50], initial_state=True, H=2, HV=2)
    views = {}
    for name, x in t.items():
        if name == "cu_seqlens":
            views[name] = x
            continue
        # the same values through a transposed buffer
        buf = x.detach().transpose(0, -1).contiguous().transpose(0, -1) if x.dim() > 1 else \
            x.detach().repeat_interleave(2)[::2]
        views[name] = buf.requires_grad_()
    assert not views["q"].is_contiguous()
    assert_same_results(call_cake(kda, t, opts), call_cake(kda, views, opts), t, views, 703)


@pytest.mark.parametrize("kda", VARIANTS)
def test_output_final_state_false_returns_none(kda):
    t, opts = make_case(704, kda=kda, T=10, output_final_state=False)
    o, ht = call_cake(kda, t, opts)
    assert ht is None and o.shape == (1, 10, 2, 8)


def test_gdn_equals_kda_with_constant_channel_decay():
    t, opts = make_case(705, kda=False, cu=[0, 33, 80], initial_state=True)
    o, ht = call_cake(False, t, opts)
    tk = dict(t, g=t["g"].detach()[..., None].expand(*t["g"].shape, 8).contiguous())
    o2, ht2 = call_cake(True, tk, opts)
    assert_rel(o2, o, 1e-12, "o")
    assert_rel(ht2, ht, 1e-12, "final_state")


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["fp64", "bf16"])
def test_deterministic(kda, dtype):
    t, opts = make_case(801, kda=kda, cu=[0, 64, 150], initial_state=True, dtype=dtype,
                        gate=True, dt_bias=True, l2norm=True)
    runs = []
    for _ in range(2):
        o, ht = call_cake(kda, t, opts)
        do, dht = cotangents(o, ht, 801)
        runs.append([o, ht, *gradients(o, ht, do, dht, leaves(t))])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# Larger problems
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
def test_long_document(kda):
    # Many chunks of one document, after a short one, with every transform.
    t, opts = make_case(1001, kda=kda, cu=[0, 5, 600], K=16, V=16, initial_state=True,
                        l2norm=True, gate=True, dt_bias=True, beta_sigmoid=True)
    check_against_reference(kda, t, opts, seed=1001)


@pytest.mark.parametrize("kda", VARIANTS)
def test_realistic_head_dims(kda):
    t, opts = make_case(1002, kda=kda, cu=[0, 100, 140], H=2, HV=4, K=64, V=64,
                        initial_state=True, l2norm=True)
    check_against_reference(kda, t, opts, seed=1002)


@pytest.mark.parametrize("kda", VARIANTS)
def test_largest_head_dims(kda):
    t, opts = make_case(1003, kda=kda, cu=[0, 3, 70], H=1, HV=1, K=256, V=256,
                        initial_state=True, l2norm=True)
    check_against_reference(kda, t, opts, seed=1003)


# ---------------------------------------------------------------------------------------------
# Saved, inverse and recompute modes (save_for_backward): the CPU reference always recomputes
# ---------------------------------------------------------------------------------------------

def test_cpu_accepts_every_save_mode():
    # The CPU reference always recomputes, so the mode only has to be accepted and change nothing
    # (the GPU claim, saved == inverse == recompute bitwise, is tests/python/test_gpu_gdn.py's).
    t, opts = make_case(1401, kda=False, cu=DOCS, initial_state=True, l2norm=True, gate=True)
    results = []
    for mode in ("saved", "inverse", "recompute", None):
        o, ht = call_cake(False, t, dict(opts, save_for_backward=mode))
        do, dht = cotangents(o, ht, 1401)
        results.append([o, ht, *gradients(o, ht, do, dht, leaves(t))])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("bad", ["save", "Saved", "", True, 1])
def test_save_for_backward_bad_value(bad):
    t, opts = make_case(1402, kda=False, cu=[0, 5, 12])
    message = "save_for_backward must be 'saved', 'inverse' or 'recompute'"
    with pytest.raises(ValueError, match=message):
        call_cake(False, t, dict(opts, save_for_backward=bad))
    with pytest.raises(ValueError, match=message):
        cake.set_default_save_for_backward(bad)


def test_set_default_save_for_backward():
    assert cake.set_default_save_for_backward("saved") == "inverse"
    try:
        with pytest.raises(ValueError, match="now 'saved'"):
            cake.set_default_save_for_backward("x")
        t, opts = make_case(1403, kda=False, cu=[0, 5, 12])
        call_cake(False, t, opts)
    finally:
        assert cake.set_default_save_for_backward("inverse") == "saved"


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("save", [0, 1, 2], ids=["recompute", "saved", "inverse"])
def test_saved_blob_is_empty_on_the_cpu(kda, save):
    # cake::forward's third output: the saved set, 0 bytes on the CPU in every mode, as the
    # query says (C++ cakeForwardSavedSize) and as the fake implementation says from shapes.
    t, _ = make_case(1404, kda=kda, cu=[0, 5, 12], initial_state=True, l2norm=True)
    args = (*_op_args(kda, t, {}, lambda x: x.detach()), 0.3, True, True, False, None, False,
            False, save, False)
    o, ht, saved = cake.ops._forward(*args)
    assert saved.dtype == torch.uint8 and saved.shape == (0,)
    q, v, cu = args[1], args[3], args[7]
    assert cake.ops._saved_bytes_of_shapes(int(kda), q, v, cu, True, save) == 0


def test_saved_mode_needs_a_gradient(monkeypatch):
    # Under no_grad, or with no input requiring grad, nothing is saved whatever the mode.
    calls = record_argument(monkeypatch, cake.ops, "_forward", -2)  # save_for_backward
    t, opts = make_case(1405, kda=False, cu=[0, 5, 12])
    call_cake(False, t, dict(opts, save_for_backward="saved"))
    with torch.no_grad():
        call_cake(False, t, dict(opts, save_for_backward="saved"))
    call_cake(False, {n: x.detach() for n, x in t.items()}, dict(opts, save_for_backward="saved"))
    call_cake(False, t, dict(opts, save_for_backward="recompute"))
    call_cake(False, t, dict(opts, save_for_backward="inverse"))
    assert calls == [1, 0, 0, 0, 2]


@pytest.mark.parametrize("kda", VARIANTS)
def test_deterministic_false_is_asked_for_and_checked(kda, monkeypatch):
    # deterministic=False reaches the op as options.unordered_sums, and only when given; the CPU
    # reference sums in a fixed order whatever it says, so its results are the default's.
    unordered = record_argument(monkeypatch, cake.ops, "_forward", -1)
    t, opts = make_case(1408, kda=kda, cu=[0, 5, 12], initial_state=True)
    want = call_cake(kda, t, opts)[0]
    got = call_cake(kda, t, dict(opts, deterministic=False))[0]
    assert unordered == [False, True]
    assert torch.equal(want, got)
    with pytest.raises(ValueError, match=r"^deterministic must be True or False, got 'no'"):
        call_cake(kda, t, dict(opts, deterministic="no"))


@pytest.mark.parametrize("kda", VARIANTS)
def test_unused_outputs_get_no_zero_gradients(kda, monkeypatch):
    # Autograd hands the backward None for outputs the loss does not use (the final state here,
    # and the saved set's blob always), not tensors of zeros that every backward would allocate
    # and fill (the blob is the saved set's size on CUDA); the gradients stay the reference's.
    dhts = record_argument(monkeypatch, cake.ops, "_backward", 11)
    t, opts = make_case(1407, kda=kda, cu=[0, 5, 12], initial_state=True)
    o, ht = call_cake(kda, t, dict(opts, output_final_state=True))
    do, _ = cotangents(o, ht, 1407)
    got = gradients(o, None, do, None, leaves(t))
    ro, _ = call_reference(kda, t, dict(opts, output_final_state=True))
    want = gradients(ro, None, do, None, leaves(t))
    assert dhts == [None]
    for name, a, b in zip(leaf_names(t), got, want):
        assert_rel(a, b, 1e-9, name)


def test_saved_buffer_plumbing():
    # cake.abi takes the saved set as an optional uint8 tensor; recompute mode refuses one.
    from cake import abi

    t, _ = make_case(1406, kda=False, cu=[0, 5, 12])
    x = {n: t[n].detach() for n in leaf_names(t)}
    ins = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, t["cu_seqlens"], None, None)
    o = torch.empty(1, 12, 2, 8, dtype=torch.float64)
    opts = (0, 0.3, False, False, None, False, False)
    blob = torch.empty(64, dtype=torch.uint8)
    for mode in (0, 1, 2):
        assert abi.forward_saved_size(*ins, o, None, *opts, mode, False) == 0
    with pytest.raises(ValueError, match="saved must be NULL in recompute mode"):
        abi.forward(*ins, o, None, *opts, 0, False, blob, None, 0)
    with pytest.raises(ValueError, match="options.save_for_backward must be 0"):
        abi.forward(*ins, o, None, *opts, 3, False, None, None, 0)
    for mode in (1, 2):
        abi.forward(*ins, o, None, *opts, mode, False, blob, None, 0)
        abi.forward(*ins, o, None, *opts, mode, False, None, None, 0)


def test_shape_only_saved_size_query():
    # The query the fake implementation uses; it needs a CUDA build, not a GPU. Layout as in
    # docs/design/gdn-hopper.md, each region 256-byte aligned: saved mode q, k normalised; their
    # rows' rstd; G; A; beta; h per chunk (130 // 64 + 1 + 1 = 4 slots); inverse mode the same
    # without h.
    from cake import abi
    from cake.options import GDN, KDA

    shapes = ([1, 130, 1, 128], [1, 130, 2, 128], 2, True)
    try:
        nbytes = abi.cuda_saved_size_of_shapes(GDN, *shapes, 1)
    except NotImplementedError as e:
        assert "without CUDA" in str(e)
        pytest.skip("needs a build with CUDA (CAKE_CUDA=ON); no GPU needed")
    up = lambda n: -(-n // 256) * 256  # noqa: E731
    qk = 2 * up(130 * 128 * 2) + 2 * up(130 * 4)
    assert nbytes == (qk + up(130 * 2 * 4) + up(130 * 2 * 64 * 2) + up(130 * 2 * 4)
                      + 4 * 2 * 128 * 128 * 2)
    inverse = up(130 * 2 * 4) + up(130 * 2 * 64 * 2) + 130 * 2 * 4
    assert abi.cuda_saved_size_of_shapes(GDN, *shapes, 2) == qk + inverse
    assert abi.cuda_saved_size_of_shapes(GDN, *shapes[:3], False, 2) == inverse  # no q, k there
    assert abi.cuda_saved_size_of_shapes(GDN, *shapes, 0) == 0
    with pytest.raises(ValueError, match="K = V = 128"):
        abi.cuda_saved_size_of_shapes(GDN, [1, 130, 1, 64], [1, 130, 2, 64], None, True, 1)
    # KDA (docs/design/kda-hopper.md): saved mode: q, k normalised; their rows' rstd; G's last row
    # per chunk [slots, HV, K]; A; beta; P; qg, kg, kbar; h per chunk. Inverse mode: G's last rows,
    # A, beta, P (the chunk pass's products). Recompute mode keeps nothing.
    kda = abi.cuda_saved_size_of_shapes(KDA, *shapes, 1)
    assert kda == (qk + up(4 * 2 * 128 * 4) + up(130 * 2 * 64 * 2)
                   + up(130 * 2 * 4) + up(130 * 2 * 64 * 2) + 3 * up(130 * 2 * 128 * 2)
                   + 4 * 2 * 128 * 128 * 2)
    kda_inverse = (up(4 * 2 * 128 * 4) + up(130 * 2 * 64 * 2) + up(130 * 2 * 4)
                   + 130 * 2 * 64 * 2)
    assert abi.cuda_saved_size_of_shapes(KDA, *shapes, 2) == kda_inverse
    assert abi.cuda_saved_size_of_shapes(KDA, *shapes[:3], False, 2) == kda_inverse
    assert abi.cuda_saved_size_of_shapes(KDA, *shapes, 0) == 0


# ---------------------------------------------------------------------------------------------
# torch.library contracts: schema, fake (meta) implementations, autograd, torch.compile
# ---------------------------------------------------------------------------------------------

def _op_args(kda, t, opts, transform=lambda x: x.detach()):
    return (int(kda), *(transform(t[n]) if n in t else None
                        for n in ("q", "k", "v", "g", "beta", "initial_state")),
            t.get("cu_seqlens"), *(transform(t[n]) if n in t else None
                                   for n in ("A_log", "dt_bias")))


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("output_final_state", [True, False])
@pytest.mark.parametrize("save_for_backward", [0, 1, 2], ids=["recompute", "saved", "inverse"])
def test_opcheck_forward(kda, output_final_state, save_for_backward):
    t, opts = make_case(1101, kda=kda, cu=[0, 5, 12], initial_state=True, gate=True,
                        dt_bias=True, l2norm=True)
    args = (*_op_args(kda, t, opts, lambda x: x), 0.3, output_final_state, True, True, None,
            False, False, save_for_backward, False)
    torch.library.opcheck(cake.ops._forward, args)


def _backward_args(kda, t, transform, *, gate, beta_sigmoid, mode=0, saved=None):
    HV = t["v"].shape[2]
    gen = torch.Generator().manual_seed(1)
    dout = torch.randn(1, 12, HV, 8, dtype=torch.float64, generator=gen)
    dht = torch.randn(2, HV, 8, 8, dtype=torch.float64, generator=gen)
    return (*_op_args(kda, t, {}, transform), dout, dht, 0.3, True, gate, None, beta_sigmoid,
            beta_sigmoid, mode, False, saved)


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["recompute", "saved", "inverse"])
def test_opcheck_backward(kda, mode):
    # On the CPU the saved set of saved and inverse modes is an empty blob: the reference
    # recomputes.
    t, _ = make_case(1102, kda=kda, cu=[0, 5, 12], initial_state=True, gate=True, dt_bias=True,
                     beta_sigmoid=True)
    blob = torch.empty(0, dtype=torch.uint8) if mode else None
    args = _backward_args(kda, t, lambda x: x.detach(), gate=True, beta_sigmoid=True, mode=mode,
                          saved=blob)
    torch.library.opcheck(cake.ops._backward, args)


def _head_first(x):
    """The same values in a permuted (dense, non-contiguous) buffer, e.g. q.transpose(1, 2) of a
    head-first [B, H, T, K] tensor."""
    x = x.detach()
    if x.dim() < 3:
        return x
    return x.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("kda", VARIANTS)
def test_opcheck_backward_permuted_inputs(kda):
    t, _ = make_case(1103, kda=kda, cu=[0, 5, 12], H=2, HV=2, initial_state=True)
    args = _backward_args(kda, t, _head_first, gate=False, beta_sigmoid=False)
    assert not args[1].is_contiguous()
    try:
        torch.library.opcheck(cake.ops._backward, args, test_utils=("test_faketensor",))
    except Exception as e:  # OpCheckError lives in torch.testing._internal
        if "Stride mismatch" in str(e):
            raise AssertionError(str(e)) from e
        raise


@pytest.mark.parametrize("kda", VARIANTS)
def test_compile_aot_eager(kda):
    # Traced through the fake implementations and the registered autograd: same numbers as eager.
    t, opts = make_case(1104, kda=kda, cu=[0, 7, 20], initial_state=True, gate=True,
                        dt_bias=True)
    names = leaf_names(t)

    def fn(*xs):
        return call_cake(kda, dict(zip(names, xs), cu_seqlens=t["cu_seqlens"]), opts)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    assert_same_results(fn(*leaves(t)), compiled(*leaves(t)), t, t, 1104)


def test_double_backward_is_refused_clearly():
    t, opts = make_case(1106, kda=False, cu=[0, 5, 12])
    q = t["q"].detach().requires_grad_()
    o, _ = call_cake(False, dict(t, q=q), opts)
    (dq,) = torch.autograd.grad(o.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        dq.sum().backward()
    x = torch.randn(1, 9, 4, dtype=torch.float64, requires_grad=True)
    y, _ = cake.causal_conv1d(x, torch.randn(4, 3, dtype=torch.float64), activation="silu")
    (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        dx.sum().backward()


def test_compile_dynamic_lengths_share_one_graph(monkeypatch):
    """With dynamic shapes, where the CUDA path keeps a saved set (simulated here on the CPU),
    its size in the fake is a symbol of its own: three sequence lengths, one graph."""
    from torch._dynamo.testing import CompileCounterWithBackend
    monkeypatch.setattr(cake.ops, "_saves", lambda device: True)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def step(q, k, v, g, beta):
        o, _ = cake.chunk_gated_delta_rule(q, k, v, g, beta, save_for_backward="inverse")
        return o.sum()

    compiled = torch.compile(step, backend=counter, dynamic=True, fullgraph=True)
    gen = torch.Generator().manual_seed(1105)
    for T in (64, 96, 160):
        # K = V = 128, the CUDA kernels' head dims, so that a concrete size query would answer
        q, k, v = (torch.randn(1, T, 1, 128, dtype=torch.float64, generator=gen) / 11
                   for _ in range(3))
        g = -torch.rand(1, T, 1, dtype=torch.float64, generator=gen)
        beta = torch.rand(1, T, 1, dtype=torch.float64, generator=gen)
        leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]
        compiled(*leaves).backward()
        assert all(x.grad is not None for x in leaves)
    assert counter.frame_count == 1
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# Memory layouts of the inputs: broadcast (stride 0), offsets into larger buffers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
def test_broadcast_inputs(kda):
    # beta and g broadcast over tokens (stride 0), A_log/dt_bias broadcast over heads.
    t, opts = make_case(1201, kda=kda, cu=[0, 9, 40], initial_state=True, gate=True,
                        dt_bias=True)
    gen = torch.Generator().manual_seed(1201)
    beta_row = torch.rand(1, 1, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    g_row = torch.randn(1, 1, *t["g"].shape[2:], generator=gen, dtype=torch.float64,
                        requires_grad=True)
    a_log_one = torch.randn(1, generator=gen, dtype=torch.float64, requires_grad=True)
    views = dict(t, beta=beta_row.expand(1, 40, 2), g=g_row.expand(*t["g"].shape),
                 A_log=a_log_one.expand(2))
    dense = dict(t, **{n: views[n].detach().contiguous().requires_grad_()
                       for n in ("beta", "g", "A_log")})
    assert views["beta"].stride(1) == 0
    o, ht = call_cake(kda, views, opts)
    o2, ht2 = call_cake(kda, dense, opts)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    do, dht = cotangents(o, ht, 1201)
    got = gradients(o, ht, do, dht, [beta_row, g_row, a_log_one])
    want = gradients(o2, ht2, do, dht, [dense["beta"], dense["g"], dense["A_log"]])
    assert_rel(got[0], want[0].sum(1, keepdim=True), 1e-12, "dbeta")
    assert_rel(got[1], want[1].sum(1, keepdim=True), 1e-12, "dg")
    assert_rel(got[2], want[2].sum(0, keepdim=True), 1e-12, "dA_log")


@pytest.mark.parametrize("kda", VARIANTS)
def test_inputs_at_offsets_in_larger_buffers(kda):
    # Slices of larger tensors: data pointers with storage offsets, strides of the big buffers.
    t, opts = make_case(1202, kda=kda, cu=[0, 20, 50], initial_state=True)
    sliced = {"cu_seqlens": t["cu_seqlens"]}
    for name in leaf_names(t):
        x = t[name].detach()
        big = torch.full((x.shape[0] + 1, *(s + 3 for s in x.shape[1:])), float("nan"),
                         dtype=x.dtype)
        index = (slice(1, None), *(slice(2, 2 + s) for s in x.shape[1:]))
        big[index] = x
        sliced[name] = big[index].requires_grad_()
        assert sliced[name].storage_offset() > 0
    assert_same_results(call_cake(kda, t, opts), call_cake(kda, sliced, opts), t, sliced, 1202)


@pytest.mark.parametrize("kda", VARIANTS)
def test_cu_seqlens_layouts(kda):
    t, opts = make_case(1203, kda=kda, cu=[0, 3, 8, 40], initial_state=True)
    o, ht = call_cake(kda, t, opts)
    for cu in (torch.tensor([0, 99, 3, 99, 8, 99, 40])[::2],       # strided
               torch.tensor([7, 0, 3, 8, 40], dtype=torch.int32)[1:],  # offset
               torch.tensor([0, 3, 8, 40], dtype=torch.int32)):
        o2, ht2 = call_cake(kda, dict(t, cu_seqlens=cu), opts)
        assert torch.equal(o, o2) and torch.equal(ht, ht2), cu


@pytest.mark.parametrize("kda", VARIANTS)
def test_zero_vectors_with_l2norm(kda):
    # q = k = 0 in some tokens: the L2 norm divides by sqrt(0 + 1e-6), nothing blows up.
    t, opts = make_case(1204, kda=kda, cu=[0, 10, 30], initial_state=True, l2norm=True)
    q, k = t["q"].detach().clone(), t["k"].detach().clone()
    q[:, ::3] = 0
    k[:, 1::4] = 0
    check_against_reference(kda, dict(t, q=q.requires_grad_(), k=k.requires_grad_()), opts,
                            seed=1204)


# ---------------------------------------------------------------------------------------------
# Concurrency: the op releases the GIL; concurrent calls give the sequential results
# ---------------------------------------------------------------------------------------------

def test_concurrent_calls():
    from concurrent.futures import ThreadPoolExecutor

    cases = [make_case(1300 + i, kda=bool(i % 2), cu=[0, 30, 70], initial_state=True,
                       gate=True) for i in range(6)]

    def run(i):
        t, opts = cases[i]
        o, ht = call_cake(bool(i % 2), t, opts)
        do, dht = cotangents(o, ht, i)
        return [o, ht, *gradients(o, ht, do, dht, leaves(t))]

    sequential = [run(i) for i in range(6)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        concurrent = list(pool.map(run, range(6)))
    for a, b in zip(sequential, concurrent):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
