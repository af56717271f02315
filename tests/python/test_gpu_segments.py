"""Exact segments on one GPU (cake.segments) through the public ops: a GDN call with
cu_seqlens_cpu whose documents are few and long for the SMs walks them as segments (cake.kcp on
one rank); a KDA call runs the plain op (cake.segments says why; KDA's segments are tested through
cake.kcp in test_gpu_kcp.py). Against the FP64 reference on the upcast inputs (the accuracy gate,
test_gpu_gdn.check_gate); bitwise the same run to run; nothing is read back from the device, in a
batch's later calls nor in the first call of a batch of new offsets; the plain op runs without the
host offsets. Skipped without a CUDA device."""

import pytest
import torch

import cake
import test_gpu_gdn
import test_gpu_kda
from conftest import record_segment_routes
from test_gpu_gdn import check_gate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# 3 documents of 47-79 chunks at 2 value heads: 6 walks on the GPU's SMs, which the plan cuts
DOCS = [5000, 4100, 3000]


@pytest.fixture
def routed(monkeypatch):
    """The calls that took the segment route and completed it, by op name."""
    return record_segment_routes(monkeypatch)


def on_gpu(inputs, dout, dht):
    """The inputs on the GPU (copied before any call is watched for device reads)."""
    x = {n: None if t is None else t.cuda() for n, t in inputs.items()}
    return x, dout.cuda(), dht.cuda(), inputs["cu_seqlens"]


def run_op(kda, gpu, *, host_offsets=True):
    """o, final_state and every gradient of one call through the public op, on the GPU."""
    inputs, dout, dht, cu_cpu = gpu
    op = cake.chunk_kda if kda else cake.chunk_gated_delta_rule
    x = {n: None if t is None else t.detach().requires_grad_(t.is_floating_point())
         for n, t in inputs.items()}
    o, ht = op(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
               output_final_state=True, use_qk_l2norm_in_kernel=True,
               cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=cu_cpu if host_offsets else None)
    torch.autograd.backward([o, ht], [dout, dht])
    grads = {"d" + n: x[n].grad for n in ("q", "k", "v", "g", "beta")}
    grads["dh0"] = x["initial_state"].grad
    return {"o": o.detach(), "final_state": ht.detach(), **grads}


def call(kda, gpu, *, host_offsets=True):
    """run_op's results on the CPU, as test_gpu_gdn.run_gpu returns them (for check_gate)."""
    return {n: t.cpu() for n, t in run_op(kda, gpu, host_offsets=host_offsets).items()}


def inputs_of(kda, seed, *, carried=False):
    """DOCS at 1 / 2 heads. carried: a decay that lets a segment's start state reach its end
    (GDN: g in (-0.004, 0], e^-2.5 over a segment of ~1,250 tokens; KDA: g = 0 on even channels,
    -20 on odd ones) and beta in (0.05, 0.2), so that the summaries' M and their adjoints matter
    (with the default gates a segment forgets its start state entirely)."""
    beta_range = (0.05, 0.2) if carried else (0.05, 0.95)
    if kda:
        return test_gpu_kda.make_inputs(DOCS, 1, 2, seed=seed, beta_range=beta_range,
                                        gate_kind="split" if carried else "mild")
    return test_gpu_gdn.make_inputs(DOCS, 1, 2, seed=seed, beta_range=beta_range,
                                    g_range=(-0.004, 0.0) if carried else (-1.0, 0.0))


def reference(kda, inputs, dout, dht):
    """The FP64 reference of the public op's call (with the q/k L2 norm, as run_op calls it)."""
    if kda:
        return test_gpu_kda.reference(inputs, dout, dht)
    return test_gpu_gdn.reference(inputs, dout, dht, True)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_segments_meet_the_gate_and_repeat_bitwise(kda, routed):
    plan = cake.kcp.build_context(torch.tensor([0] + DOCS).cumsum(0).tolist(),
                                  num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    assert plan.segments_for(2) > 1, "the pack no longer makes the plan cut: pick longer documents"
    inputs, dout, dht = inputs_of(kda, seed=31)
    gpu = on_gpu(inputs, dout, dht)
    first = call(kda, gpu)
    assert routed == ([] if kda else ["chunk_gated_delta_rule"])
    ref = reference(kda, inputs, dout, dht)
    check_gate(first, ref, f"{'kda' if kda else 'gdn'} segments")
    again = call(kda, gpu)
    for name, t in first.items():
        assert torch.equal(t, again[name]), f"{name} differs between runs"


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_segments_carry_the_state_across_their_cuts(kda, routed):
    inputs, dout, dht = inputs_of(kda, seed=43, carried=True)
    got = call(kda, on_gpu(inputs, dout, dht))
    assert routed == ([] if kda else ["chunk_gated_delta_rule"])
    ref = reference(kda, inputs, dout, dht)
    check_gate(got, ref, f"{'kda' if kda else 'gdn'} segments, state carried")


def run_reading_nothing_back(gpu):
    """run_op (GDN) under torch's sync debug mode "error": any read back from the device raises."""
    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run_op(False, gpu)
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def test_no_device_reads_after_the_first_call_of_a_batch(routed):
    gpu = on_gpu(*inputs_of(False, seed=37))
    run_op(False, gpu)
    run_reading_nothing_back(gpu)
    assert len(routed) == 2


def test_a_batch_of_new_offsets_reads_nothing_back_either(routed):
    """A training loop's batches bring new offsets every step: planning them (the context, its
    plan, their copies to the device) must not wait for the device either."""
    warm = on_gpu(*inputs_of(False, seed=43))
    run_op(False, warm)  # the op's own first-call set-up, outside the watch
    inputs, dout, dht = test_gpu_gdn.make_inputs([4100, 3000, 5000], 1, 2, seed=47)
    run_reading_nothing_back(on_gpu(inputs, dout, dht))
    assert len(routed) == 2


def test_plain_op_without_host_offsets(routed):
    inputs, dout, dht = inputs_of(False, seed=41)
    plain = call(False, on_gpu(inputs, dout, dht), host_offsets=False)
    assert routed == []
    check_gate(plain, reference(False, inputs, dout, dht), "gdn plain")
