"""Bad input raises ValueError (TypeError, NotImplementedError where the API says so) whose message
names the argument and shows what was expected and what came."""

import re

import pytest
import torch

import cake

F64 = torch.float64
B, T, H, HV, K, V = 1, 8, 1, 2, 4, 6


def inputs(kda=False, *, B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=F64, device="cpu"):
    gen = torch.Generator().manual_seed(B * 1000 + T * 100 + H * 10 + HV + K + V)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype=dtype, device=device)

    q, k = randn(B, T, H, K), randn(B, T, H, K)
    v = randn(B, T, HV, V)
    g = -randn(B, T, HV, K).abs() if kda else -randn(B, T, HV).abs()
    beta = randn(B, T, HV).sigmoid()
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


def call(kda, t, **kwargs):
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    return fn(t["q"], t["k"], t["v"], t["g"], t["beta"], **kwargs)


def raises(kda, t, pattern, exc=ValueError, **kwargs):
    with pytest.raises(exc, match=pattern):
        call(kda, t, **kwargs)


def lit(s):
    return re.escape(s)


VARIANTS = [pytest.param(False, id="gdn"), pytest.param(True, id="kda")]


def test_valid_inputs_pass():
    # The baseline of every case below is accepted.
    for kda in (False, True):
        o, ht = call(kda, inputs(kda), output_final_state=True)
        assert o.shape == (B, T, HV, V) and ht.shape == (1, HV, K, V)
        assert torch.isfinite(o).all()


# --------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
def test_q_rank(kda):
    t = inputs(kda)
    t["q"] = t["q"][0]
    raises(kda, t, r"q must have 4 dimensions.*got shape " + lit("[8, 1, 4]"))


@pytest.mark.parametrize("kda", VARIANTS)
def test_k_shape(kda):
    t = inputs(kda)
    t["k"] = torch.zeros(B, T, H, K + 1, dtype=F64)
    raises(kda, t, r"^k must have shape .*" + lit("[1, 8, 1, 4], got [1, 8, 1, 5]"))
    t["k"] = torch.zeros(B, T, H, dtype=F64)
    raises(kda, t, r"^k must have shape .*" + lit("[1, 8, 1, 4], got [1, 8, 1]"))


@pytest.mark.parametrize("kda", VARIANTS)
def test_v_shape(kda):
    t = inputs(kda)
    t["v"] = torch.zeros(B, T - 1, HV, V, dtype=F64)
    raises(kda, t, r"^v must have shape \[B, T, HV, V\].*T = 8.*got " + lit("[1, 7, 2, 6]"))
    t["v"] = torch.zeros(B, T, HV, dtype=F64)
    raises(kda, t, r"^v must have shape \[B, T, HV, V\].*got " + lit("[1, 8, 2]"))


def test_g_shape_gdn():
    t = inputs(False)
    t["g"] = torch.zeros(B, T, HV, K, dtype=F64)  # KDA's shape
    raises(False, t, r"^g must have shape \[B, T, HV\].*" + lit("[1, 8, 2], got [1, 8, 2, 4]"))


def test_g_shape_kda():
    t = inputs(True)
    t["g"] = torch.zeros(B, T, HV, dtype=F64)  # GDN's shape
    raises(True, t, r"^g must have shape \[B, T, HV, K\].*" + lit("[1, 8, 2, 4], got [1, 8, 2]"))
    t["g"] = torch.zeros(B, T, HV, K + 1, dtype=F64)
    raises(True, t, r"^g must have shape .*" + lit("[1, 8, 2, 4], got [1, 8, 2, 5]"))


@pytest.mark.parametrize("kda", VARIANTS)
def test_beta_shape(kda):
    t = inputs(kda)
    t["beta"] = torch.zeros(B, T, HV + 1, dtype=F64)
    raises(kda, t, r"^beta must have shape \[B, T, HV\].*" + lit("[1, 8, 2], got [1, 8, 3]"))
    t["beta"] = torch.zeros(B, T, HV, 1, dtype=F64)
    raises(kda, t, r"^beta must have shape .*" + lit("[1, 8, 2], got [1, 8, 2, 1]"))


@pytest.mark.parametrize("kda", VARIANTS)
def test_h_does_not_divide_hv(kda):
    t = inputs(kda, H=2, HV=3)
    raises(kda, t, r"HV \(v\.shape\[2\] = 3\).*multiple.*H \(q\.shape\[2\] = 2\)")


@pytest.mark.parametrize("kda", VARIANTS)
def test_head_dim_too_large_on_cpu(kda):
    raises(kda, inputs(kda, K=257), r"head dims must be in \[1, 256\].*K = 257, V = 6")
    raises(kda, inputs(kda, V=300), r"head dims must be in \[1, 256\].*K = 4, V = 300")


def test_largest_head_dim_accepted():
    o, _ = call(False, inputs(False, T=3, K=256, V=256))
    assert o.shape == (1, 3, 2, 256) and torch.isfinite(o).all()


def test_zero_head_dim():
    raises(False, inputs(False, K=0), r"head dims must be in \[1, 256\].*K = 0")


def test_scalar_q():
    t = inputs(False)
    t["q"] = torch.tensor(1.0, dtype=F64)
    raises(False, t, r"q must have 4 dimensions.*got shape \[\]")


def test_q_too_many_dims():
    t = inputs(False)
    t["q"] = t["q"][None, None]
    raises(False, t, r"^q has 6 dimensions \(shape " + lit("[1, 1, 1, 8, 1, 4]"))


# --------------------------------------------------------------------------------------------
# Dtypes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_integer_input(kda, name):
    t = inputs(kda)
    t[name] = t[name].to(torch.int32)
    raises(kda, t, rf"^{name} must be a float tensor .*got int32")
    t[name] = t[name].to(torch.int64)
    raises(kda, t, rf"^{name} must be a float tensor .*got int64")


@pytest.mark.parametrize("dtype", [torch.int16, torch.bool])
def test_unsupported_dtype_names_argument(dtype):
    t = inputs(False)
    t["beta"] = t["beta"].to(dtype)
    raises(False, t, r"beta.*" + str(dtype).replace("torch.", ""))


@pytest.mark.parametrize("kda", VARIANTS)
def test_qkv_dtype_mismatch(kda):
    t = inputs(kda)
    t["k"] = t["k"].float()
    raises(kda, t, r"q, k and v must have the same dtype, got q float64, k float32, v float64")
    t = inputs(kda)
    t["v"] = t["v"].to(torch.bfloat16)
    raises(kda, t, r"q, k and v must have the same dtype, got q float64, k float64, v bfloat16")


@pytest.mark.parametrize("kda", VARIANTS)
def test_float32_g_and_beta_with_bf16_qkv_accepted(kda):
    t = inputs(kda, dtype=torch.bfloat16)
    t["g"], t["beta"] = t["g"].float(), t["beta"].float()
    o, _ = call(kda, t)
    assert o.dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("name", ["k", "g", "initial_state", "A_log", "dt_bias", "cu_seqlens"])
def test_meta_tensor_among_cpu_tensors(kda, name):
    # Every optional tensor too: the gate parameters (read with use_gate_in_kernel) and
    # cu_seqlens would otherwise send the call to the shape-only fake implementation.
    t = inputs(kda)
    kwargs = {"initial_state": torch.zeros(2, HV, K, V, dtype=F64),
              "A_log": torch.zeros(HV, dtype=F64),
              "dt_bias": torch.zeros(HV * K if kda else HV, dtype=F64),
              "cu_seqlens": torch.tensor([0, 3, 8]), "use_gate_in_kernel": True}
    if name in kwargs:
        kwargs[name] = kwargs[name].to("meta")
    else:
        t[name] = t[name].to("meta")
    raises(kda, t, rf"^{name} must be on q's device \(cpu\), got meta", **kwargs)


def test_meta_q_among_cpu_tensors():
    t = inputs(False)
    t["q"] = t["q"].to("meta")
    raises(False, t, r"(device|meta).*(cpu|meta)")


@pytest.mark.parametrize("kda", VARIANTS)
def test_all_meta_inputs(kda):
    # Meta tensors only: a clear error, or shape inference (meta outputs of the right shapes).
    t = inputs(kda, device="meta")
    try:
        o, ht = call(kda, t, output_final_state=True)
    except (ValueError, NotImplementedError) as e:
        assert "meta" in str(e)
        return
    assert o.device.type == "meta" and o.shape == (B, T, HV, V) and o.dtype == F64
    assert ht.device.type == "meta" and ht.shape == (1, HV, K, V)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.gpu
def test_cuda_tensor_among_cpu_tensors():
    t = inputs(False)
    t["beta"] = t["beta"].cuda()
    with pytest.raises((ValueError, RuntimeError), match=r"(beta|device|cuda)"):
        call(False, t)


# --------------------------------------------------------------------------------------------
# cu_seqlens
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cu_seqlens_contents(kda, dtype):
    t = inputs(kda)
    cu = lambda *xs: torch.tensor(xs, dtype=dtype)  # noqa: E731
    raises(kda, t, r"^cu_seqlens must start at 0, got 1", cu_seqlens=cu(1, 3, 8))
    raises(kda, t, r"^cu_seqlens must start at 0, got -2", cu_seqlens=cu(-2, 3, 8))
    raises(kda, t, lit("cu_seqlens must be non-decreasing, got cu_seqlens[1] = 5 > "
                       "cu_seqlens[2] = 3"), cu_seqlens=cu(0, 5, 3, 8))
    raises(kda, t, r"^cu_seqlens must end at the number of tokens T = 8, got 7",
           cu_seqlens=cu(0, 3, 7))
    raises(kda, t, r"^cu_seqlens must end at the number of tokens T = 8, got 9",
           cu_seqlens=cu(0, 3, 9))


@pytest.mark.parametrize("kda", VARIANTS)
def test_cu_seqlens_dtype_and_shape(kda):
    t = inputs(kda)
    raises(kda, t, r"^cu_seqlens must be int32 or int64, got float32",
           cu_seqlens=torch.tensor([0.0, 8.0]))
    raises(kda, t, r"^cu_seqlens must be int32 or int64, got float64",
           cu_seqlens=torch.tensor([0.0, 8.0], dtype=F64))
    raises(kda, t, r"^cu_seqlens must have shape \[N \+ 1\].*got shape " + lit("[1, 2]"),
           cu_seqlens=torch.tensor([[0, 8]]))
    raises(kda, t, r"^cu_seqlens must have shape \[N \+ 1\].*got shape " + lit("[1]"),
           cu_seqlens=torch.tensor([0]))


@pytest.mark.parametrize("kda", VARIANTS)
def test_cu_seqlens_with_batch(kda):
    t = inputs(kda, B=2)
    raises(kda, t, r"batch size B must be 1 when cu_seqlens is given.*got B = 2",
           cu_seqlens=torch.tensor([0, 8]))


# --------------------------------------------------------------------------------------------
# States
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
def test_initial_state_shape(kda):
    t = inputs(kda)
    raises(kda, t, r"^initial_state must have shape \[N, HV, K, V\] = " +
           lit("[1, 2, 4, 6], got [1, 2, 6, 4]"), initial_state=torch.zeros(1, HV, V, K))
    raises(kda, t, r"^initial_state must have shape .*" + lit("[2, 2, 4, 6], got [1, 2, 4, 6]"),
           initial_state=torch.zeros(1, HV, K, V), cu_seqlens=torch.tensor([0, 3, 8]))
    raises(kda, t, r"^initial_state must have shape .*" + lit("[1, 2, 4, 6], got [2, 4, 6]"),
           initial_state=torch.zeros(HV, K, V))
    raises(kda, t, r"^initial_state must be a float tensor .*got int64",
           initial_state=torch.zeros(1, HV, K, V, dtype=torch.int64))


def test_initial_state_shape_state_v_first():
    raises(False, inputs(False), r"initial_state.*" + lit("[1, 2, 6, 4]") + r".*got " +
           lit("[1, 2, 4, 6]"), initial_state=torch.zeros(1, HV, K, V), state_v_first=True)


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scale(kda, scale):
    raises(kda, inputs(kda), rf"^scale must be a finite number, got {scale}", scale=scale)


@pytest.mark.parametrize("kda", VARIANTS)
def test_a_log_missing_with_gate_in_kernel(kda):
    raises(kda, inputs(kda), r"^A_log \[HV\] is required with use_gate_in_kernel=True",
           use_gate_in_kernel=True)
    raises(kda, inputs(kda), r"^A_log \[HV\] is required with use_gate_in_kernel=True",
           use_gate_in_kernel=True, dt_bias=torch.zeros(HV * K if kda else HV, dtype=F64))


@pytest.mark.parametrize("kda", VARIANTS)
def test_gate_parameters_without_gate_in_kernel_are_ignored(kda):
    # As in flash-linear-attention, whose layers pass them always and toggle the flag.
    t = inputs(kda)
    t["q"].requires_grad_()
    a_log = torch.zeros(HV, dtype=F64, requires_grad=True)
    dt_bias = torch.zeros(HV * K if kda else HV, dtype=F64, requires_grad=True)
    want, _ = call(kda, t)
    got, _ = call(kda, t, A_log=a_log, dt_bias=dt_bias)
    assert torch.equal(want, got)
    got.sum().backward()
    assert a_log.grad is None and dt_bias.grad is None


@pytest.mark.parametrize("kda", VARIANTS)
def test_a_log_shape_and_dtype(kda):
    t = inputs(kda)
    raises(kda, t, r"^A_log must have shape \[HV\] = \[2\], got \[3\]", use_gate_in_kernel=True,
           A_log=torch.zeros(3, dtype=F64))
    raises(kda, t, r"^A_log must have shape \[HV\] = \[2\], got \[1, 3\]",
           use_gate_in_kernel=True, A_log=torch.zeros(1, 3, dtype=F64))
    raises(kda, t, r"^A_log must be a float tensor .*got int32", use_gate_in_kernel=True,
           A_log=torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("kda", VARIANTS)
def test_gate_parameters_of_any_shape_with_their_element_count(kda):
    # flash-linear-attention's tests and layers pass A_log as [1, 1, HV, 1]; the gradient comes
    # back in the shape given.
    t = inputs(kda)
    a_log = torch.randn(HV, dtype=F64)
    dt_bias = torch.randn(HV * K if kda else HV, dtype=F64)
    flat = [x.clone().requires_grad_() for x in (a_log, dt_bias)]
    shaped = [a_log.reshape(1, 1, HV, 1).clone().requires_grad_(),
              dt_bias.reshape(HV, K if kda else 1).clone().requires_grad_()]
    results = []
    for a, d in (flat, shaped):
        o, _ = call(kda, t, use_gate_in_kernel=True, A_log=a, dt_bias=d)
        o.square().sum().backward()
        results.append((o, a.grad, d.grad))
    (o1, da1, dd1), (o2, da2, dd2) = results
    assert torch.equal(o1, o2)
    assert da2.shape == (1, 1, HV, 1) and torch.equal(da1, da2.reshape(-1))
    assert dd2.shape == shaped[1].shape and torch.equal(dd1, dd2.reshape(-1))


def test_dt_bias_shape_gdn():
    raises(False, inputs(False), r"^dt_bias must have shape \[HV\] = \[2\], got \[8\]",
           use_gate_in_kernel=True, A_log=torch.zeros(HV, dtype=F64),
           dt_bias=torch.zeros(HV * K, dtype=F64))


def test_dt_bias_shape_kda():
    t = inputs(True)
    a_log = torch.zeros(HV, dtype=F64)
    raises(True, t, r"^dt_bias must have shape \[HV \* K\] = \[8\], got \[2\]",
           use_gate_in_kernel=True, A_log=a_log, dt_bias=torch.zeros(HV, dtype=F64))
    raises(True, t, r"^dt_bias must have shape \[HV \* K\] = \[8\], got \[3, 4\]",
           use_gate_in_kernel=True, A_log=a_log, dt_bias=torch.zeros(HV + 1, K, dtype=F64))
    raises(True, t, r"^dt_bias must be a float tensor .*got int64", use_gate_in_kernel=True,
           A_log=a_log, dt_bias=torch.zeros(HV * K, dtype=torch.int64))


def test_lower_bound_not_accepted_by_gdn():
    raises(False, inputs(False), r"unexpected keyword argument 'lower_bound'", exc=TypeError,
           lower_bound=-1.0)
    raises(False, inputs(False), r"unexpected keyword argument 'lower_bound'", exc=TypeError,
           lower_bound=-1.0, use_gate_in_kernel=True, A_log=torch.zeros(HV, dtype=F64))


@pytest.mark.parametrize("lower_bound", [1.0, 0.0, float("nan"), float("-inf")])
def test_kda_lower_bound_must_be_negative(lower_bound):
    raises(True, inputs(True), rf"^lower_bound must be a finite negative number, got "
           rf"{re.escape(f'{lower_bound:g}')}", use_gate_in_kernel=True, lower_bound=lower_bound)


def test_kda_lower_bound_without_a_log_accepted():
    o, _ = call(True, inputs(True), use_gate_in_kernel=True, lower_bound=-2.0)
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("kda", VARIANTS)
def test_allow_neg_eigval_needs_beta_sigmoid(kda):
    raises(kda, inputs(kda), r"allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True",
           allow_neg_eigval=True)


@pytest.mark.parametrize("kda", VARIANTS)
def test_chunk_size(kda):
    # Every chunk size flash-linear-attention accepts gives the same computation (cake runs 64).
    t = inputs(kda)
    want, _ = call(kda, t)
    for chunk_size in (32, 64) if kda else (16, 32, 64):
        got, _ = call(kda, t, chunk_size=chunk_size)
        assert torch.equal(want, got)
    name = "chunk_kda" if kda else "chunk_gated_delta_rule"
    raises(kda, t, rf"^chunk_size must be one of .* for {name}, got 128", chunk_size=128)
    raises(kda, t, r"^chunk_size must be one of .*got 0", chunk_size=0)


def test_chunk_size_16():
    raises(True, inputs(True), r"^chunk_size must be one of \(32, 64\) for chunk_kda, got 16",
           chunk_size=16)


@pytest.mark.parametrize("kda", VARIANTS)
@pytest.mark.parametrize("head_first", [True, False])
def test_head_first_removed(kda, head_first):
    raises(kda, inputs(kda), r"head_first", head_first=head_first)
    # among several errors the first found is raised: head_first's, checked before chunk_size
    raises(kda, inputs(kda), r"^head_first has been removed", head_first=head_first,
           chunk_size=128)


@pytest.mark.parametrize("kda", VARIANTS)
def test_unknown_kwarg(kda):
    raises(kda, inputs(kda), r"unexpected keyword argument 'foo'", exc=TypeError, foo=1)


def test_kda_safe_gate():
    t = inputs(True)
    a_log = torch.zeros(HV, dtype=F64)
    raises(True, t, r"lower_bound must be given when safe_gate=True and use_gate_in_kernel=True",
           safe_gate=True, use_gate_in_kernel=True, A_log=a_log)
    raises(True, t, r"^lower_bound must be in the safe range \[-5, 0\), got -6",
           safe_gate=True, use_gate_in_kernel=True, A_log=a_log, lower_bound=-6.0)
    raises(True, t, r"^lower_bound must be in the safe range \[-5, 0\), got 0",
           safe_gate=True, use_gate_in_kernel=True, A_log=a_log, lower_bound=0.0)
    o, _ = call(True, t, safe_gate=True, use_gate_in_kernel=True, A_log=a_log, lower_bound=-5.0)
    assert torch.isfinite(o).all()


def test_kda_return_intermediate_states_needs_inference_mode():
    raises(True, inputs(True), r"only allowed under torch.inference_mode",
           return_intermediate_states=True)
    with torch.inference_mode():
        raises(True, inputs(True), r"needs disable_recompute=False",
               return_intermediate_states=True, disable_recompute=True)


@pytest.mark.parametrize("kda", VARIANTS)
def test_transpose_state_layout_is_state_v_first(kda):
    t = inputs(kda)
    h0 = torch.randn(1, HV, V, K, dtype=F64)
    want = call(kda, t, initial_state=h0, output_final_state=True, state_v_first=True)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout is deprecated") as w:
        got = call(kda, t, initial_state=h0, output_final_state=True,
                   transpose_state_layout=True)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    assert w[0].filename == __file__  # the warning points at the caller's line, not into cake
    raises(kda, t, r"cannot pass both state_v_first and the deprecated transpose_state_layout",
           initial_state=h0, state_v_first=True, transpose_state_layout=True)


def test_chunk_gdn_alias():
    assert cake.chunk_gdn is cake.chunk_gated_delta_rule


def test_named_parameters_are_flas():
    """FLA's named parameters, in FLA's positional order, then cake's keyword-only ones."""
    import inspect
    fla_gdn = pytest.importorskip("fla.ops.gated_delta_rule").chunk_gated_delta_rule
    fla_kda = pytest.importorskip("fla.ops.kda").chunk_kda
    for ours, theirs in ((cake.chunk_gated_delta_rule, fla_gdn), (cake.chunk_kda, fla_kda)):
        named = [n for n, p in inspect.signature(theirs).parameters.items()
                 if p.kind == p.POSITIONAL_OR_KEYWORD]
        mine = inspect.signature(ours).parameters
        positional = [n for n, p in mine.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert positional == named, ours.__name__
        for n in named:
            assert mine[n].default == inspect.signature(theirs).parameters[n].default, n


def test_gate_forms_without_the_in_op_gate_are_ignored():
    """As FLA: safe_gate and lower_bound shape the in-op gate only; without it g is taken as
    given and the call equals the plain one."""
    t = inputs(True)
    plain = call(True, t)[0]
    for extra in (dict(safe_gate=True), dict(lower_bound=-1.0),
                  dict(safe_gate=True, lower_bound=-3.0)):
        assert torch.equal(call(True, t, **extra)[0], plain), extra


def test_transpose_state_layout_false_is_the_default_layout():
    t = inputs(False, K=4, V=6)
    h0 = torch.randn(1, HV, 4, 6, dtype=F64)
    want = call(False, t, initial_state=h0, output_final_state=True)
    with pytest.warns(DeprecationWarning):
        got = call(False, t, initial_state=h0, output_final_state=True,
                   transpose_state_layout=False)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_kda_use_graph_accepted_with_fla_rule():
    t = inputs(True)
    cu = torch.tensor([0, 3, 8, 8])  # an empty tail document, as FLA's graphs pad
    want = call(True, t, cu_seqlens=cu)
    got = call(True, t, cu_seqlens=cu, use_graph=True, max_num_seqs=3)
    assert torch.equal(want[0], got[0])
    raises(True, t, r"max_num_seqs must be the number of documents in cu_seqlens .* got 3 "
           r"documents and max_num_seqs = 4", cu_seqlens=cu, use_graph=True, max_num_seqs=4)
    # without use_graph FLA reads max_num_seqs nowhere
    assert torch.equal(call(True, t, cu_seqlens=cu, max_num_seqs=99)[0], want[0])


@pytest.mark.parametrize("kda", VARIANTS)
def test_cp_context(kda):
    raises(kda, inputs(kda), r"cp_context", exc=NotImplementedError, cp_context=object())


def test_compatibility_arguments_accepted():
    # cu_seqlens_cpu, chunk_indices (GDN) and disable_recompute (KDA) are accepted and unused.
    cu = torch.tensor([0, 3, 8])
    o1, _ = call(False, inputs(False), cu_seqlens=cu)
    o2, _ = call(False, inputs(False), cu_seqlens=cu, cu_seqlens_cpu=cu,
                 chunk_indices=torch.tensor([[0, 0], [1, 0]]))
    assert torch.equal(o1, o2)
    o1, _ = call(True, inputs(True), cu_seqlens=cu)
    o2, _ = call(True, inputs(True), cu_seqlens=cu, cu_seqlens_cpu=cu, disable_recompute=True)
    assert torch.equal(o1, o2)
