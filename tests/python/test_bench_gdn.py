"""The benchmarks' shared guard (bench/bench_gdn.py steps_that_run): a baseline arm whose first
call fails is left out and reported, so the run goes on; cake's own arms only when they run out of
the GPU's memory."""

import pytest
import torch

from conftest import import_bench

steps_that_run = import_bench("bench_gdn").steps_that_run


def test_a_failing_baseline_is_left_out_and_reported():
    leaf = torch.zeros(3, requires_grad=True)
    calls = []

    def ok(name):
        return lambda: calls.append(name)

    def failing():
        (leaf * 2).sum().backward()  # leaves a gradient behind, then fails
        raise RuntimeError("this shape is not supported")

    reported = {}
    kept = steps_that_run({"cake": ok("cake"), "fla": failing, "cudnn": ok("cudnn"),
                           "cake_control": ok("cake_control")}, [leaf],
                          lambda name, e: reported.setdefault(name, str(e)))
    assert list(kept) == ["cake", "cudnn", "cake_control"]
    assert reported == {"fla": "this shape is not supported"}
    assert calls == ["cake", "cudnn", "cake_control"]  # every arm's first call ran here
    assert leaf.grad is None


def test_a_failing_cake_arm_ends_the_run():
    def failing():
        raise RuntimeError("cake failed")

    with pytest.raises(RuntimeError, match="cake failed"):
        steps_that_run({"cake": failing}, [], lambda name, e: pytest.fail("reported"))


def test_a_cake_arm_out_of_memory_is_left_out_and_reported():
    def too_large():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 43.15 GiB.")

    reported = {}
    kept = steps_that_run({"cake": lambda: None, "cake_saved": too_large}, [],
                          lambda name, e: reported.setdefault(name, str(e)))
    assert list(kept) == ["cake"]
    assert reported == {"cake_saved": "CUDA out of memory. Tried to allocate 43.15 GiB."}
