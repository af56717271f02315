"""Drop-in parity with flash-linear-attention's interface, and what the CPU reference tells about
CUDA: the per-chunk states of return_intermediate_states against the token-by-token recurrence
(reference.py), the CudaSupportWarning rule, and cake.build_info()."""

import warnings

import pytest
import torch

import cake
import reference

F64 = torch.float64


def kda_inputs(seed, T, B=1, H=1, HV=2, K=4, V=3, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    q, k = randn(B, T, H, K), torch.nn.functional.normalize(randn(B, T, H, K), dim=-1)
    v = randn(B, T, HV, V)
    g = torch.nn.functional.logsigmoid(randn(B, T, HV, K) + 2)
    beta = randn(B, T, HV).sigmoid()
    h0 = randn(1 if B == 1 else B, HV, K, V)
    return [x.to(dtype) for x in (q, k, v, g, beta)], h0


def prefix_states(q, k, v, g, beta, h0, bounds, C):
    """The reference's state before every chunk of C tokens of every document: [NT, HV, K, V]."""
    out = []
    for n in range(len(bounds) - 1):
        start, end = bounds[n], bounds[n + 1]
        for c in range(-(-(end - start) // C)):
            sl = slice(start, start + c * C)
            _, ht = reference.recurrence(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl],
                                         kda=True, initial_state=h0[n:n + 1],
                                         output_final_state=True)
            out.append(ht[0])
    return torch.stack(out)


@pytest.mark.parametrize("C", [32, 64])
def test_intermediate_states_varlen(C):
    # Documents of 1, 63, 64, 65 and 130 tokens: chunks ending inside and at document ends.
    lengths = [1, 63, 64, 65, 130]
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    (q, k, v, g, beta), h0 = kda_inputs(7, bounds[-1])
    h0 = h0.expand(len(lengths), *h0.shape[1:]).contiguous() * torch.arange(
        1, len(lengths) + 1, dtype=F64)[:, None, None, None]
    cu = torch.tensor(bounds)
    with torch.inference_mode():
        o, ht, h = cake.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  cu_seqlens=cu, return_intermediate_states=True, chunk_size=C)
        o_plain, ht_plain = cake.chunk_kda(q, k, v, g, beta, initial_state=h0,
                                           output_final_state=True, cu_seqlens=cu)
    want = prefix_states(q, k, v, g, beta, h0, bounds, C)
    assert h.shape == (1, sum(-(-n // C) for n in lengths), 2, 4, 3) and h.dtype == k.dtype
    torch.testing.assert_close(h[0], want, rtol=1e-10, atol=1e-10)
    assert torch.equal(o, o_plain) and torch.equal(ht, ht_plain)


def test_intermediate_states_batch_and_state_v_first():
    (q, k, v, g, beta), h0 = kda_inputs(8, 100, B=2)
    with torch.inference_mode():
        _, _, h = cake.chunk_kda(q, k, v, g, beta, initial_state=h0,
                                 return_intermediate_states=True)
        _, _, hv = cake.chunk_kda(q, k, v, g, beta, initial_state=h0.transpose(-1, -2),
                                  state_v_first=True, return_intermediate_states=True)
    assert h.shape == (2, 2, 2, 4, 3)
    for b in range(2):
        want = prefix_states(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1],
                             h0[b:b + 1], [0, 100], 64)
        torch.testing.assert_close(h[b], want, rtol=1e-10, atol=1e-10)
    assert torch.equal(hv, h.transpose(-1, -2))


def test_intermediate_states_in_k_dtype():
    (q, k, v, g, beta), _ = kda_inputs(9, 70, dtype=torch.bfloat16)
    with torch.inference_mode():
        _, _, h = cake.chunk_kda(q, k, v, g.float(), beta.float(),
                                 return_intermediate_states=True)
    assert h.dtype == torch.bfloat16 and h.shape == (1, 2, 2, 4, 3)
    assert torch.equal(h[0, 0], torch.zeros_like(h[0, 0]))  # no initial state


def gdn_inputs(K, dtype):
    gen = torch.Generator().manual_seed(K)
    q = torch.randn(1, 16, 1, K, generator=gen).to(dtype)
    v = torch.randn(1, 16, 1, K, generator=gen).to(dtype)
    g = -torch.rand(1, 16, 1, generator=gen)
    beta = torch.rand(1, 16, 1, generator=gen)
    return q, q, v, g, beta


def test_cpu_warns_where_cuda_would_refuse():
    with pytest.warns(cake.CudaSupportWarning, match=r"head dims K = V = 128, got K = 8") as w:
        cake.chunk_gated_delta_rule(*gdn_inputs(8, torch.bfloat16))
    assert w[0].filename == __file__  # the warning points at the caller's line, not into cake
    with pytest.warns(cake.CudaSupportWarning, match=r"q must be bfloat16 .*got float16"):
        cake.chunk_gated_delta_rule(*gdn_inputs(128, torch.float16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cake.chunk_gated_delta_rule(*gdn_inputs(128, torch.bfloat16))  # CUDA would run it
        q, k, v, g, beta = gdn_inputs(8, F64)
        cake.chunk_gated_delta_rule(q, k, v, g.double(), beta.double())  # gradcheck's dtype
        cake.chunk_kda(q, k, v, g[..., None].expand(1, 16, 1, 8).double(), beta.double())


def test_cpu_warns_unless_q_g_and_beta_are_all_float64():
    # The float64 exemption needs every one of q, g and beta in float64 (gradcheck's calls): a
    # call with one of them in another dtype is a call CUDA would refuse, and warns.
    q, k, v, g, beta = gdn_inputs(128, torch.bfloat16)
    with pytest.warns(cake.CudaSupportWarning, match=r"g must be float32 .*got float64"):
        cake.chunk_gated_delta_rule(q, k, v, g.double(), beta)
    with pytest.warns(cake.CudaSupportWarning, match=r"beta must be .*got float64"):
        cake.chunk_gated_delta_rule(q, k, v, g, beta.double())
    q, k, v = q.double(), k.double(), v.double()
    with pytest.warns(cake.CudaSupportWarning, match=r"q must be bfloat16 .*got float64"):
        cake.chunk_gated_delta_rule(q, k, v, g, beta.double())
    with pytest.warns(cake.CudaSupportWarning, match=r"q must be bfloat16 .*got float64"):
        cake.chunk_gated_delta_rule(q, k, v, g.double(), beta)


def test_build_info():
    info = cake.build_info()
    assert info["version"] == cake.__version__
    assert isinstance(info["cuda_kernels"], bool)
    assert info["cuda_architectures"] == (["sm_90a"] if info["cuda_kernels"] else [])
    assert (info["cuda_runtime_version"] > 0) == info["cuda_kernels"]
    assert set(info["ops"]) == {"chunk_gated_delta_rule", "chunk_kda", "causal_conv1d",
                                "rms_norm_gated"}
    assert "FP64 reference" in info["ops"]["chunk_kda"]["cpu"]
    assert ("cuda" in info["ops"]["chunk_gated_delta_rule"]) == info["cuda_kernels"]
    assert ("cuda" in info["ops"]["chunk_kda"]) == info["cuda_kernels"]
    assert "FP64 reference" in info["ops"]["causal_conv1d"]["cpu"]
    assert ("cuda" in info["ops"]["causal_conv1d"]) == info["cuda_kernels"]
    assert "FP64 reference" in info["ops"]["rms_norm_gated"]["cpu"]
    assert ("cuda" in info["ops"]["rms_norm_gated"]) == info["cuda_kernels"]
    assert info["compiler"]


def test_strided_inputs_as_fla_accepts_them():
    # A slice of a fused projection and a transposed state: the op copies them to dense rows.
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(1, 20, 3, 2, 8, generator=gen, dtype=F64)
    q, k, v = qkv.unbind(2)
    g = -torch.rand(1, 20, 2, generator=gen, dtype=F64)
    beta = torch.rand(1, 20, 2, generator=gen, dtype=F64)
    h0 = torch.randn(1, 2, 8, 8, generator=gen, dtype=F64)
    want = cake.chunk_gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), g, beta,
                                       initial_state=h0, output_final_state=True)
    got = cake.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0.transpose(-1, -2),
                                      state_v_first=True, output_final_state=True)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1].transpose(-1, -2))
    assert got[1].is_contiguous()
