"""Every error path of a call on CUDA tensors raises a clear Python exception in this process.

No GPU is needed: the tensors are fake CUDA descriptors (fake_cuda.py) and every call here fails
in validation, before any work. With the kernels compiled in (cake.build_info()["cuda_kernels"])
this runs the CUDA path's own checks; without them, valid calls raise NotImplementedError naming
the build. A crash of the process (the failure this file exists for) fails the whole run.
"""

import pytest

import cake
from cake import abi
from fake_cuda import FakeCuda

KERNELS = cake.build_info()["cuda_kernels"]
GDN, KDA = 0, 1
T, H, HV, D = 64, 1, 2, 128


def problem(**changes):
    """A valid GDN forward on cuda:0: the tensors and options in cake.abi's order."""
    p = dict(q=FakeCuda((1, T, H, D)), k=FakeCuda((1, T, H, D)), v=FakeCuda((1, T, HV, D)),
             g=FakeCuda((1, T, HV), "float32"), beta=FakeCuda((1, T, HV), "float32"),
             initial_state=FakeCuda((2, HV, D, D), "float32"),
             cu_seqlens=FakeCuda((3,), "int32"), A_log=None, dt_bias=None,
             o=FakeCuda((1, T, HV, D)), final_state=FakeCuda((2, HV, D, D), "float32"),
             variant=GDN, scale=D ** -0.5, use_qk_l2norm=True, use_gate_in_kernel=False,
             lower_bound=None, use_beta_sigmoid=False, allow_neg_eigval=False,
             save_for_backward=0, unordered_sums=False)
    p.update(changes)
    return list(p.values())


def forward(args, saved=None, workspace=None):
    return abi.forward(*args, saved, workspace, 0)


def expect(exc, pattern, args, **kwargs):
    for query in (abi.forward_workspace_size, abi.forward_saved_size):
        with pytest.raises(exc, match=pattern):
            query(*args)
    with pytest.raises(exc, match=pattern):
        forward(args, **kwargs)


@pytest.mark.parametrize("case, pattern", [
    (dict(q=FakeCuda((1, T, H, 64)), k=FakeCuda((1, T, H, 64)),
          initial_state=FakeCuda((2, HV, 64, D), "float32"),
          final_state=FakeCuda((2, HV, 64, D), "float32")), r"K = V = 128, got K = 64"),
    (dict(q=FakeCuda((1, T, H, D), "float16"), k=FakeCuda((1, T, H, D), "float16"),
          v=FakeCuda((1, T, HV, D), "float16")), r"^q must be bfloat16 .*got float16"),
    (dict(q=FakeCuda((1, T, H, D), "float32"), k=FakeCuda((1, T, H, D), "float32"),
          v=FakeCuda((1, T, HV, D), "float32")), r"^q must be bfloat16 .*got float32"),
    (dict(g=FakeCuda((1, T, HV), "bfloat16")), r"^g must be float32 .*got bfloat16"),
    (dict(beta=FakeCuda((1, T, HV), "float16")), r"^beta must be float32 or bfloat16 on CUDA"),
    (dict(initial_state=FakeCuda((2, HV, D, D), "float64")),
     r"^initial_state must be float32 .*got float64"),
    (dict(o=FakeCuda((1, T, HV, D), "float32")), r"^o must be bfloat16"),
    (dict(final_state=FakeCuda((2, HV, D, D), "bfloat16")), r"^final_state must be float32"),
    (dict(k=FakeCuda((1, T, H, D), strides=(T * H * D, 1, T, H))), r"^k must be contiguous"),
    (dict(initial_state=FakeCuda((2, HV, D, D), "float32", strides=(HV * D * D, D * D, 1, D))),
     r"^initial_state must be contiguous"),
    (dict(q=FakeCuda((1, T, 2, D)), k=FakeCuda((1, T, 2, D)), v=FakeCuda((1, T, 3, D))),
     r"value heads HV .* multiple of"),
    (dict(g=FakeCuda((1, T, HV, D), "float32")), r"^g must have shape .*\[B, T, HV\]"),
    (dict(variant=KDA, g=FakeCuda((1, T, HV, D))), r"^g must be float32"),
    (dict(variant=KDA), r"^g must have shape .*\[B, T, HV, K\]"),
    (dict(cu_seqlens=FakeCuda((3,), "float32")), r"^cu_seqlens must be int32 or int64"),
    (dict(initial_state=FakeCuda((3, HV, D, D), "float32")), r"^initial_state must have shape"),
    (dict(beta=FakeCuda((1, T, HV), "float32", device_id=1)),
     r"^beta must be on q's device \(cuda:0\), got cuda:1"),
    (dict(save_for_backward=3), r"save_for_backward must be 0"),
    (dict(scale=float("nan")), r"scale must be a finite number"),
    (dict(allow_neg_eigval=True), r"allow_neg_eigval=True requires"),
    (dict(variant=KDA, g=FakeCuda((1, T, HV, D), "float64"), use_gate_in_kernel=True,
          A_log=FakeCuda((HV,), "float32")),
     r"^g must be float32, bfloat16 or float16 on CUDA with the in-op activations, got float64"),
    (dict(use_gate_in_kernel=True, A_log=FakeCuda((HV,), "float64")),
     r"^A_log must be float32, bfloat16 or float16 on CUDA"),
    (dict(use_gate_in_kernel=True, A_log=FakeCuda((HV,), "float32"),
          dt_bias=FakeCuda((HV,), "float32", strides=(2,))), r"^dt_bias must be contiguous"),
    (dict(use_beta_sigmoid=True, beta=FakeCuda((1, T, HV), "float64")),
     r"^beta must be float32, bfloat16 or float16 on CUDA with the in-op activations"),
], ids=lambda x: None if isinstance(x, dict) else "")
def test_invalid_calls_raise_value_error(case, pattern):
    expect(ValueError, pattern, problem(**case))


def test_cpu_tensor_among_cuda_tensors():
    import torch
    args = problem(g=torch.zeros(1, T, HV))
    expect(ValueError, r"^g must be on q's device \(cuda:0\), got cpu", args)


@pytest.mark.skipif(not KERNELS, reason="the queries need the kernels compiled in")
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_short_buffers(mode):
    args = problem(save_for_backward=mode)
    saved_bytes = abi.forward_saved_size(*args)
    workspace_bytes = abi.forward_workspace_size(*args)
    assert (saved_bytes > 0) == (mode != 0) and workspace_bytes > 0
    saved = FakeCuda((saved_bytes,), "uint8") if saved_bytes else None
    with pytest.raises(ValueError, match=rf"^workspace: expected at least {workspace_bytes} "
                                         rf"bytes, got {workspace_bytes - 1}"):
        forward(args, saved, FakeCuda((workspace_bytes - 1,), "uint8"))
    if saved_bytes:
        with pytest.raises(ValueError, match=rf"^saved: expected at least {saved_bytes} bytes"):
            forward(args, FakeCuda((saved_bytes - 1,), "uint8"),
                    FakeCuda((workspace_bytes,), "uint8"))
    else:
        with pytest.raises(ValueError, match="saved must be NULL in recompute mode"):
            forward(args, FakeCuda((16,), "uint8"), FakeCuda((workspace_bytes,), "uint8"))


@pytest.mark.skipif(not KERNELS, reason="the queries need the kernels compiled in")
def test_in_place_is_refused():
    """o over v: the size queries answer (they take placeholder data), the run refuses."""
    v = FakeCuda((1, T, HV, D))
    args = problem(v=v, o=v)
    workspace_bytes = abi.forward_workspace_size(*args)
    with pytest.raises(ValueError, match=r"^o must not share memory with v \(.*in-place"):
        forward(args, None, FakeCuda((workspace_bytes,), "uint8"))


@pytest.mark.skipif(KERNELS, reason="this build has the kernels")
def test_build_without_kernels_names_itself():
    expect(NotImplementedError, r"built without CUDA .*cake.build_info\(\)", problem())


def test_backward_errors():
    bargs = problem()[:9] + [FakeCuda((1, T, HV, D), "float32"), None] + [None] * 8
    options = problem()[11:]
    with pytest.raises(ValueError, match=r"^dout must be bfloat16"):
        abi.backward_workspace_size(*bargs, *options)
    with pytest.raises(ValueError, match=r"^dout must be bfloat16"):
        abi.backward(*bargs, *options, None, None, 0)
    bargs[9] = FakeCuda((1, T, HV, D))
    bargs[11] = FakeCuda((1, T, H, D), "float32")  # dq
    with pytest.raises(ValueError, match=r"^dq must be bfloat16 \(gradients take"):
        abi.backward(*bargs, *options, None, None, 0)
    bargs[11] = None
    bargs[16] = FakeCuda((2, HV, D, D), "float32")  # dh0
    bargs[5] = None  # without an initial state
    with pytest.raises(ValueError, match=r"^dh0 can only be computed with an initial_state"):
        abi.backward(*bargs, *options, None, None, 0)


def test_unsupported_dtype_and_rank_reach_python():
    with pytest.raises(ValueError, match=r"^q has an unsupported dtype uint8"):
        abi.forward_workspace_size(*problem(q=FakeCuda((1, T, H, D), "uint8")))
    with pytest.raises(ValueError, match=r"^q has 6 dimensions"):
        abi.forward_workspace_size(*problem(q=FakeCuda((1, 1, T, H, D, 1))))
