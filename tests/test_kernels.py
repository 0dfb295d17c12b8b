"""kernels.py: linear layers through oneDNN on packed weights give the default products and gradients."""
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from kernels import PackedLinear, PackedWeight, onednn_available, packed_training

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_gives_the_default_output_and_gradients(bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 32, generator=g, requires_grad=True)
    linear = nn.Linear(32, 48, bias=bias)
    out = torch.randn(3, 7, 48, generator=g)
    expected = F.linear(x, linear.weight, linear.bias)
    wanted = torch.autograd.grad((expected * out).sum(), [x, *linear.parameters()])
    got = PackedLinear.apply(x, linear.weight, linear.bias, PackedWeight())
    grads = torch.autograd.grad((got * out).sum(), [x, *linear.parameters()])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, wanted):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_changed_weight_is_packed_again():
    linear, x, packed = nn.Linear(16, 8), torch.randn(5, 16), PackedWeight()
    PackedLinear.apply(x, linear.weight, linear.bias, packed)
    with torch.no_grad():
        linear.weight.mul_(-2)  # as an optimizer step does: in place, the version counter moves
    torch.testing.assert_close(PackedLinear.apply(x, linear.weight, linear.bias, packed),
                               F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)


def test_packed_training_applies_while_gradients_are_recorded_and_leaves_no_trace(tiny_config, monkeypatch):
    from model import GPT
    model, idx = GPT(tiny_config), torch.randint(0, tiny_config.vocab_size, (2, 8))
    calls, product = [], kernels.packed_product
    monkeypatch.setattr(kernels, "packed_product", lambda *a: calls.append(1) or product(*a))
    with torch.no_grad():
        plain = model(idx)[0]
    with packed_training(model):
        with torch.no_grad():
            assert torch.equal(model(idx)[0], plain) and not calls  # evaluation: the default kernels, untouched
        logits, loss = model(idx, idx)
        loss.backward()
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert len(calls) == 2 * linears  # each linear's forward, and its input's gradient in backward
    torch.testing.assert_close(logits, model(idx)[0], atol=1e-5, rtol=1e-5)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_training_with_packed_linears_follows_the_default_run(tmp_path, char_dataset, monkeypatch):
    from train import TrainConfig, train
    calls, product = [], kernels.packed_product
    monkeypatch.setattr(kernels, "packed_product", lambda *a: calls.append(1) or product(*a))
    tiny = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, eval_iters=2, device="cpu",
                learning_rate=3e-3, warmup_iters=2, max_iters=6, lr_decay_iters=6, eval_interval=100,
                dataset=str(char_dataset), gradient_accumulation_steps=2)
    losses = {}
    for packed in (False, True):
        out = tmp_path / str(packed)
        calls.clear()
        train(TrainConfig(**tiny, out_dir=str(out), packed_linear=packed), log=lambda *a: None)
        assert bool(calls) == packed
        losses[packed] = [r["loss"] for r in map(json.loads, open(out / "log.jsonl")) if r["kind"] == "train"]
    assert len(losses[True]) == 6
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), atol=1e-5, rtol=0)
