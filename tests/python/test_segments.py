"""Exact segments on one GPU (cake.segments): a GDN call that gives cu_seqlens_cpu and whose plan
picks P > 1 runs through cake.kcp on one rank (a KDA call runs the plain op). On the CPU the kernels' condition is forced
(runs_kernels), so that the route runs on the FP64 reference: the same outputs, final states and
gradients as the plain op (relative 1e-12), with every option passed through; where the route is
not taken; and the checks of cu_seqlens_cpu."""

import warnings

import pytest
import torch

import cake
import cake.segments as segments
from conftest import (assert_rel, call_cake, cotangents, gradients, leaf_names, leaves, make_case,
                      record_segment_routes)

TOL = 1e-12
# Two documents of 63 and 55 chunks at 2 value heads: 4 walks on 132 SMs, so the plan cuts each
# document into 3 segments (the shortest it allows are 16 chunks).
LONG = [0, 4000, 7500]
# Many short documents: enough walks, the plan keeps one segment.
SHORT = [0] + [100 * (i + 1) for i in range(40)]


@pytest.fixture
def routed(monkeypatch):
    """Forces the kernels' condition on CPU tensors and records the calls that took the route
    and completed it."""
    monkeypatch.setattr(segments, "runs_kernels", lambda q: True)
    segments._CONTEXTS.clear()
    return record_segment_routes(monkeypatch)


def _compare(kda, t, opts, seed, routed, expect_route):
    """The call with cu_seqlens_cpu against the same call without it (the plain op)."""
    plain = call_cake(kda, t, opts)
    assert routed == []
    with_host = call_cake(kda, t, dict(opts, cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert routed == ([("chunk_kda" if kda else "chunk_gated_delta_rule")] if expect_route
                      else [])
    (o, ht), (o2, ht2) = plain, with_host
    assert_rel(o2, o, TOL, "o")
    if ht is not None:
        assert_rel(ht2, ht, TOL, "final_state")
    do, dht = cotangents(o, ht, seed)
    for name, a, b in zip(leaf_names(t), gradients(o2, ht2, do, dht, leaves(t)),
                          gradients(o, ht, do, dht, leaves(t))):
        assert_rel(a, b, TOL, f"d{name}")


def test_the_plan_cuts_few_long_documents_only():
    # the route's premise: P > 1 on LONG at 2 value heads, P = 1 on SHORT and at many heads
    def plan(cu, HV):
        return cake.kcp.build_context(cu).segments_for(HV)
    assert plan(LONG, 2) == 3
    assert plan(SHORT, 2) == 1
    assert plan(LONG, 64) == 1


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_segments_equal_the_plain_op(kda, routed):
    t, opts = make_case(3, kda=kda, cu=LONG, H=1, HV=2, K=16, V=8, initial_state=True,
                        l2norm=True, scale=0.3)
    _compare(kda, t, opts, 3, routed, expect_route=not kda)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_segments_carry_the_state_across_their_cuts(kda, routed):
    # decay near 1 and small beta: a segment's start state reaches its end (with make_case's
    # gate, ~e^-0.36 per token, nothing of it survives 1,000 tokens), so the summaries' M and
    # their adjoints decide the result
    t, opts = make_case(7, kda=kda, cu=LONG, H=1, HV=2, K=8, V=8, initial_state=True)
    with torch.no_grad():
        t["g"].mul_(1e-3)
        t["beta"].mul_(0.05)
    _compare(kda, t, opts, 7, routed, expect_route=not kda)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_segments_take_every_option(kda, routed):
    # the in-op gate with A_log and dt_bias, beta's sigmoid with negative eigenvalues, states with
    # V first: each changes the result, so an option dropped on the route fails the comparison
    t, opts = make_case(5, kda=kda, cu=LONG, H=1, HV=2, K=8, V=16, initial_state=True, gate=True,
                        dt_bias=True, beta_sigmoid=True, allow_neg_eigval=True)
    t["initial_state"] = t["initial_state"].detach().transpose(-1, -2).contiguous()
    t["initial_state"].requires_grad_()
    _compare(kda, t, dict(opts, state_v_first=True), 5, routed,
             expect_route=not kda)


def test_no_route_where_the_plan_keeps_one_segment(routed):
    t, opts = make_case(7, kda=False, cu=SHORT, H=1, HV=2, K=8, V=8)
    _compare(False, t, opts, 7, routed, expect_route=False)


def test_no_route_without_host_offsets_or_on_the_reference():
    t, opts = make_case(9, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    parsed = cake.options.parse(cake.options.GATED_DELTA_RULE, num_v_heads=2, head_dim_k=8)[0]
    cu = t["cu_seqlens"]
    assert segments.context_for(parsed, t["q"], t["v"], cu, None, None) is None
    # CPU tensors run the reference: no segments, though the plan would cut
    assert segments.context_for(parsed, t["q"], t["v"], cu, cu.clone(), None) is None


def test_host_offsets_are_checked():
    t, opts = make_case(11, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    cu = t["cu_seqlens"]
    cases = [
        (cu[:-1].clone(), "cu_seqlens_cpu must have cu_seqlens's shape (3,), got (2,)"),
        (torch.tensor([0, 4000, 7000]), "cu_seqlens_cpu must end at the batch's T = 7500"),
        (cu.double(), "cu_seqlens_cpu must be a 1-D integer tensor"),
        ([0, 4000, 7500], "cu_seqlens_cpu must be a CPU tensor"),
        (torch.tensor([5, 4000, 7500]), "cu_seqlens_cpu must start at 0, got 5"),
        (torch.tensor([0, 7600, 7500]), "cu_seqlens_cpu must be non-decreasing"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call_cake(False, t, dict(opts, cu_seqlens_cpu=bad))


def test_one_rank_even_under_torch_distributed(routed, monkeypatch):
    # a data-parallel job has torch.distributed initialised: the segments stay on this rank (a
    # context of the default group would run collectives with the other ranks' batches)
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    t, opts = make_case(13, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    _compare(False, t, opts, 13, routed, expect_route=True)


def test_the_plain_ops_errors_with_host_offsets(routed):
    # what the plain op refuses is refused with its message whether or not the route is taken
    t, opts = make_case(17, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    with pytest.raises(ValueError) as plain:
        call_cake(False, t, dict(opts, save_for_backward="bogus"))
    with pytest.raises(ValueError) as with_host:
        call_cake(False, t, dict(opts, save_for_backward="bogus",
                                 cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert str(with_host.value) == str(plain.value)
    bad = dict(t, k=t["k"][:, :-1].detach().requires_grad_())
    with pytest.raises(ValueError) as plain:
        call_cake(False, bad, opts)
    with pytest.raises(ValueError) as with_host:
        call_cake(False, bad, dict(opts, cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert str(with_host.value) == str(plain.value)
    assert "_kcp" not in str(with_host.value)


def test_a_refused_route_runs_the_plain_op(routed, monkeypatch):
    # cake.kcp refusing the arguments (before any work) leaves the call to the plain op
    refused = []

    def refuse(op, *args, **kwargs):
        refused.append(op.name)
        raise ValueError("refused")

    monkeypatch.setattr(segments.kcp_ops, "_run", refuse)
    t, opts = make_case(19, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    o, ht = call_cake(False, t, opts)
    o2, ht2 = call_cake(False, t, dict(opts, cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert refused == ["chunk_gated_delta_rule"] and routed == []
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_kda_runs_the_plain_op_on_a_pack_the_plan_cuts(routed):
    # the plan cuts LONG at 2 value heads, but KDA's chunk pass makes segments cost more than
    # they save (cake.segments): the call with host offsets is the plain op's, bitwise
    t, opts = make_case(23, kda=True, cu=LONG, H=1, HV=2, K=8, V=8, initial_state=True,
                        gate=True, dt_bias=True, lower_bound=-5.0)
    plain = call_cake(True, t, opts)
    with_host = call_cake(True, t, dict(opts, cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert routed == []
    assert all(torch.equal(a, b) for a, b in zip(plain, with_host))


def test_deprecated_layout_name_warns_once_on_the_route(routed):
    # the route receives the options as parsed (state_v_first, no transpose_state_layout): one
    # DeprecationWarning for the call, and cake.kcp takes the route rather than refusing both
    # names together
    t, opts = make_case(29, kda=False, cu=LONG, H=1, HV=2, K=8, V=16, initial_state=True)
    h0 = t["initial_state"].detach().transpose(-1, -2).contiguous()  # [N, HV, V, K]
    want = call_cake(False, dict(t, initial_state=h0), dict(opts, state_v_first=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call_cake(False, dict(t, initial_state=h0),
                        dict(opts, transpose_state_layout=True,
                             cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert routed == ["chunk_gated_delta_rule"]
    assert [w.category for w in caught] == [DeprecationWarning]
    assert_rel(got[0], want[0], TOL, "o")
    assert_rel(got[1], want[1], TOL, "final_state")


def test_host_offsets_may_hold_empty_documents():
    # equal neighbours are an empty document, which cu_seqlens allows too (only a decrease is
    # refused)
    t, opts = make_case(31, kda=False, cu=[0, 40, 40, 90, 90], H=1, HV=2, K=8, V=8)
    o, _ = call_cake(False, t, opts)
    o2, _ = call_cake(False, t, dict(opts, cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert torch.equal(o, o2)


def test_a_cu_seqlens_the_plain_op_refuses_is_refused_on_the_route(routed):
    # int16 cu_seqlens: cake.kcp would read the host offsets and run; the plain op refuses the
    # dtype, so the call with cu_seqlens_cpu must too, with the plain op's message
    t, opts = make_case(37, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    t["cu_seqlens"] = t["cu_seqlens"].to(torch.int16)
    with pytest.raises(ValueError) as plain:
        call_cake(False, t, opts)
    with pytest.raises(ValueError) as with_host:
        call_cake(False, t, dict(opts, cu_seqlens_cpu=t["cu_seqlens"].clone()))
    assert "cu_seqlens has an unsupported dtype int16" in str(plain.value)
    assert str(with_host.value) == str(plain.value) and routed == []


def test_the_context_cache_keeps_the_last_eight_packings(routed):
    # a training loop cycling through a few packings plans each once; a ninth evicts the oldest
    t, _ = make_case(41, kda=False, cu=LONG, H=1, HV=2, K=8, V=8)
    parsed = cake.options.parse(cake.options.GATED_DELTA_RULE, num_v_heads=2, head_dim_k=8)[0]
    packings = [[0, 4000 + 10 * i, 7500] for i in range(9)]
    for cu in packings:
        cu = torch.tensor(cu)
        assert segments.context_for(parsed, t["q"], t["v"], cu, cu.clone(), None) is not None
    assert len(segments._CONTEXTS) == segments._KEPT_CONTEXTS == 8
    kept = [key[0] for key in segments._CONTEXTS]
    assert kept == [tuple(cu) for cu in packings[1:]]
