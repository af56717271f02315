"""python -m cake.train, the main job: a tiny run end to end (its log, plot and falling loss),
the corpus's packing, and the command line's help and refusals."""

import json
import subprocess
import sys

import pytest
import torch

from cake.train import cli, corpus

TINY = ["--layers", "gdn,kda", "--d-model", "32", "--heads", "1", "--v-heads", "2",
        "--head-dim", "16", "--tokens", "512", "--steps", "30", "--lr", "1e-2"]


def tail(text):
    return (text.decode() if isinstance(text, bytes) else text or "")[-3000:]


def run_train(tmp_path, *args, timeout=300):
    try:
        return subprocess.run([sys.executable, "-m", "cake.train", *args, "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        # What the run had printed says where it was (set-up, cake's steps, FLA's steps).
        pytest.fail(f"python -m cake.train ran past {timeout} s\nstdout: {tail(expired.stdout)}"
                    f"\nstderr: {tail(expired.stderr)}")


def test_tiny_cpu_run_learns_and_writes_its_outputs(tmp_path):
    result = run_train(tmp_path, "--device", "cpu", *TINY)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"wrote {tmp_path / 'loss.png'}" in result.stdout
    assert f"wrote {tmp_path / 'log.json'}" in result.stdout
    assert "30/30" in result.stderr  # the progress bar reached the end
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["settings"]["model"]["layers"] == ["gdn", "kda"]
    (run,) = log["runs"]
    losses = [s["loss"] for s in run["steps"]]
    assert len(losses) == 30 and all(torch.isfinite(torch.tensor(losses)))
    assert run["loss_last"] < run["loss_first"] - 0.5  # from ~5.5 (a uniform guess over bytes)
    assert run["learned"] and run["fixed_loss_after"] < run["fixed_loss_before"] - 0.5
    assert "fixed batch" in result.stdout
    assert run["tokens"] == 30 * 512 and run["tokens_per_second"] > 0
    assert run["peak_memory_bytes"] > 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_that_learns_nothing_fails(tmp_path):
    """Learning rate 0: the fixed batch's loss does not move, so the job exits 1 whatever the
    training batches' losses did."""
    result = run_train(tmp_path, "--device", "cpu", *TINY[:-4], "--steps", "6", "--lr", "0")
    assert result.returncode == 1, result.stdout[-2000:]
    assert "did not fall by more than 0.05" in result.stderr
    (run,) = json.loads((tmp_path / "log.json").read_text())["runs"]
    assert not run["learned"] and run["fixed_loss_after"] == run["fixed_loss_before"]


def test_a_run_without_matplotlib_writes_its_log(tmp_path):
    """cake needs only torch: without matplotlib the job trains, writes log.json and says why
    there is no loss.png."""
    code = ("import sys; sys.modules['matplotlib'] = None; from cake.train import cli; "
            f"cli.main({['--device', 'cpu', *TINY, '--out', str(tmp_path)]!r})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no loss.png: matplotlib is not installed" in result.stdout
    assert (tmp_path / "log.json").exists() and not (tmp_path / "loss.png").exists()


def test_weight_decay_on_matrices_only():
    from cake.layers import GatedDeltaNet
    from cake.train.loop import parameter_groups
    layer = GatedDeltaNet(hidden_size=16, head_dim=8, num_heads=1, expand_v=1)
    decay, keep = parameter_groups(layer)
    assert decay["weight_decay"] > 0 and keep["weight_decay"] == 0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert any(p is layer.A_log for p in keep["params"])
    assert any(p is layer.dt_bias for p in keep["params"])
    assert len(decay["params"]) + len(keep["params"]) == len(list(layer.parameters()))


def test_learning_needs_more_than_the_margin(monkeypatch):
    """A fixed-batch loss that falls by less than LEARNED_MARGIN is no learning."""
    from cake.train import loop
    falls = iter([5.0, 5.0 - loop.LEARNED_MARGIN / 2])
    monkeypatch.setattr(loop, "fixed_batch_loss", lambda *args: next(falls))
    model = cli.LanguageModel(cli.ModelConfig(layers=("gdn",), d_model=16, num_heads=1,
                                              num_v_heads=1, head_dim=8))
    config = loop.TrainConfig(steps=1, tokens_per_step=64, lr=0.0, seed=0,
                              device=torch.device("cpu"))
    assert not loop.train(model, config, "cake")["learned"]


@pytest.mark.parametrize("host_offsets", [False, True])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_host_offsets_reach_cake_layers_only_when_asked(host_offsets, checkpoint):
    """--cu-seqlens-cpu: every layer gets the batch's offsets on the host, equal to cu_seqlens;
    without it, none does."""
    from cake.train import loop
    model = cli.LanguageModel(cli.ModelConfig(layers=("gdn", "kda"), d_model=16, num_heads=1,
                                              num_v_heads=1, head_dim=8, checkpoint=checkpoint))
    seen = []
    for block in model.blocks:
        def spy(*args, _forward=block.attn.forward, **kwargs):
            seen.append((kwargs["cu_seqlens"], kwargs.get("cu_seqlens_cpu")))
            return _forward(*args, **kwargs)
        block.attn.forward = spy
    config = loop.TrainConfig(steps=2, tokens_per_step=64, lr=0.0, seed=0,
                              device=torch.device("cpu"), host_offsets=host_offsets)
    loop.train(model, config, "cake")
    layers = len(model.blocks)
    before, training, after = seen[:layers], seen[layers:-layers], seen[-layers:]
    assert all(host is None for _, host in before + after)  # the fixed batch's loss: none
    assert len(training) == 2 * layers * (2 if checkpoint else 1)  # checkpoint: forwards again
    for cu, host in training:
        if host_offsets:
            assert host.device.type == "cpu" and torch.equal(host, cu.cpu())
        else:
            assert host is None


def test_batches_pack_documents_with_next_byte_targets():
    first, second = corpus.batches(700, seed=3), corpus.batches(700, seed=3)
    for _ in range(5):
        batch, again = next(first), next(second)
        assert torch.equal(batch.inputs, again.inputs)  # the seed fixes the batches
        cu = batch.cu_seqlens.tolist()
        assert batch.inputs.shape == batch.targets.shape == (1, 700)
        assert cu[0] == 0 and cu[-1] == 700 and all(a < b for a, b in zip(cu, cu[1:]))
        for start, end in zip(cu, cu[1:]):
            # within a document, each target is the next input
            assert torch.equal(batch.inputs[0, start + 1:end], batch.targets[0, start:end - 1])


def test_batches_of_any_size():
    # the parts of a batch add up to its tokens when they do not divide evenly (701 = 4 x 175
    # + 1), and a batch smaller than the streams reads fewer files
    for tokens in (701, 3):
        batch = next(corpus.batches(tokens, seed=0))
        assert batch.inputs.shape == batch.targets.shape == (1, tokens)
        assert batch.cu_seqlens[0] == 0 and batch.cu_seqlens[-1] == tokens


def test_the_seed_shuffles_the_files():
    assert not torch.equal(next(corpus.batches(256, seed=3)).inputs,
                           next(corpus.batches(256, seed=4)).inputs)


def test_the_corpus_is_the_standard_library_without_installed_packages(tmp_path, monkeypatch):
    (tmp_path / "site-packages" / "pkg").mkdir(parents=True)
    (tmp_path / "dist-packages").mkdir()
    (tmp_path / "email").mkdir()
    for name in ("os.py", "email/parser.py", "site-packages/pkg/mod.py",
                 "dist-packages/other.py", "email/README.txt"):
        (tmp_path / name).write_text("x = 1\n")
    monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    assert corpus.source_files() == [tmp_path / "email" / "parser.py", tmp_path / "os.py"]


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    from cake.train import loop
    config = loop.TrainConfig(steps=100, tokens_per_step=64, lr=1.0, seed=0,
                              device=torch.device("cpu"))
    assert loop.learning_rate(0, config) == pytest.approx(0.1)  # warm-up: 10 steps
    assert loop.learning_rate(9, config) == pytest.approx(1.0)
    assert loop.learning_rate(10, config) == pytest.approx(1.0)  # the cosine's start
    # the last step: cos(pi * 89 / 90), just above the floor of 10%
    assert loop.learning_rate(99, config) == pytest.approx(0.1 + 0.45 * (1 - 0.99939083))
    assert 0.1 < loop.learning_rate(99, config) < 0.101


def test_the_fixed_batch_is_not_a_training_batch(monkeypatch):
    """The learning check reads a batch the run never trains on (the corpus at another seed)."""
    from cake.train import loop
    fixed, trained = [], []
    monkeypatch.setattr(loop, "fixed_batch_loss",
                        lambda model, batch, device: fixed.append(batch.inputs) or 5.0)
    model = cli.LanguageModel(cli.ModelConfig(layers=("gdn",), d_model=16, num_heads=1,
                                              num_v_heads=1, head_dim=8))
    loss = model.loss
    monkeypatch.setattr(model, "loss", lambda inputs, *rest: trained.append(inputs)
                        or loss(inputs, *rest))
    config = loop.TrainConfig(steps=2, tokens_per_step=64, lr=0.0, seed=0,
                              device=torch.device("cpu"))
    loop.train(model, config, "cake")
    assert len(fixed) == 2 and torch.equal(fixed[0], fixed[1])  # before and after training
    assert len(trained) == 2
    assert all(not torch.equal(fixed[0], x) for x in trained)


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--device", "--layers", "--d-model", "--heads", "--v-heads", "--head-dim",
                   "--tokens", "--steps", "--lr", "--seed", "--save-for-backward",
                   "--checkpoint", "--cu-seqlens-cpu", "--compare", "--out", "loss.png", "log.json", "tokens/s",
                   "peak memory"):
        assert option in text, option


@pytest.mark.parametrize("args, message", [
    (["--device", "cpu", "--compare", "fla"], "--compare fla needs a CUDA GPU"),
    (["--layers", "gdn,mamba"], "--layers takes gdn and kda"),
    (["--device", "cpu", "--heads", "2", "--v-heads", "3"], "must be a multiple"),
    (["--device", "cpu", "--heads", "0"], "--heads must be at least 1"),
])
def test_refusals_are_clear(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not cli.cuda_usable(), reason="needs a CUDA device and cake's kernels")
def test_tiny_gpu_run_with_fla_comparison(tmp_path):
    pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")
    # The GPU defaults' layer shape and batch (2 blocks, 30 steps): FLA's Triton autotuning and
    # TileLang kernels for another shape would take minutes to compile on a fresh machine. The
    # run is another process: hand it the memory this one's allocator holds unused.
    torch.cuda.empty_cache()
    result = run_train(tmp_path, "--device", "cuda", "--layers", "gdn,gdn", "--steps", "30",
                       "--compare", "fla", timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "speed: cake's training step at" in result.stdout
    runs = json.loads((tmp_path / "log.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["cake", "fla"]
    # The same start and the same batches: the first losses agree closely.
    assert abs(runs[0]["steps"][0]["loss"] - runs[1]["steps"][0]["loss"]) < 1e-2
