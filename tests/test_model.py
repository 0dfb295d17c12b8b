"""The GPT-2-style model: attention math, causality, heads, init, loss, training signal."""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import reference
from conftest import optimizer_settings
from model import GPT, CausalSelfAttention, GPTConfig
from nanogpt.training.optim import configure_optimizers
from test_model_options import spread


def random_model(config, seed=0):
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():  # GPT-2 init has zero biases and unit gains: perturb them so they are tested
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("impl", ["sdpa", "manual"])
def test_logits_match_numpy_reference(tiny_config, impl):
    model = spread(random_model(replace(tiny_config, attn_impl=impl)))  # attention far from uniform, GELU curved
    idx = torch.randint(0, tiny_config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    expected, _ = reference.forward(model.state_dict(), model.config, idx[0].numpy())
    np.testing.assert_allclose(logits[0].detach().double().numpy(), expected, atol=2e-6, rtol=0)


def test_attention_paths_agree(tiny_config):
    torch.manual_seed(0)
    sdpa = CausalSelfAttention(replace(tiny_config, attn_impl="sdpa"))
    manual = CausalSelfAttention(replace(tiny_config, attn_impl="manual"))
    manual.load_state_dict(sdpa.state_dict())
    x = torch.randn(3, 16, tiny_config.n_embd)
    torch.testing.assert_close(sdpa(x), manual(x), atol=1e-5, rtol=1e-5)


def test_attention_weights_are_scaled_masked_softmax(tiny_config):
    """Two heads by hand: scores q.k/sqrt(hd) (hd = 8, not n_embd = 16), -inf above the diagonal, rows
    renormalized over the visible keys. Inputs large enough that the weights are far from uniform, where
    a wrong scale or a wrong softmax axis shows."""
    cfg = replace(tiny_config, n_head=2, n_embd=16, attn_impl="manual")
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).eval()
    captured = []
    attn.hook_weights.register_forward_hook(lambda m, inp, out: captured.append(out.detach()))
    x = 10 * torch.randn(1, 5, 16)
    with torch.no_grad():
        q, k, v = (t.view(1, 5, 2, 8).transpose(1, 2) for t in attn.c_attn(x).split(16, dim=2))  # (1, 2, 5, 8)
        y = attn.attend(q, k, v)
    q, k, v = q[0].double().numpy(), k[0].double().numpy(), v[0].double().numpy()
    weights, expected = np.zeros((2, 5, 5)), np.zeros((2, 5, 8))
    for h in range(2):
        for t in range(5):
            scores = np.array([q[h, t] @ k[h, s] for s in range(t + 1)]) / math.sqrt(8)
            weights[h, t, :t + 1] = np.exp(scores) / np.exp(scores).sum()
            expected[h, t] = weights[h, t, :t + 1] @ v[h, :t + 1]
    assert weights[:, 1:].max(-1).mean() > 0.7  # far from uniform
    np.testing.assert_allclose(captured[0][0].double().numpy(), weights, atol=1e-6)
    np.testing.assert_allclose(y[0].double().numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "manual"])
def test_future_tokens_do_not_change_past_logits(tiny_config, impl):
    model = random_model(replace(tiny_config, attn_impl=impl))
    idx = torch.randint(0, 64, (2, 16))
    changed = idx.clone()
    changed[:, 9:] = (changed[:, 9:] + 7) % 64
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_heads_are_contiguous_channel_blocks_merged_by_concatenation(tiny_config):
    """Zeroing head h's value weights changes exactly channels h*hd..(h+1)*hd-1 of the merged output."""
    cfg = replace(tiny_config, attn_impl="manual")
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).eval()
    captured = []
    attn.c_proj.register_forward_hook(lambda m, inp, out: captured.append(inp[0].detach().clone()))
    x = torch.randn(1, 6, cfg.n_embd)
    attn(x)
    hd = cfg.head_dim
    for h in range(cfg.n_head):
        with torch.no_grad():
            saved = attn.c_attn.weight.clone(), attn.c_attn.bias.clone()
            rows = slice(2 * cfg.n_embd + h * hd, 2 * cfg.n_embd + (h + 1) * hd)  # v rows of head h
            attn.c_attn.weight[rows] = 0
            attn.c_attn.bias[rows] = 0
            attn(x)
            attn.c_attn.weight.copy_(saved[0])
            attn.c_attn.bias.copy_(saved[1])
        merged = captured[-1][0]
        assert torch.all(merged[:, h * hd:(h + 1) * hd] == 0)
        others = torch.cat([merged[:, :h * hd], merged[:, (h + 1) * hd:]], dim=1)
        torch.testing.assert_close(others, torch.cat([captured[0][0][:, :h * hd], captured[0][0][:, (h + 1) * hd:]], 1))
    # merge is concatenation then c_proj, not an average of heads
    torch.testing.assert_close(attn(x), attn.c_proj(captured[0]))


def test_logits_at_t_score_token_t_plus_1(tiny_config):
    model = random_model(tiny_config)
    idx = torch.randint(0, 64, (2, 10))
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    manual = -torch.log_softmax(logits, -1).gather(-1, idx[:, 1:, None]).mean()
    torch.testing.assert_close(loss, manual)


def test_initial_loss_is_close_to_log_vocab(tiny_config):
    cfg = replace(tiny_config, vocab_size=512, block_size=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, 512, (8, 32))
    _, loss = model(idx, torch.randint(0, 512, (8, 32)))
    assert abs(loss.item() - math.log(512)) < 0.05


def test_tiny_model_overfits_one_batch(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config)
    x = torch.randint(0, 64, (4, 16))
    y = torch.randint(0, 64, (4, 16))
    opt = configure_optimizers(model, optimizer_settings(weight_decay=0.0, learning_rate=3e-3, beta2=0.99))
    for _ in range(300):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_gpt2_init_statistics():
    cfg = GPTConfig(block_size=64, vocab_size=1000, n_layer=4, n_head=4, n_embd=256)
    torch.manual_seed(0)
    model = GPT(cfg)
    for p in (model.transformer.wte.weight, model.transformer.wpe.weight, model.transformer.h[0].mlp.c_fc.weight,
              model.transformer.h[3].attn.c_attn.weight):
        assert p.std().item() == pytest.approx(0.02, rel=0.03)
    for block in (model.transformer.h[0], model.transformer.h[3]):  # every residual projection, both kinds
        for p in (block.attn.c_proj.weight, block.mlp.c_proj.weight):
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.03)
    assert model.transformer.h[0].attn.c_attn.bias.abs().max().item() == 0
    assert model.lm_head.weight is model.transformer.wte.weight


def test_parameter_count_counts_tied_weights_once(tiny_config):
    model = GPT(tiny_config)
    C, V, T, L = 32, 64, 16, 2
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    assert model.get_num_params(non_embedding=False) == V * C + T * C + L * per_block + 2 * C
    assert model.get_num_params() == V * C + L * per_block + 2 * C


def test_input_longer_than_block_size_is_a_clear_error(tiny_config):
    model = GPT(tiny_config)
    with pytest.raises(ValueError, match="longer than block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_invalid_shape_names_the_values():
    with pytest.raises(ValueError, match=r"n_embd \(100\) must be divisible by n_head \(6\)"):
        GPTConfig(n_embd=100, n_head=6)
    with pytest.raises(ValueError, match="attn_impl"):
        GPTConfig(attn_impl="flash")


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_crop_block_size_keeps_the_first_positions(tiny_config, pos_emb):
    """The same logits on the first 8 positions; RoPE's logits cannot tell which rows were kept (its scores
    depend only on relative positions), so the table itself must be its first rows."""
    model = random_model(replace(tiny_config, pos_emb=pos_emb))
    positions = lambda: model.transformer.wpe.weight if pos_emb == "learned" else model.rope  # noqa: E731
    first = positions()[:8].detach().clone()
    idx = torch.randint(0, 64, (1, 8))
    before, _ = model(idx)
    model.crop_block_size(8)
    after, _ = model(idx)
    torch.testing.assert_close(before, after)
    assert torch.equal(positions(), first) and model.config.block_size == 8 and tiny_config.block_size == 16


def test_weight_decay_only_on_matrices(tiny_config):
    model = GPT(tiny_config)
    opt = configure_optimizers(model, optimizer_settings(weight_decay=0.1, learning_rate=1e-3))
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_estimate_mfu_uses_the_given_peak(tiny_config):
    model = GPT(tiny_config)
    flops = model.flops_per_token() * tiny_config.block_size * 4
    assert model.estimate_mfu(4, 2.0, flops) == pytest.approx(0.5)


def test_forward_compiles_without_graph_breaks(tiny_config):
    """torch.compile(dynamic=True) as sample.py uses it: training, prefill and decode each trace as one graph."""
    from nanogpt.generate import KVCache
    model = GPT(tiny_config).eval()
    compiled = torch.compile(model, backend="eager", dynamic=True, fullgraph=True)  # a graph break raises
    idx = torch.randint(0, tiny_config.vocab_size, (2, 8))
    cache = KVCache(model.config, 2, "cpu", torch.float32)
    with torch.no_grad():
        full, _ = compiled(idx)
        compiled(idx[:, :5], kv_cache=cache, last_only=True)
        for t in range(5, 8):
            step, _ = compiled(idx[:, t:t + 1], kv_cache=cache)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-4, rtol=0)
