"""The benchmarks' per-kernel breakdown (bench/kernel_times.py): kernel names shortened to what a
reader of docs/perf-notes.md looks for, and the one-line summary of the largest."""

import pytest
from conftest import import_bench

kernel_times = import_bench("kernel_times")
short_name, summary = kernel_times.short_name, kernel_times.summary


def test_names_keep_the_kernel_and_its_template_arguments():
    cases = {
        "void cake::kernels::walk_a_bwd::walk_a_bwd_kernel<cake::kernels::ChannelDecay>"
        "(cake::kernels::walk_a_bwd::KernelParams)": "walk_a_bwd_kernel<ChannelDecay>",
        "void cake::kernels::walk_a_fwd::roles::walk_a_fwd_roles_kernel"
        "<cake::kernels::ScalarDecay, true>(cake::kernels::walk_a_fwd::roles::RolesParams)":
            "walk_a_fwd_roles_kernel<ScalarDecay, true>",
        "chunk_kda_fwd_kernel_intra_sub_chunk": "chunk_kda_fwd_kernel_intra_sub_chunk",
        "Memset (Device)": "Memset",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, "
        "64>(float*, unsigned int)": "CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>",
    }
    for name, short in cases.items():
        assert short_name(name) == short


def test_summary_lists_the_largest_with_their_shares():
    times = {"walk_a_bwd_kernel<ScalarDecay>": 24.0, "qk_grad_kernel": 4.0, "Memset": 2.0}
    line = summary(times, top=2)
    assert line == "walk_a_bwd_kernel<ScalarDecay> 24.00 ms (80 %); qk_grad_kernel 4.00 ms (13 %)"


def test_phases_count_each_kernel_once():
    """A range's kernels (its own and its children's) go to its phase; the GPU-side span that the
    profiler gives the range is not a kernel; the kernels outside every range are "other"."""
    from types import SimpleNamespace

    import torch

    CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def kernel(name, us):
        return SimpleNamespace(name=name, duration=us)

    def cpu(name, kernels=(), children=()):
        return SimpleNamespace(name=name, device_type=CPU, kernels=list(kernels),
                               cpu_children=list(children))

    def device(name, us, annotation=False):
        return SimpleNamespace(name=name, device_type=CUDA, device_time=us,
                               is_user_annotation=annotation)

    matmul = cpu("aten::mm", [kernel("gemm", 300.0)])
    walk = cpu("cake.kcp.walk", [kernel("cake.kcp.walk", 900.0)], [matmul])
    copy = cpu("aten::copy_", [kernel("copy", 100.0)])
    events = [walk, matmul, copy, device("gemm", 300.0), device("copy", 100.0),
              device("cake.kcp.walk", 900.0, annotation=True)]
    phases = kernel_times.phases_of(events, "cake.kcp.")
    assert list(phases) == ["walk", "other"]
    assert phases["walk"] == pytest.approx(0.3) and phases["other"] == pytest.approx(0.1)
    assert kernel_times.phases_of([walk, matmul], "cake.kcp.") == {}
