"""Every error path of an rms_norm_gated call on CUDA tensors raises a clear Python exception.

No GPU is needed: the tensors are fake CUDA descriptors (fake_cuda.py) and every call here fails
in validation, before any work (see test_cuda_errors.py). With the kernels compiled in this runs
the CUDA path's own checks; without them, valid calls raise NotImplementedError naming the build.
"""

import pytest

import cake
from cake import abi
from fake_cuda import FakeCuda

KERNELS = cake.build_info()["cuda_kernels"]
R, N = 64, 128


def forward_args(**changes):
    """A valid forward on cuda:0, in cake.abi's order (without the stream)."""
    p = dict(x=FakeCuda((R, N)), g=FakeCuda((R, N)), weight=FakeCuda((N,), "float32"),
             y=FakeCuda((R, N)), rstd=FakeCuda((R,), "float32"), eps=1e-5, activation=1)
    p.update(changes)
    return list(p.values())


def backward_args(**changes):
    p = dict(x=FakeCuda((R, N)), g=FakeCuda((R, N)), weight=FakeCuda((N,), "float32"),
             rstd=FakeCuda((R,), "float32"), dy=FakeCuda((R, N)), dx=FakeCuda((R, N)),
             dg=FakeCuda((R, N)), dweight=FakeCuda((N,), "float32"), activation=1)
    p.update(changes)
    return list(p.values())


def expect_forward(exc, pattern, args):
    with pytest.raises(exc, match=pattern):
        abi.norm_forward(*args, 0)


def expect_backward(exc, pattern, args):
    with pytest.raises(exc, match=pattern):
        abi.norm_backward_workspace_size(*args)
    with pytest.raises(exc, match=pattern):
        abi.norm_backward(*args, None, 0)


def shapes(n):
    return dict(x=FakeCuda((R, n)), g=FakeCuda((R, n)), weight=FakeCuda((n,), "float32"),
                y=FakeCuda((R, n)))


@pytest.mark.skipif(not KERNELS, reason="the CUDA rules are checked where the kernels are built")
@pytest.mark.parametrize("case, pattern", [
    (shapes(12), r"N a multiple of 8 and N <= 1024, got x's last size N = 12"),
    (shapes(1032), r"N a multiple of 8 and N <= 1024, got x's last size N = 1032"),
    (dict(x=FakeCuda((R, N), "float64"), g=None, y=FakeCuda((R, N), "float64")),
     r"^x must be bfloat16, float16 or float32 for the CUDA kernels, got float64"),
    (dict(g=FakeCuda((R, N), "float32")),
     r"^g must have x's dtype \(bfloat16\) for the CUDA kernels, got float32"),
    (dict(weight=FakeCuda((N,), "float64")),
     r"^weight must be float32, bfloat16 or float16 for the CUDA kernels, got float64"),
    (dict(rstd=FakeCuda((R,), "bfloat16")), r"^rstd must be float32 for the CUDA kernels"),
    (dict(x=FakeCuda((R, N), strides=(1, R))), r"^x must be contiguous"),
], ids=lambda x: None if isinstance(x, dict) else "")
def test_cuda_rules_raise_value_error(case, pattern):
    expect_forward(ValueError, pattern, forward_args(**case))


@pytest.mark.parametrize("case, pattern", [
    (dict(weight=FakeCuda((N + 1,), "float32")), r"^weight must have shape \[N\] = \[128\]"),
    (dict(g=FakeCuda((R, N + 8))), r"^g must have shape x's = \[64, 128\]"),
    (dict(rstd=FakeCuda((R + 1,), "float32")), r"^rstd must have shape \[rows\] = \[64\]"),
    (dict(g=FakeCuda((R, N), device_id=1)), r"^g must be on x's device \(cuda:0\), got cuda:1"),
    (dict(activation=0), r"^activation must be cakeActivationSilu \(1\) or cakeActivationSigmoid"),
    (dict(eps=-1.0), r"^eps must be finite and >= 0, got -1"),
    (dict(y=None), r"^y is required but was not given"),
], ids=lambda x: None if isinstance(x, dict) else "")
def test_invalid_forward_raises_value_error(case, pattern):
    expect_forward(ValueError, pattern, forward_args(**case))


@pytest.mark.parametrize("case, pattern", [
    (dict(dy=FakeCuda((R, N - 8))), r"^dy must have shape x's"),
    (dict(g=None), r"^dg can only be computed with a gate g"),
    (dict(weight=None), r"^dweight can only be computed with a weight"),
    (dict(rstd=None), r"^rstd is required but was not given"),
], ids=lambda x: None if isinstance(x, dict) else "")
def test_invalid_backward_raises_value_error(case, pattern):
    expect_backward(ValueError, pattern, backward_args(**case))


@pytest.mark.skipif(KERNELS, reason="this build has the kernels")
def test_build_without_kernels_names_itself():
    expect_forward(NotImplementedError, r"built without CUDA .*rms_norm_gated", forward_args())
    expect_backward(NotImplementedError, r"built without CUDA .*rms_norm_gated",
                    backward_args())


@pytest.mark.skipif(not KERNELS, reason="the queries need the kernels compiled in")
def test_short_workspace():
    args = backward_args()
    nbytes = abi.norm_backward_workspace_size(*args)
    # 64 rows of 128 bfloat16 values, 16 lanes a row: 8 blocks of 8 rows, a float row each
    assert nbytes == 8 * N * 4
    with pytest.raises(ValueError, match=rf"^workspace: expected at least {nbytes} bytes"):
        abi.norm_backward(*args, FakeCuda((nbytes - 1,), "uint8"), 0)
    assert abi.norm_backward_workspace_size(*backward_args(dweight=None)) == 0
