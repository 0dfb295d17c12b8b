"""Architecture options (RoPE, RMSNorm, activations, GQA/MQA, untied head) against independent math."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import reference
from model import GPT, MLP, CausalSelfAttention, GPTConfig, RMSNorm, apply_rope, rope_tables, value_embedded

OPTIONS = {
    "gpt2": {},
    "rope": dict(pos_emb="rope"),
    "rmsnorm": dict(norm="rmsnorm", bias=False),
    "gelu_tanh": dict(activation="gelu_tanh"),
    "relu": dict(activation="relu"),
    "relu2": dict(activation="relu2"),
    "swiglu": dict(activation="swiglu"),
    "gqa": dict(n_kv_head=2),
    "mqa": dict(n_kv_head=1, pos_emb="rope"),
    "untied": dict(tie_weights=False),
    "modern": dict(pos_emb="rope", norm="rmsnorm", activation="relu2", bias=False, tie_weights=False, n_kv_head=2),
    "qk_norm": dict(qk_norm=True, pos_emb="rope", n_kv_head=2),
    "softcap": dict(logit_softcap=2.0),
    # three tables over seven layers: a wrong table order, a mirrored repeat, an off-by-one or a middle layer
    # that reads a table each changes the logits (one table read by every layer could show none of them)
    "value_embeds": dict(value_embeds=3, n_layer=7, pos_emb="rope", n_kv_head=2),
}


def perturbed(config, seed=0):
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln" in name or name.endswith("ve_mix"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def spread(model, qk=4.0, fc=10.0):
    """GPT-2's init leaves attention near uniform and the MLP's inputs near 0, where a wrong score scale
    hardly moves the weights and GELU and its tanh form agree within float32's rounding: q and k scaled so
    that scores span units, c_fc so that the activations work outside their linear part."""
    with torch.no_grad():
        for block in model.transformer.h:
            attn = block.attn
            attn.c_attn.weight[:(attn.n_head + attn.n_kv_head) * attn.head_dim] *= qk
            block.mlp.c_fc.weight *= fc
    return model


@pytest.mark.parametrize("impl", ["sdpa", "manual"])
@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_matches_numpy_reference(tiny_config, option, impl):
    model = spread(perturbed(replace(tiny_config, attn_impl=impl, **OPTIONS[option])))
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, _ = model(idx)
    expected, _ = reference.forward(model.state_dict(), model.config, idx[0].numpy())
    # float32's rounding passes; GELU in place of its tanh form does not
    np.testing.assert_allclose(logits[0].double().numpy(), expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("option", OPTIONS)
def test_attention_paths_agree_for_each_option(tiny_config, option):
    a = spread(perturbed(replace(tiny_config, attn_impl="sdpa", **OPTIONS[option])))
    b = spread(perturbed(replace(tiny_config, attn_impl="manual", **OPTIONS[option])))
    idx = torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        torch.testing.assert_close(a(idx)[0], b(idx)[0], atol=1e-5, rtol=1e-5)


def test_worked_example_with_hand_set_weights():
    """vocab 256, n_embd 4, 2 heads, 2 layers, rope, rmsnorm (eps 1e-6), relu, mlp_hidden 8, no bias, untied."""
    cfg = GPTConfig(block_size=8, vocab_size=256, n_layer=2, n_head=2, n_embd=4, pos_emb="rope", norm="rmsnorm",
                    norm_eps=1e-6, activation="relu", mlp_hidden=8, bias=False, tie_weights=False)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            n = p.numel()  # a fixed pattern per tensor, set by hand rather than by an RNG
            values = torch.sin(torch.arange(n, dtype=torch.float64) * 0.7 + i) * (0.5 if p.dim() > 1 else 0.2) + (1.0 if p.dim() == 1 else 0.0)
            p.copy_(values.view_as(p))
    expected_names = {"transformer.wte.weight", "lm_head.weight", "transformer.ln_f.weight"} | {
        f"transformer.h.{l}.{m}" for l in range(2) for m in
        ("ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")}
    assert set(dict(model.named_parameters())) == expected_names
    assert model.transformer.h[0].attn.c_attn.weight.shape == (12, 4) and model.transformer.h[0].mlp.c_fc.weight.shape == (8, 4)
    captured = {}
    model.transformer.ln_f.register_forward_hook(lambda m, i, o: captured.update(final=o.detach()))
    ids = [ord(c) for c in "Cats sit"]
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    exp_logits, exp_final = reference.forward(model.state_dict(), cfg, ids)
    np.testing.assert_allclose(captured["final"][0].double().numpy(), exp_final, atol=1e-5)
    np.testing.assert_allclose(logits[0].double().numpy(), exp_logits, atol=1e-5)
    # one value worked by hand: RMSNorm of (1, 2, 3, 4) with unit weight is x / sqrt(7.5)
    norm = RMSNorm(4, 1e-6)
    np.testing.assert_allclose(norm(torch.tensor([1.0, 2.0, 3.0, 4.0])).detach().numpy(),
                               [0.3651484, 0.7302967, 1.0954451, 1.4605935], atol=1e-6)


def test_rope_rotates_channel_pairs_by_position():
    cfg = GPTConfig(block_size=6, n_embd=16, n_head=2, pos_emb="rope", rope_base=100.0)
    x = torch.randn(1, 2, 6, 8, dtype=torch.float32)
    out = apply_rope(x, rope_tables(cfg))
    for h in range(2):
        for t in range(6):
            np.testing.assert_allclose(out[0, h, t].numpy(), reference.rotate(x[0, h, t].double().numpy(), t, 100.0), atol=1e-5)
    torch.testing.assert_close(out[..., 0, :], x[..., 0, :])  # position 0 is not rotated


def test_rope_scores_depend_only_on_relative_position():
    cfg = GPTConfig(block_size=64, n_embd=32, n_head=2, pos_emb="rope")
    rope = rope_tables(cfg)
    q, k = torch.randn(16), torch.randn(16)
    rq, rk = apply_rope(q.expand(1, 1, 64, 16), rope)[0, 0], apply_rope(k.expand(1, 1, 64, 16), rope)[0, 0]
    for m, n, shift in [(5, 2, 7), (10, 10, 30), (3, 0, 50), (20, 9, 1)]:
        assert torch.dot(rq[m], rk[n]).item() == pytest.approx(torch.dot(rq[m + shift], rk[n + shift]).item(), abs=1e-4)
    assert abs(torch.dot(rq[5], rk[2]) - torch.dot(rq[6], rk[2])) > 1e-3  # but it does depend on the offset


def test_rope_leaves_v_unrotated(tiny_config):
    cfg = replace(tiny_config, pos_emb="rope", attn_impl="manual")
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).eval()
    x = torch.randn(1, 5, cfg.n_embd)
    x[:, :] = x[:, :1]  # the same input at every position
    with torch.no_grad():
        y = attn(x, rope=rope_tables(cfg)[:5])
    # equal inputs give equal v, so every row's weighted sum of v is that v, whatever the weights
    torch.testing.assert_close(y, y[:, :1].expand_as(y), atol=1e-5, rtol=0)


@pytest.mark.parametrize("n, n_layer", [(1, 2), (2, 4), (2, 5), (3, 7), (3, 12)])
def test_value_embedding_tables_repeat_in_order_in_the_first_and_last_layers(n, n_layer):
    """modded-nanogpt's 012...012: the reference's list, and only the layers that read a table own a ve_mix."""
    cfg = GPTConfig(block_size=8, vocab_size=16, n_layer=n_layer, n_head=2, n_embd=8, value_embeds=n)
    tables = [value_embedded(cfg, layer) for layer in range(n_layer)]
    assert tables == reference.value_tables(n, n_layer)
    assert [layer for layer, t in enumerate(tables) if t is not None] == [*range(n), *range(n_layer - n, n_layer)]
    model = GPT(cfg)
    assert [block.attn.ve_mix is not None for block in model.transformer.h] == [t is not None for t in tables]
    assert len(model.transformer.ve) == n
    assert reference.value_tables(3, 7) == [0, 1, 2, None, 0, 1, 2]  # the rule, worked by hand


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "relu2", "swiglu"])
def test_mlp_activations_match_numpy(activation):
    cfg = GPTConfig(n_embd=16, n_head=2, activation=activation, mlp_hidden=24)
    torch.manual_seed(0)
    mlp = MLP(cfg)
    x = torch.randn(3, 16)
    sd = {k: v.detach().double().numpy() for k, v in mlp.state_dict().items()}
    h = x.double().numpy() @ sd["c_fc.weight"].T + sd["c_fc.bias"]
    expected = reference.activation(h, activation) @ sd["c_proj.weight"].T + sd["c_proj.bias"]
    np.testing.assert_allclose(mlp(x).detach().double().numpy(), expected, atol=1e-5)
    assert mlp.c_fc.weight.shape[0] == (48 if activation == "swiglu" else 24)


def test_default_hidden_widths():
    assert GPTConfig(n_embd=128, n_head=4).mlp_width == 512
    assert GPTConfig(n_embd=128, n_head=4, activation="swiglu").mlp_width == 384  # 8/3*128 = 341.3 -> 384
    assert GPTConfig(n_embd=768, activation="swiglu").mlp_width == 2048


@pytest.mark.parametrize("impl", ["sdpa", "manual"])
@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_gqa_matches_numpy_and_shares_kv_heads(tiny_config, n_kv_head, impl):
    cfg = replace(tiny_config, n_kv_head=n_kv_head, attn_impl=impl)
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).eval()
    assert attn.c_attn.weight.shape == ((4 + 2 * n_kv_head) * 8, 32)
    x = torch.randn(1, 7, 32)
    sd = {"c_attn." + k: v for k, v in attn.c_attn.state_dict().items()}
    sd.update({"c_proj." + k: v for k, v in attn.c_proj.state_dict().items()})
    expected, _ = reference.attention(x[0].double().numpy(), {k: v.double().numpy() for k, v in sd.items()}, "", cfg)
    with torch.no_grad():
        np.testing.assert_allclose(attn(x)[0].double().numpy(), expected, atol=1e-5)


def test_untied_head_has_its_own_weight(tiny_config):
    model = GPT(replace(tiny_config, tie_weights=False))
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert "wpe" not in GPT(replace(tiny_config, pos_emb="rope")).transformer


def test_zero_initialized_projections_start_every_block_as_the_identity(tiny_config):
    torch.manual_seed(0)
    model = GPT(replace(tiny_config, zero_init_proj=True))
    projections = [p for name, p in model.named_parameters() if name.endswith("c_proj.weight")]
    assert len(projections) == 2 * tiny_config.n_layer and all(not p.any() for p in projections)
    assert model.transformer.h[0].attn.c_attn.weight.std() > 0.01  # the other matrices keep GPT-2's init
    idx = torch.randint(0, tiny_config.vocab_size, (2, 8))
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(8))  # Blocks add nothing (biases start at 0)
    torch.testing.assert_close(model(idx)[0], model.lm_head(model.transformer.ln_f(x)), atol=1e-6, rtol=0)


def test_logit_softcap_bounds_logits_and_keeps_their_order(tiny_config):
    model, idx = perturbed(replace(tiny_config, logit_softcap=0.05)), torch.randint(0, tiny_config.vocab_size, (2, 8))
    capped = model(idx)[0]
    model.config.logit_softcap = None
    plain = model(idx)[0]
    assert capped.abs().max() < 0.05 < plain.abs().max()
    torch.testing.assert_close(capped, 0.05 * torch.tanh(plain / 0.05))
    assert torch.equal(capped.argsort(-1), plain.argsort(-1))


def test_option_validation_messages():
    with pytest.raises(ValueError, match="logit_softcap must be > 0"):
        GPTConfig(logit_softcap=0.0)
    with pytest.raises(ValueError, match=r"n_head \(12\) must be a multiple of n_kv_head \(5\)"):
        GPTConfig(n_kv_head=5)
    with pytest.raises(ValueError, match="activation must be one of"):
        GPTConfig(activation="tanh")
    with pytest.raises(ValueError, match=r"value_embeds \(2\) must be in \[0, n_layer / 2\] \(n_layer = 3\)"):
        GPTConfig(n_layer=3, value_embeds=2)


@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_survives_a_checkpoint(tmp_path, tiny_config, option):
    """ckpt.pt with the option recorded in model_args loads back (sample.py's and resume's path) to the same
    logits; a weight of the wrong shape is refused in one line."""
    from configurator import UserError
    from nanogpt.checkpoint import load_checkpoint, model_args, model_from_checkpoint, save_checkpoint
    model = perturbed(replace(tiny_config, **{"n_layer": 4, **OPTIONS[option]}))
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": model_args(model.config)}, path)
    loaded = model_from_checkpoint(load_checkpoint(path), path).eval()
    idx = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx)[0], model(idx)[0], atol=0, rtol=0)
    state = model.state_dict()
    name = next(reversed(state))
    state[name] = torch.zeros(3, 3)
    save_checkpoint({"model": state, "model_args": model_args(model.config)}, path)
    with pytest.raises(UserError, match="weights do not match its model_args"):
        model_from_checkpoint(load_checkpoint(path), path)


@pytest.mark.parametrize("n_embd", [759_250_126, 2**63])  # hidden 4 x n_embd overflows a size; past int64
def test_model_args_too_large_for_any_tensor_are_one_line(tmp_path, n_embd):
    """Found by tests/test_fuzz.py: the meta-device model check_shapes builds raised torch's own error."""
    from configurator import UserError
    from nanogpt.checkpoint import load_checkpoint, model_args, model_from_checkpoint, save_checkpoint
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": {**model_args(model.config), "n_embd": n_embd}}, path)
    with pytest.raises(UserError, match=r"model_args describe a model no tensor can hold \((RuntimeError|TypeError)"):
        model_from_checkpoint(load_checkpoint(path), path)


def test_model_args_keep_nanogpt_keys_and_record_options():
    from nanogpt.checkpoint import config_from_model_args, model_args
    plain = model_args(GPTConfig(n_layer=2))
    assert set(plain) == {"n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout"}
    modern = model_args(GPTConfig(pos_emb="rope", norm="rmsnorm", n_kv_head=4, tie_weights=False))
    assert modern["pos_emb"] == "rope" and modern["n_kv_head"] == 4 and modern["tie_weights"] is False
    assert config_from_model_args(modern, "ckpt", {}) == GPTConfig(pos_emb="rope", norm="rmsnorm", n_kv_head=4, tie_weights=False)
