"""Muon: torch.optim.Muon's math, in float32 on CPU, batched over same-shaped matrices."""
import math

import numpy as np
import pytest
import torch

from conftest import optimizer_settings
from model import GPT
from nanogpt.tokenizer import read_meta
from nanogpt.training.optim import Muon, configure_optimizers, orthogonalize


def test_orthogonalize_pushes_singular_values_towards_one():
    g = torch.randn(3, 64, 32) * torch.logspace(-1, 1, 32)  # singular values spread over 100x
    s = torch.linalg.svdvals(orthogonalize(g))
    assert s.min() > 0.5 and s.max() < 1.5  # the quintic's band: about (0.7, 1.2) after 5 steps
    tall, wide = torch.randn(48, 16), torch.randn(16, 48)
    torch.testing.assert_close(orthogonalize(tall).T, orthogonalize(tall.T.contiguous()))
    assert orthogonalize(wide).shape == (16, 48)


def numpy_muon_step(p, g, buf, lr, momentum, nesterov, weight_decay):
    """One Muon step on one matrix in float64, from the algorithm as published (Keller Jordan's Muon,
    torch.optim.Muon): returns the new parameter and momentum buffer."""
    buf = momentum * buf + (1 - momentum) * g
    u = (1 - momentum) * g + momentum * buf if nesterov else buf
    x = u.T if u.shape[0] > u.shape[1] else u  # iterate on the wide side
    x = x / max(np.linalg.norm(x), 1e-7)  # Frobenius norm: every singular value at most 1
    for _ in range(5):  # the quintic a x + b (x x^T) x + c (x x^T)^2 x
        gram = x @ x.T
        x = 3.4445 * x - 4.7750 * gram @ x + 2.0315 * gram @ gram @ x
    u = x.T if u.shape[0] > u.shape[1] else x
    rows, cols = p.shape
    return p * (1 - lr * weight_decay) - lr * math.sqrt(max(1.0, rows / cols)) * u, buf


@pytest.mark.parametrize("nesterov", [True, False])
def test_each_step_matches_the_published_algorithm_in_numpy(nesterov):
    """Three float32 steps on tall, wide and square matrices, two of one shape (one batch) with gradients of
    different sizes, against numpy in float64: momentum, Nesterov, the Newton-Schulz coefficients, each
    matrix's own norm, the rows/cols scale and the decoupled decay each change the result."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(48, 16), (48, 16), (16, 40), (24, 24)]
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in shapes]
    expected = [p.detach().double().numpy() for p in params]
    bufs = [np.zeros(shape) for shape in shapes]
    opt = Muon(params, lr=0.05, weight_decay=0.3, momentum=0.8, nesterov=nesterov, ns_dtype=torch.float32)
    for step in range(3):
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=gen) * (1 + 3 * i + step)
            expected[i], bufs[i] = numpy_muon_step(expected[i], p.grad.double().numpy(), bufs[i], 0.05, 0.8,
                                                   nesterov, 0.3)
        opt.step()
        for p, e in zip(params, expected):
            np.testing.assert_allclose(p.detach().double().numpy(), e, atol=2e-6, rtol=0)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="needs torch.optim.Muon (torch >= 2.9)")
@pytest.mark.parametrize("shape", [(32, 16), (16, 32), (24, 24)])
def test_matches_torch_muon_in_bfloat16(shape):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(shape)) for _ in range(3)]  # same shape: one batch
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    a = Muon(ours, lr=0.02, weight_decay=0.1, momentum=0.9, ns_dtype=torch.bfloat16)
    b = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, momentum=0.9)
    for step in range(3):
        grads = [torch.randn(shape) for _ in ours]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, atol=2e-3, rtol=0)  # bfloat16 matmuls, batched vs one by one


def polar_newton_schulz(m, steps=5):
    """The quintic Newton-Schulz iteration's result in float64 from the SVD m = U S V^T: U f(S / |S|) V^T with f
    the scalar quintic a s + b s^3 + c s^5 applied steps times, the iteration's action on each singular value;
    and the polar factor U V^T it approximates."""
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    x = s / np.sqrt((s ** 2).sum())  # divided by the Frobenius norm
    for _ in range(steps):
        x = 3.4445 * x - 4.7750 * x ** 3 + 2.0315 * x ** 5
    return (u * x) @ vt, u @ vt


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 0.06)])
@pytest.mark.parametrize("shape", [(48, 32), (32, 48)])
def test_orthogonalize_is_newton_schulz_computed_from_the_svd_in_float64(dtype, atol, shape):
    """Against numpy's SVD, not against itself in another dtype: the quintic applied to each singular value,
    within float32's rounding, or bfloat16's (measured 0.03; one step fewer is 0.25 off); and U V^T within the
    quintic's band (singular values in about (0.68, 1.21) after 5 steps: 0.32 in the spectral norm)."""
    g = torch.randn(3, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = g * torch.logspace(-1, 1, shape[1], dtype=torch.float64)  # singular values spread over 100x
    out = orthogonalize(g.float(), dtype=dtype)
    assert out.dtype == torch.float32 and out.shape == (3, *shape)
    for m, o in zip(g.numpy(), out.double().numpy()):
        want, polar = polar_newton_schulz(m)
        np.testing.assert_allclose(o, want, atol=atol, rtol=0)
        assert np.linalg.norm(o - polar, 2) < 0.35


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(tiny_config):
    model = GPT(tiny_config)
    opt = configure_optimizers(model, optimizer_settings(learning_rate=1e-3, optimizer="muon", muon_lr=0.02))
    muon, adamw = opt.optimizers["muon"], opt.optimizers["adamw"]
    muon_params = {id(p) for g in muon.param_groups for p in g["params"]}
    assert muon_params == {id(p) for p in model.transformer.h.parameters() if p.dim() == 2}
    adam_params = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert id(model.transformer.wte.weight) in adam_params and not muon_params & adam_params
    assert len(muon_params) + len(adam_params) == len(list(model.parameters()))
    assert [g["initial_lr"] for g in opt.param_groups] == [0.02, 1e-3, 1e-3]
    state = opt.state_dict()
    assert set(state) == {"muon", "adamw"}
    opt.load_state_dict(state)


@pytest.mark.parametrize("tie", [True, False])
def test_embedding_lr_puts_the_embeddings_in_a_group_of_their_own(tiny_config, tie):
    """With embedding_lr the token embedding (the head too, where tied) steps at that rate, undecayed; without
    it AdamW keeps nanoGPT's two groups, so that nanoGPT's optimizer states still load."""
    from dataclasses import replace
    model = GPT(replace(tiny_config, tie_weights=tie))
    assert len(configure_optimizers(model, optimizer_settings(learning_rate=1e-3)).param_groups) == 2
    opt = configure_optimizers(model, optimizer_settings(learning_rate=1e-3, optimizer="muon", embedding_lr=0.05))
    adamw = opt.optimizers["adamw"]
    assert [g["initial_lr"] for g in adamw.param_groups] == [1e-3, 1e-3, 0.05]
    assert [id(p) for p in adamw.param_groups[2]["params"]] == [id(model.transformer.wte.weight)]
    assert adamw.param_groups[2]["weight_decay"] == 0.0
    head_group = 2 if tie else 0
    assert any(p is model.lm_head.weight for p in adamw.param_groups[head_group]["params"])
    model.transformer.wte.weight.grad = torch.ones_like(model.transformer.wte.weight)
    before = model.transformer.wte.weight.detach().clone()
    adamw.step()  # Adam's first step moves each entry by its rate (the sign of a constant gradient), no decay
    moved = before - model.transformer.wte.weight.detach()
    torch.testing.assert_close(moved, torch.full_like(moved, 0.05), atol=1e-5, rtol=0)


def test_muon_trains_a_tiny_model(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config)
    opt = configure_optimizers(model, optimizer_settings(weight_decay=0.0, learning_rate=3e-3, beta2=0.99, optimizer="muon", muon_lr=0.02))
    x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    for _ in range(100):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_embedding_lr_applies_to_every_value_embedding_table(tiny_config, optimizer):
    """Value embeddings (two tables, each read by one of the first and one of the last two layers) are
    embeddings: with embedding_lr they step at that rate, undecayed, with the token embedding; nothing else does."""
    from dataclasses import replace
    model = GPT(replace(tiny_config, value_embeds=2, n_layer=4, pos_emb="rope"))
    opt = configure_optimizers(model, optimizer_settings(learning_rate=1e-3, optimizer=optimizer, embedding_lr=0.05))
    rate = {id(p): (g["initial_lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    tables = [model.transformer.wte.weight, *(ve.weight for ve in model.transformer.ve)]
    assert len(tables) == 3 and all(rate[id(p)] == (0.05, 0.0) for p in tables)
    others = [p for p in model.parameters() if all(p is not t for t in tables)]
    assert others and all(rate[id(p)][0] != 0.05 for p in others)


def described(model, optimizer):
    """Each parameter group of optimizer: its optimizer's kind, its parameters' names and its settings."""
    names = {id(p): name for name, p in model.named_parameters()}
    parts = optimizer.optimizers.values() if hasattr(optimizer, "optimizers") else [optimizer]
    return [(type(part).__name__, [names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for part in parts for g in part.param_groups]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_bench_and_fsdp_py_build_the_optimizer_train_py_builds(tmp_path, char_dataset, monkeypatch, optimizer):
    """One config, three callers: bench's plain loop and consolidate.py's consolidation hold the groups, rates and
    settings train.py's run holds (embedding_lr's group too), and bench Muon's Newton-Schulz dtype;
    consolidate.py's file holds the optimizer state a one-process run's ckpt.pt holds, entry by entry."""
    import bench
    import consolidate
    import train
    from nanogpt.training import optim
    built = {}

    def recording(caller, real):
        def configure(model, settings):
            opt = real(model, settings)
            built[caller] = (described(model, opt), settings.ns_dtype)  # before any step moves a rate
            return opt
        return configure
    # consolidate.py imports configure_optimizers from optim when called: optim's is the one it calls
    for caller, module in (("train", train), ("bench", bench), ("consolidate", optim)):
        monkeypatch.setattr(module, "configure_optimizers", recording(caller, optim.configure_optimizers))
    options = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=2, gradient_accumulation_steps=1,
                   device="cpu", dataset=str(char_dataset), optimizer=optimizer, embedding_lr=0.05, learning_rate=2e-3,
                   weight_decay=0.2, beta1=0.8, beta2=0.99, muon_lr=0.03, muon_momentum=0.9, muon_weight_decay=0.01,
                   value_embeds=1, pos_emb="rope", tie_weights=False, matmul_dtype="auto")
    out = tmp_path / "out"
    train.train(train.TrainConfig(**options, max_iters=1, eval_iters=1, parallel="fsdp", out_dir=str(out)),
                log=lambda *a: None)
    consolidated = consolidate.consolidate(str(out / "ckpt.pt"))["optimizer"]
    train.train(train.TrainConfig(**options, max_iters=1, eval_iters=1, out_dir=str(tmp_path / "plain")),
                log=lambda *a: None)
    cfg = bench.BenchConfig(**options, bench_iters=1, bench_warmup=0)
    model = GPT(cfg.model_config(read_meta(str(char_dataset))["vocab_size"]))
    bench.plain_loop_ms(cfg, model, torch.device("cpu"), torch.float32, log=lambda *a: None)
    groups, ns_dtype = built["train"]
    assert len(groups) == (4 if optimizer == "muon" else 3)  # with the embeddings' own group
    assert built["consolidate"][0] == groups
    assert built["bench"] == (groups, ns_dtype)
    # and the state it fills them with: a one-process run's, index by index (Adam's moments, Muon's momentum)
    plain = torch.load(tmp_path / "plain" / "ckpt.pt", weights_only=True)["optimizer"]
    parts = [(None, consolidated, plain)] if "state" in plain else [(k, consolidated[k], plain[k]) for k in plain]
    assert len(parts) == (2 if optimizer == "muon" else 1) and consolidated.keys() == plain.keys()
    for part, got, want in parts:
        assert got["param_groups"] == want["param_groups"], part
        assert got["state"].keys() == want["state"].keys() and want["state"], part
        for i, state in want["state"].items():
            assert got["state"][i].keys() == state.keys(), (part, i)
            for key, value in state.items():
                torch.testing.assert_close(torch.as_tensor(got["state"][i][key]), torch.as_tensor(value), atol=1e-6,
                                           rtol=1e-5, msg=lambda m: f"{part} state {i} {key}: {m}")
