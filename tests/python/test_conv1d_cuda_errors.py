"""Every error path of a causal_conv1d call on CUDA tensors raises a clear Python exception.

No GPU is needed: the tensors are fake CUDA descriptors (fake_cuda.py) and every call here fails
in validation, before any work (see test_cuda_errors.py). With the kernels compiled in this runs
the CUDA path's own checks; without them, valid calls raise NotImplementedError naming the build.
"""

import pytest

import cake
from cake import abi
from fake_cuda import FakeCuda

KERNELS = cake.build_info()["cuda_kernels"]
T, D, W, N = 64, 96, 4, 2


def forward_args(**changes):
    """A valid forward on cuda:0, in cake.abi's order."""
    p = dict(x=FakeCuda((1, T, D)), weight=FakeCuda((D, W), "float32"),
             bias=FakeCuda((D,), "float32"), residual=FakeCuda((1, T, D)),
             initial_state=FakeCuda((N, D, W)), cu_seqlens=FakeCuda((N + 1,), "int32"),
             y=FakeCuda((1, T, D)), final_state=FakeCuda((N, D, W)), activation=1)
    p.update(changes)
    return list(p.values())


def backward_args(**changes):
    p = dict(x=FakeCuda((1, T, D)), weight=FakeCuda((D, W), "float32"),
             bias=FakeCuda((D,), "float32"), initial_state=FakeCuda((N, D, W)),
             cu_seqlens=FakeCuda((N + 1,), "int32"), dy=FakeCuda((1, T, D)),
             dht=FakeCuda((N, D, W)), dx=FakeCuda((1, T, D)), dweight=FakeCuda((D, W), "float32"),
             dbias=FakeCuda((D,), "float32"), dinitial_state=FakeCuda((N, D, W)), activation=1)
    p.update(changes)
    return list(p.values())


def expect_forward(exc, pattern, args):
    with pytest.raises(exc, match=pattern):
        abi.conv1d_forward_workspace_size(*args)
    with pytest.raises(exc, match=pattern):
        abi.conv1d_forward(*args, None, 0)


def expect_backward(exc, pattern, args):
    with pytest.raises(exc, match=pattern):
        abi.conv1d_backward_workspace_size(*args)
    with pytest.raises(exc, match=pattern):
        abi.conv1d_backward(*args, None, 0)


@pytest.mark.parametrize("case, pattern", [
    (dict(weight=FakeCuda((D, 5), "float32"), initial_state=FakeCuda((N, D, 5)),
          final_state=FakeCuda((N, D, 5))), r"widths W = 2..4, got .* W = 5"),
    (dict(weight=FakeCuda((D, 1), "float32"), initial_state=FakeCuda((N, D, 1)),
          final_state=FakeCuda((N, D, 1))), r"widths W = 2..4, got .* W = 1"),
    (dict(x=FakeCuda((1, T, D), "float64"), residual=None, y=FakeCuda((1, T, D), "float64")),
     r"^x must be bfloat16, float16 or float32 for the CUDA kernels, got float64"),
    (dict(residual=FakeCuda((1, T, D), "float32")),
     r"^residual must have x's dtype \(bfloat16\) for the CUDA kernels, got float32"),
    (dict(y=FakeCuda((1, T, D), "float16")), r"^y must have x's dtype"),
    (dict(weight=FakeCuda((D, W), "float64")), r"^weight must be float32, bfloat16 or float16"),
    (dict(initial_state=FakeCuda((N, D, W), "float64")), r"^initial_state must be float32"),
    (dict(x=FakeCuda((1, T, D), strides=(T * D, 1, T))), r"^x must be contiguous"),
    (dict(weight=FakeCuda((D, W), "float32", strides=(1, D))), r"^weight must be contiguous"),
    (dict(x=FakeCuda((T, D))), r"^x must have 3 dimensions"),
    (dict(weight=FakeCuda((D + 1, W), "float32")), r"^weight must have shape \[D, W\] with D = 96"),
    (dict(bias=FakeCuda((D, 1), "float32")), r"^bias must have shape \[D\]"),
    (dict(residual=FakeCuda((1, T + 1, D))), r"^residual must have shape \[B, T, D\]"),
    (dict(initial_state=FakeCuda((N + 1, D, W))), r"^initial_state must have shape \[N, D, W\]"),
    (dict(cu_seqlens=FakeCuda((N + 1,), "float32")), r"^cu_seqlens must be int32 or int64"),
    (dict(x=FakeCuda((2, T, D)), residual=None, y=FakeCuda((2, T, D))),
     r"^the batch size B must be 1 when cu_seqlens is given"),
    (dict(bias=FakeCuda((D,), "float32", device_id=1)),
     r"^bias must be on x's device \(cuda:0\), got cuda:1"),
    (dict(final_state=FakeCuda((N, D, W - 1))), r"^final_state must have shape \[N, D, W\]"),
    (dict(y=None), r"^y is required but was not given"),
    (dict(activation=2), r"^activation must be cakeActivationNone \(0\) or cakeActivationSilu"),
], ids=lambda x: None if isinstance(x, dict) else "")
def test_invalid_forward_raises_value_error(case, pattern):
    expect_forward(ValueError, pattern, forward_args(**case))


@pytest.mark.parametrize("case, pattern", [
    (dict(dy=FakeCuda((1, T, D), "float32")), r"^dy must have x's dtype"),
    (dict(dx=FakeCuda((1, T, D), "float16")), r"^dx must have x's dtype"),
    (dict(dweight=FakeCuda((D, W), "float64")), r"^dweight must be float32, bfloat16 or float16"),
    (dict(dht=FakeCuda((N, D, W - 1))), r"^dht must have shape \[N, D, W\]"),
    (dict(bias=None), r"^dbias can only be computed with a bias"),
    (dict(initial_state=None), r"^dinitial_state can only be computed with an initial_state"),
    (dict(dy=None), r"^dy is required but was not given"),
    (dict(dx=FakeCuda((1, T, D), strides=(T * D, 1, T))), r"^dx must be contiguous"),
], ids=lambda x: None if isinstance(x, dict) else "")
def test_invalid_backward_raises_value_error(case, pattern):
    expect_backward(ValueError, pattern, backward_args(**case))


def test_cpu_tensor_among_cuda_tensors():
    import torch
    expect_forward(ValueError, r"^weight must be on x's device \(cuda:0\), got cpu",
                   forward_args(weight=torch.zeros(D, W)))


@pytest.mark.skipif(KERNELS, reason="this build has the kernels")
def test_build_without_kernels_names_itself():
    expect_forward(NotImplementedError, r"built without CUDA .*causal_conv1d",
                   forward_args())
    expect_backward(NotImplementedError, r"built without CUDA .*causal_conv1d",
                    backward_args())


@pytest.mark.skipif(not KERNELS, reason="the queries need the kernels compiled in")
def test_short_workspace():
    args = backward_args()
    nbytes = abi.conv1d_backward_workspace_size(*args)
    assert nbytes > 0
    with pytest.raises(ValueError, match=rf"^workspace: expected at least {nbytes} bytes"):
        abi.conv1d_backward(*args, FakeCuda((nbytes - 1,), "uint8"), 0)
    assert abi.conv1d_forward_workspace_size(*forward_args()) == 0


def test_check_support_names_the_cuda_rule():
    import torch
    x = torch.zeros(1, T, D, dtype=torch.float64)
    error = abi.conv1d_support_error(x, torch.zeros(D, W), None, None, None, None,
                                     torch.zeros_like(x), None, 1, device_type=abi.CUDA)
    assert isinstance(error, ValueError) and "bfloat16, float16 or float32" in str(error)
