"""kernels.py: linear layers through oneDNN on packed weights give the default products and gradients."""
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nanogpt.cpu import kernels
from nanogpt.cpu.kernels import PackedLinear, PackedWeight, onednn_available, packed_training

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



def test_patches_restore_what_they_replaced_in_any_order():
    """A module's own instance forward comes back after nested patches, whether they close inside out or the
    outer one first (a generator closed late)."""
    lin, own = nn.Linear(2, 2), lambda x: "own"
    lin.forward = own
    a, b = (lambda x: "a"), (lambda x: "b")
    with kernels.patched_forwards({lin: a}):
        with kernels.patched_forwards({lin: b}):
            assert lin.forward is b
        assert lin.forward is a
    assert lin.forward is own
    outer, inner = kernels.patched_forwards({lin: a}), kernels.patched_forwards({lin: b})
    outer.__enter__(), inner.__enter__()
    outer.__exit__(None, None, None)
    assert lin.forward is b  # still open
    inner.__exit__(None, None, None)
    assert lin.forward is own
    del lin.forward
    with kernels.patched_forwards({lin: a}):
        pass
    assert "forward" not in lin.__dict__


def loss_and_grads(model, idx):
    model.zero_grad()
    _, loss = model(idx, idx)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def test_generation_inside_packed_training_leaves_the_training_kernels(tiny_config, monkeypatch):
    """Sampling during training: generate's packed weights, patched within packed_training, give back the
    training kernels, and the training step and the tokens are those of each alone."""
    from model import GPT
    from nanogpt.generate import generate
    model, idx = GPT(tiny_config), torch.randint(0, tiny_config.vocab_size, (2, 8))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    tokens = generate(model, idx[:, :3], 6, temperature=0)
    with packed_training(model):
        alone = loss_and_grads(model, idx)
    calls, apply = [], PackedLinear.apply
    monkeypatch.setattr(PackedLinear, "apply", lambda *a: calls.append(1) or apply(*a))
    with packed_training(model):
        training = [m.forward for m in linears]
        assert torch.equal(generate(model, idx[:, :3], 6, temperature=0), tokens)
        assert [m.forward for m in linears] == training and not calls
        nested = loss_and_grads(model, idx)
    assert len(calls) == len(linears)
    assert all(torch.equal(a, b) for a, b in zip(nested, alone))
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_packed_training_inside_packed_weights_leaves_the_packed_weights(tiny_config, monkeypatch):
    """A training step within generation's packed weights gives them back: inference then runs on them
    again, with the logits of packed weights alone."""
    from model import GPT
    from nanogpt.cpu import decoding
    model, idx = GPT(tiny_config), torch.randint(0, tiny_config.vocab_size, (2, 8))
    with packed_training(model):
        alone = loss_and_grads(model, idx)
    with decoding(model, 2), torch.inference_mode():
        logits = model(idx)[0]
    calls, product = [], kernels.packed_product
    monkeypatch.setattr(kernels, "packed_product", lambda *a: calls.append(1) or product(*a))
    with decoding(model, 2):
        with packed_training(model):
            nested = loss_and_grads(model, idx)
        calls.clear()
        with torch.inference_mode():
            assert torch.equal(model(idx)[0], logits)
        assert len(calls) == sum(isinstance(m, nn.Linear) for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(nested, alone))
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_generator_closed_after_packed_training_leaves_no_patch(tiny_config):
    """stream() holds its packed weights until it is closed, which may be after the packed_training it
    started in has ended: neither patch outlives its own end."""
    from model import GPT
    from nanogpt.generate import stream
    model = GPT(tiny_config)
    with packed_training(model):
        steps = stream(model, torch.zeros(1, 2, dtype=torch.long), 5, temperature=0)
        next(steps)
    assert model.lm_head.forward.__qualname__.startswith("inference_forward")  # the stream's, still open
    steps.close()
    assert not any("forward" in m.__dict__ for m in model.modules())

needs_bfloat16 = pytest.mark.skipif(not kernels.bfloat16_products_supported(), reason="this CPU has no native bfloat16")


def rounded(t):
    """t rounded to bfloat16, in float64: what a bfloat16 product reads."""
    return t.bfloat16().double()


@needs_bfloat16
@pytest.mark.parametrize("bias", [True, False])
def test_bfloat16_linear_rounds_the_products_inputs_and_outputs_only(bias):
    """Each product equals the float64 product of bfloat16-rounded inputs, rounded to bfloat16 (one ulp: 2^-8
    relative); the bias and the bias gradient stay float32."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 32, generator=g, requires_grad=True)
    linear = nn.Linear(32, 48, bias=bias)
    out = torch.randn(3, 7, 48, generator=g)
    y = kernels.BFloat16Linear.apply(x, linear.weight, linear.bias, kernels.BFloat16Weight())
    grads = torch.autograd.grad((y * out).sum(), [x, *linear.parameters()])
    assert y.dtype == torch.float32 and all(t.dtype == torch.float32 for t in grads)
    w, rows, dy = rounded(linear.weight), rounded(x.detach().reshape(-1, 32)), out.reshape(-1, 48).double()
    expected = {"y": rows @ w.T, "dx": rounded(dy) @ w, "dw": rounded(dy).T @ rows}
    got = {"y": y.reshape(-1, 48) - (linear.bias if bias else 0), "dx": grads[0].reshape(-1, 32), "dw": grads[1]}
    for name in expected:
        torch.testing.assert_close(got[name].double(), expected[name], atol=1e-6, rtol=2 ** -8, msg=name)
    assert not torch.allclose(got["y"].double(), expected["y"], atol=0, rtol=1e-6)  # rounded: not float32's product
    if bias:
        torch.testing.assert_close(grads[2], out.reshape(-1, 48).sum(0))


@needs_bfloat16
def test_training_with_bfloat16_products_follows_the_float32_run(tmp_path, char_dataset, monkeypatch):
    """matmul_dtype=bfloat16: the linear layers and Muon's iteration run in bfloat16, the losses stay within
    bfloat16's rounding of the float32 run's."""
    from nanogpt.training import optim
    from train import TrainConfig, train
    calls, apply = [], kernels.BFloat16Linear.apply
    monkeypatch.setattr(kernels.BFloat16Linear, "apply", lambda *a: calls.append(1) or apply(*a))
    ns_dtypes, orthogonalize = [], optim.orthogonalize
    monkeypatch.setattr(optim, "orthogonalize", lambda g, steps, dtype: ns_dtypes.append(dtype) or orthogonalize(g, steps, dtype=dtype))
    tiny = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, eval_iters=2, device="cpu",
                learning_rate=3e-3, warmup_iters=2, max_iters=6, lr_decay_iters=6, eval_interval=100,
                dataset=str(char_dataset), optimizer="muon", gradient_accumulation_steps=1)
    losses = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        calls.clear(), ns_dtypes.clear()
        train(TrainConfig(**tiny, out_dir=str(out), matmul_dtype=dtype), log=lambda *a: None)
        assert bool(calls) == (dtype == "bfloat16")
        assert set(ns_dtypes) == {getattr(torch, dtype)}
        losses[dtype] = [r["loss"] for r in map(json.loads, open(out / "log.jsonl")) if r["kind"] == "train"]
    assert len(calls) == 6 * 9  # 6 iters x (2 blocks x 4 linear layers + the head)
    torch.testing.assert_close(torch.tensor(losses["bfloat16"]), torch.tensor(losses["float32"]), atol=0, rtol=2e-2)
    assert losses["bfloat16"] != losses["float32"]


def test_bfloat16_products_are_refused_where_they_would_not_pay(tmp_path, char_dataset, monkeypatch):
    from configurator import UserError
    from train import TrainConfig, train
    tiny = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2, max_iters=1, dataset=str(char_dataset),
                out_dir=str(tmp_path / "out"), matmul_dtype="bfloat16", device="cpu")
    with pytest.raises(UserError, match="for float32 training on a CPU"):
        train(TrainConfig(**tiny, dtype="bfloat16"), log=lambda *a: None)
    monkeypatch.setattr(kernels.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(UserError, match="no native bfloat16"):
        train(TrainConfig(**tiny), log=lambda *a: None)
    with pytest.raises(ValueError, match="matmul_dtype must be float32, bfloat16 or auto"):
        TrainConfig(matmul_dtype="float16")
    notes = []  # auto: float32 products where bfloat16 is not native, and a note that says so
    summary = train(TrainConfig(**{**tiny, "matmul_dtype": "auto"}), log=notes.append)
    assert summary["iters"] == 1 and any("matmul_dtype=auto: float32 products" in n for n in notes)
