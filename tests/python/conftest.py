"""Shared helpers of the Python tests: random cases, calls into cake and into reference.py,
gradients of both, and comparisons."""

import importlib
import os
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import cake  # noqa: E402
import reference  # noqa: E402

def import_bench(name):
    """A script of bench/ as a module, with bench/ on the path as when it runs. The benchmarks set
    FLA_FLASH_QLA=0 at import (their FLA arm on FLA's own kernels); the tests' process gets the
    value it had back, so that the tests after them see FLA as a user's process does."""
    bench = str(pathlib.Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    before = os.environ.get("FLA_FLASH_QLA")
    module = importlib.import_module(name)
    if before is None:
        os.environ.pop("FLA_FLASH_QLA", None)
    else:
        os.environ["FLA_FLASH_QLA"] = before
    return module


# Names of the tensor inputs, in the order gradients are taken.
TENSOR_NAMES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")


def make_case(seed, *, kda, T=None, cu=None, B=1, H=1, HV=2, K=8, V=8, dtype=torch.float64,
              initial_state=False, l2norm=False, gate=False, A_log=True, dt_bias=False,
              lower_bound=None, beta_sigmoid=False, allow_neg_eigval=False, cu_dtype=torch.int64,
              output_final_state=True, scale=None):
    """A random case: (tensors, options). tensors holds leaf tensors that require grad (and
    cu_seqlens); options holds cake's keyword arguments other than the tensors."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    if cu is not None:
        T = cu[-1]
        assert B == 1
    N = len(cu) - 1 if cu is not None else B
    q = randn(B, T, H, K)
    k = randn(B, T, H, K)
    if not l2norm:
        k = F.normalize(k, dim=-1)  # keeps the recurrence contractive
    v = randn(B, T, HV, V)
    gshape = (B, T, HV, K) if kda else (B, T, HV)
    g = randn(*gshape) if gate else F.logsigmoid(2 * randn(*gshape) + 2)
    beta = randn(B, T, HV) if beta_sigmoid else torch.rand(B, T, HV, generator=gen,
                                                           dtype=torch.float64)
    t = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if initial_state:
        t["initial_state"] = 0.5 * randn(N, HV, K, V)
    if gate and A_log:
        t["A_log"] = 0.5 * randn(HV)
    if gate and dt_bias:
        t["dt_bias"] = 0.5 * randn(HV * K if kda else HV)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for name, x in t.items():
        x = x.to(state_dtype if name == "initial_state" else dtype)
        t[name] = x.requires_grad_()
    if cu is not None:
        t["cu_seqlens"] = torch.tensor(cu, dtype=cu_dtype)
    opts = {"output_final_state": output_final_state}
    if scale is not None:
        opts["scale"] = scale
    if l2norm:
        opts["use_qk_l2norm_in_kernel"] = True
    if gate:
        opts["use_gate_in_kernel"] = True
    if lower_bound is not None:
        opts["lower_bound"] = lower_bound
    if beta_sigmoid:
        opts["use_beta_sigmoid_in_kernel"] = True
    if allow_neg_eigval:
        opts["allow_neg_eigval"] = True
    return t, opts


def leaves(t):
    return [t[n] for n in TENSOR_NAMES if n in t]


def leaf_names(t):
    return [n for n in TENSOR_NAMES if n in t]


def call_cake(kda, t, opts):
    fn = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    kwargs = dict(opts)
    for name in ("initial_state", "cu_seqlens", "A_log", "dt_bias"):
        if name in t:
            kwargs[name] = t[name]
    return fn(t["q"], t["k"], t["v"], t["g"], t["beta"], **kwargs)


def call_reference(kda, t, opts):
    return reference.recurrence(
        t["q"], t["k"], t["v"], t["g"], t["beta"], kda=kda, scale=opts.get("scale"),
        initial_state=t.get("initial_state"),
        output_final_state=opts.get("output_final_state", False),
        cu_seqlens=t.get("cu_seqlens"), use_qk_l2norm=opts.get("use_qk_l2norm_in_kernel", False),
        use_gate_in_kernel=opts.get("use_gate_in_kernel", False), A_log=t.get("A_log"),
        dt_bias=t.get("dt_bias"), lower_bound=opts.get("lower_bound"),
        use_beta_sigmoid=opts.get("use_beta_sigmoid_in_kernel", False),
        allow_neg_eigval=opts.get("allow_neg_eigval", False))


def cotangents(o, ht, seed):
    gen = torch.Generator().manual_seed(seed + 7919)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dht = None if ht is None else torch.randn(ht.shape, generator=gen, dtype=torch.float64)
    return do, dht


def assert_same_results(out, out2, t, t2, seed):
    """Two calls (o, final_state) on the input dicts t and t2 agree bitwise: outputs, and the
    gradients of every input under the same random cotangents."""
    (o, ht), (o2, ht2) = out, out2
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    do, dht = cotangents(o, ht, seed)
    for name, a, b in zip(leaf_names(t), gradients(o, ht, do, dht, leaves(t)),
                          gradients(o2, ht2, do, dht, leaves(t2))):
        assert torch.equal(a, b), name


def gradients(o, ht, do, dht, inputs):
    """d/d(inputs) of <o, do> + <ht, dht>; a None gradient (input not used) becomes zeros."""
    loss = (o.double() * do).sum()
    if ht is not None and dht is not None:
        loss = loss + (ht.double() * dht).sum()
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(x) if gr is None else gr for x, gr in zip(inputs, grads)]


def assert_rel(actual, expected, tol, what=""):
    """Finite, same shape, and max |actual - expected| <= tol * max(|expected|, 1e-30)."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    a, e = actual.double(), expected.double()
    scale = max(e.abs().max().item(), 1e-30) if e.numel() else 1.0
    err = (a - e).abs().max().item() if e.numel() else 0.0
    assert err <= tol * scale, f"{what}: max abs error {err:.3e} > {tol:.1e} * {scale:.3e}"


def check_against_reference(kda, t, opts, *, seed=0, tol=1e-9, grads=True):
    """cake's outputs and every gradient against reference.py's (autograd) on the same inputs."""
    o, ht = call_cake(kda, t, opts)
    ro, rht = call_reference(kda, t, opts)
    assert o.dtype == t["q"].dtype
    assert_rel(o, ro, tol, "o")
    if opts.get("output_final_state"):
        assert ht is not None
        assert_rel(ht, rht, tol, "final_state")
    else:
        assert ht is None
    if not grads:
        return
    do, dht = cotangents(ro, rht, seed)
    inputs = leaves(t)
    got = gradients(o, ht, do, dht, inputs)
    want = gradients(ro, rht, do, dht, inputs)
    for name, x, a, b in zip(leaf_names(t), inputs, got, want):
        assert a.dtype == x.dtype, f"d{name}: dtype {a.dtype} != {x.dtype}"
        assert_rel(a, b, tol, f"d{name}")


def record_segment_routes(monkeypatch) -> list:
    """The calls that take cake.segments' route and complete it, by op name, from now on (a
    route refused falls back to the plain op unrecorded)."""
    import cake.segments as segments
    taken = []
    run = segments.run

    def record(*args, **kwargs):
        out = run(*args, **kwargs)
        taken.append(args[0].name)
        return out
    monkeypatch.setattr(segments, "run", record)
    return taken


def pytest_configure(config):
    # The tests run the CPU reference on shapes and dtypes the CUDA kernels refuse on purpose;
    # test_parity.py checks the warning where it is meant to be issued.
    config.addinivalue_line("filterwarnings", "ignore::cake.CudaSupportWarning")


def record_argument(monkeypatch, module, name, index):
    """Wraps module.name so that each call's argument at `index` is recorded; returns the list."""
    seen = []
    original = getattr(module, name)

    def recording(*args):
        seen.append(args[index])
        return original(*args)

    monkeypatch.setattr(module, name, recording)
    return seen
