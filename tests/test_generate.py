"""Generation: greedy, temperature, top-k ties, top-p, the KV cache against the uncached path, stops, seeds."""
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import nanogpt.cpu
from model import GPT
from nanogpt import generate as generate_module
from nanogpt.cpu import kernels
from nanogpt.cpu.kernels import onednn_available, packed_inference
from nanogpt.generate import filter_logits, generate, sample_next, stream
from test_model_options import OPTIONS, perturbed


def greedy_by_hand(model, idx, n):
    """Serial greedy decoding with full forwards: argmax of the last position, appended, repeated."""
    seq = idx
    for _ in range(n):
        logits, _ = model(seq[:, -model.config.block_size:])
        seq = torch.cat((seq, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return seq


def test_temperature_zero_is_greedy(tiny_config):
    model = perturbed(tiny_config)
    idx = torch.randint(0, 64, (2, 3))
    out = generate(model, idx, 10, temperature=0.0)
    torch.testing.assert_close(out, greedy_by_hand(model, idx, 10))


def test_temperature_keeps_order_and_sharpens():
    """The probabilities sample_next draws from are softmax(logits / T) worked in numpy: the logits' order at
    every T, and a colder T gives a sharper distribution (lower entropy, a higher top)."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    seen = []
    for t in (0.3, 1.0, 2.5):
        report = {}
        sample_next(logits, t, generator=torch.Generator().manual_seed(0), report=report)
        probs = report["probs"][0].double().numpy()
        z = logits[0].double().numpy() / t
        expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)
        assert (np.argsort(probs) == np.argsort(logits[0].numpy())).all()
        seen.append((-(probs * np.log(probs)).sum(), probs.max()))
    entropies, tops = zip(*seen)
    assert list(entropies) == sorted(entropies) and list(tops) == sorted(tops, reverse=True)


# logits 0, ln 2, ln 4: at temperature T the probabilities are proportional to (1, 2, 4) ** (1 / T)
POWERS_OF_TWO = [0.0, math.log(2), math.log(4)]
TEMPERED = {1.0: (1, 2, 4), 2.0: (1, math.sqrt(2), 2), 0.5: (1, 4, 16)}  # worked by hand


def first_past(weights, draws):
    """Inverse CDF in plain Python: for each draw, the first token whose cumulative probability exceeds it."""
    cdf = list(itertools.accumulate(w / sum(weights) for w in weights))
    assert min(abs(u - c) for u in draws for c in cdf) > 1e-4  # no draw so near a boundary that rounding decides
    return [next(i for i, c in enumerate(cdf) if u < c) for u in draws]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_temperature_divides_the_logits_as_worked_by_hand(temperature):
    """sample_next's picks equal the hand-worked inverse CDF at the draws it makes (reproduced by seed)."""
    rows = 64
    logits = torch.tensor([POWERS_OF_TWO]).expand(rows, 3)
    draws = torch.rand(rows, 1, generator=torch.Generator().manual_seed(0))[:, 0].tolist()
    expected = first_past(TEMPERED[temperature], draws)
    got = sample_next(logits, temperature, generator=torch.Generator().manual_seed(0))
    assert got.tolist() == expected
    # one generator per row: each row's pick follows its own generator's first draw
    seeds = range(100, 100 + rows)
    row_draws = [torch.rand(1, 1, generator=torch.Generator().manual_seed(s)).item() for s in seeds]
    row_expected = first_past(TEMPERED[temperature], row_draws)
    got = sample_next(logits, temperature, generator=[torch.Generator().manual_seed(s) for s in seeds])
    assert got.tolist() == row_expected
    if temperature != 1.0:  # these draws tell dividing by the temperature from multiplying by it
        assert expected != first_past(TEMPERED[1 / temperature], draws)
        assert row_expected != first_past(TEMPERED[1 / temperature], row_draws)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_sampled_frequencies_match_the_hand_worked_probabilities(temperature):
    rows = 20000
    logits = torch.tensor([POWERS_OF_TWO]).expand(rows, 3)
    picks = sample_next(logits, temperature, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(picks, minlength=3).double() / rows
    weights = TEMPERED[temperature]
    for f, w in zip(freq.tolist(), weights):
        p = w / sum(weights)
        assert abs(f - p) < 4 * math.sqrt(p * (1 - p) / rows), (freq.tolist(), temperature)


def test_sampling_keeps_the_order_of_probabilities_and_hotter_is_flatter():
    logits = torch.tensor([[1.0, -0.5, 0.25, 1.5]])
    rows, freqs = 20000, []
    for t in (0.5, 1.0, 2.0, 5.0):
        picks = sample_next(logits.expand(rows, 4), t, generator=torch.Generator().manual_seed(2))
        counts = torch.bincount(picks, minlength=4)
        assert counts.argsort().tolist() == [1, 2, 0, 3], (t, counts.tolist())  # the logits' order
        freqs.append(counts / rows)
    tops, bottoms = [f.max().item() for f in freqs], [f.min().item() for f in freqs]
    assert tops == sorted(tops, reverse=True) and bottoms == sorted(bottoms)  # hotter: top falls, bottom rises
    assert tops[0] > 0.6 and tops[-1] < 0.35


@pytest.mark.parametrize("temperature", [1e-6, 1e-30, 1e-40])
def test_a_tiny_temperature_is_greedy(temperature):
    g = torch.Generator().manual_seed(3)
    logits = torch.cat([torch.tensor([POWERS_OF_TWO + [-1.0] * 7, [-50.0] * 9 + [-49.0], [0.0] * 9 + [1e-3]]),
                        3 * torch.randn(200, 10, generator=g)])
    got = sample_next(logits, temperature, generator=torch.Generator().manual_seed(4))
    assert got.tolist() == logits.argmax(-1).tolist()


def test_top_k_keeps_ties_at_the_threshold():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    kept = filter_logits(logits, top_k=2)
    assert torch.isfinite(kept).tolist() == [[False, True, True, False, True]]
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, 1.0, top_k=1, generator=g).item() for _ in range(200)}
    assert draws == {1, 2, 4}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    assert torch.isfinite(filter_logits(logits, top_p=0.8)).tolist() == [[False, True, False, True]]
    assert torch.isfinite(filter_logits(logits, top_p=0.81)).tolist() == [[False, True, True, True]]
    assert torch.isfinite(filter_logits(logits, top_p=0.01)).tolist() == [[False, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=1.0)).all()



@pytest.mark.parametrize("top_p, kept", [(0.5, {1}), (0.75, {1, 3}), (0.75 + 2 ** -10, {0, 1, 3}), (0.875, {0, 1, 3})])
def test_top_p_keeps_a_set_whose_mass_is_exactly_p_and_nothing_more(top_p, kept):
    """README's rule, "the smallest set whose probability reaches p", on powers of two, exact in float32: the
    sorted masses are 0.5, 0.25, 0.125, 1/16, 1/16, so p = 0.75 is reached exactly by {0.5, 0.25} and the
    next token (mass 0.75 ranked above it) is left out; a p just above 0.75 needs the 0.125 too."""
    probs = torch.tensor([[0.125, 0.5, 0.0625, 0.25, 0.0625]])
    logits = probs.log()
    assert torch.equal(torch.softmax(logits, -1), probs)  # the boundary is exact, not rounded to either side
    assert probs[0, [1, 3]].sum().item() == 0.75
    assert set(torch.isfinite(filter_logits(logits, top_p=top_p))[0].nonzero()[:, 0].tolist()) == kept
    g = torch.Generator().manual_seed(0)
    assert {sample_next(logits, 1.0, top_p=top_p, generator=g).item() for _ in range(200)} == kept

def nucleus_numpy(logits, top_p):
    """The tokens top-p keeps, in float64 numpy: the most likely ones until their mass reaches top_p, at least one."""
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]  # mass ranked above each token
    assert np.abs(before[1:] - top_p).min() > 1e-5  # no boundary so near top_p that float32 rounding decides
    return set(order[before < top_p].tolist()) | {order[0].item()}


@pytest.mark.parametrize("top_p", [1e-300, 1e-45, 1e-8, 0.05, 0.3, 0.7, 0.95, 0.999])
def test_top_p_keeps_the_nucleus_computed_in_numpy_and_always_the_most_likely_token(top_p):
    """A top_p that rounds to 0 in float32 (1e-300, 1e-45) still keeps the most likely token, not none."""
    logits = 2 * torch.randn(16, 50, generator=torch.Generator().manual_seed(5))
    kept = torch.isfinite(filter_logits(logits, top_p=top_p))
    for row, k in zip(logits, kept):
        assert set(k.nonzero()[:, 0].tolist()) == nucleus_numpy(row.double().numpy(), top_p)
    picks = sample_next(logits, 1.0, top_p=top_p, generator=torch.Generator().manual_seed(6))
    assert kept[torch.arange(16), picks].all()
    if top_p < 1e-8:  # the nucleus is the most likely token alone: sampling is greedy
        assert picks.tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("bad, match", [(dict(temperature=-1.0), "temperature"), (dict(top_k=0), "top_k"),
                                        (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p")])
def test_bad_sampling_arguments_are_errors(tiny_config, bad, match):
    model = GPT(tiny_config)
    with pytest.raises(ValueError, match=match):
        generate(model, torch.zeros(1, 1, dtype=torch.long), 3, **bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, torch.zeros(1, 1, dtype=torch.long), -1)


def sharp(config, scale=40.0, logit_scale=30.0):
    """perturbed(config) in float64, q and k scaled up so that scores span several units and attention is far
    from uniform, and ln_f scaled up so that logits do too: a key or query at the wrong position (a RoPE or
    position-embedding offset) then changes the logits, the greedy tokens and the sampled ones."""
    model = perturbed(config)
    with torch.no_grad():
        for block in model.transformer.h:
            attn = block.attn
            attn.c_attn.weight[:(attn.n_head + attn.n_kv_head) * attn.head_dim] *= scale  # the q and k rows
        for p in model.transformer.ln_f.parameters():
            p *= logit_scale
    return model.double()


def attention_weights(model, idx):
    """Every layer's attention weights (B, nh, T, T) for a full forward of idx, through the manual path."""
    weights = []
    attns = [block.attn for block in model.transformer.h]
    impls = [attn.impl for attn in attns]
    hooks = [attn.hook_weights.register_forward_hook(lambda m, args, out: weights.append(out)) for attn in attns]
    for attn in attns:
        attn.impl = "manual"
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for attn, impl, hook in zip(attns, impls, hooks):
            attn.impl = impl
            hook.remove()
    assert len(weights) == len(attns)
    return weights


def assert_attention_is_sharp(model, idx):
    if model.config.qk_norm:  # unit-RMS q and k bound each score by sqrt(head_dim): sharpness cannot be forced
        return
    for w in attention_weights(model, idx):
        top = w[..., 3:, :].max(dim=-1).values.mean().item()  # rows that see 4 keys or more: uniform <= 1/4
        assert top > 0.5, top


@pytest.mark.parametrize("impl", ["sdpa", "manual"])
@pytest.mark.parametrize("option", OPTIONS)
def test_cached_logits_match_full_forward(tiny_config, option, impl):
    """Prefill 5 positions, then one at a time: each step's logits equal a full forward's last row."""
    from nanogpt.generate import KVCache
    model = sharp(replace(tiny_config, attn_impl=impl, **OPTIONS[option]))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert_attention_is_sharp(model, idx)
    cache = KVCache(model.config, 2, "cpu", torch.float64)
    with torch.no_grad():
        full, _ = model(idx)
        first, _ = model(idx[:, :5], kv_cache=cache)
        torch.testing.assert_close(first, full[:, :5], atol=1e-6, rtol=0)
        for t in range(5, 16):
            step, _ = model(idx[:, t:t + 1], kv_cache=cache)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-6, rtol=0)
        with pytest.raises(ValueError, match="block_size"):
            model(idx[:, :1], kv_cache=cache)


@pytest.mark.parametrize("option", OPTIONS)
def test_cached_generation_gives_the_same_tokens(tiny_config, option):
    model = sharp(replace(tiny_config, **OPTIONS[option]))
    idx = torch.randint(0, 64, (3, 4), generator=torch.Generator().manual_seed(1))
    n = tiny_config.block_size - 4  # up to the window's end
    greedy_cached = generate(model, idx, n, temperature=0)
    assert_attention_is_sharp(model, greedy_cached)
    torch.testing.assert_close(greedy_cached, generate(model, idx, n, temperature=0, use_cache=False))
    torch.testing.assert_close(greedy_cached, greedy_by_hand(model, idx, n))
    sampled = [generate(model, idx, n, temperature=1.5, generator=torch.Generator().manual_seed(7), use_cache=c)
               for c in (True, False)]
    torch.testing.assert_close(sampled[0], sampled[1])


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_beyond_block_size_the_cache_keeps_the_last_half(tiny_config, pos_emb):
    """Documented policy: when the window is full, recompute its last half and continue from there."""
    model = perturbed(replace(tiny_config, pos_emb=pos_emb))
    block, keep = tiny_config.block_size, tiny_config.block_size // 2
    idx = torch.randint(0, 64, (1, 5))
    out = generate(model, idx, 40, temperature=0)
    seq, start = idx, 0
    for _ in range(40):
        if seq.size(1) - start > block:
            start = seq.size(1) - keep
        logits, _ = model(seq[:, start:])
        seq = torch.cat((seq, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    torch.testing.assert_close(out, seq)
    uncached = generate(model, idx, 40, temperature=0, use_cache=False)
    torch.testing.assert_close(uncached, greedy_by_hand(model, idx, 40))  # sliding window of block_size



@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_a_context_shift_keeps_exactly_the_last_half_of_a_text_of_distinct_tokens(tiny_config, pos_emb, monkeypatch):
    """45 tokens, no two alike (5 of the prompt, then 40 chosen by a script in place of the sampler), past
    block_size 16: each step's logits are those of a full forward of the window the rule keeps (tokens
    start .. n - 1, start moving to n - 8 when the window would hold 17), computed without the cache."""
    model = sharp(replace(tiny_config, pos_emb=pos_emb))  # a token more or less in the window moves the logits
    block, keep = tiny_config.block_size, tiny_config.block_size // 2
    text = torch.randperm(tiny_config.vocab_size, generator=torch.Generator().manual_seed(4))[:45][None]  # (1, 45)
    script = iter(text[0, 5:].tolist())
    monkeypatch.setattr(generate_module, "sample_next", lambda *a, **k: torch.tensor([next(script)]))
    seen = []
    out = generate(model, text[:, :5], 40, temperature=1.0, on_step=lambda r: seen.append(r["logits"].clone()))
    assert torch.equal(out, text)
    start, shifts, apart = 0, 0, []
    with torch.no_grad():
        for n, logits in zip(range(5, 45), seen):
            if n - start > block:
                start, shifts = n - keep, shifts + 1
            want = model(text[:, start:n])[0][:, -1]
            torch.testing.assert_close(logits, want, atol=1e-6, rtol=0, msg=lambda m: f"token {n}, window {start}..{n - 1}: {m}")
            apart.append((model(text[:, start + 1:n])[0][:, -1] - want).abs().max().item())
    assert shifts == 4  # at tokens 17, 25, 33, 41
    assert max(apart) > 100 * 1e-6  # one token less in the window: the data tells the two apart

def test_batched_rows_decode_as_if_alone(tiny_config):
    model = perturbed(tiny_config)
    idx = torch.randint(0, 64, (4, 3))
    batch = generate(model, idx, 8, temperature=0)
    for b in range(4):
        torch.testing.assert_close(batch[b:b + 1], generate(model, idx[b:b + 1], 8, temperature=0))


def test_seeded_generator_ignores_global_rng(tiny_config):
    model = perturbed(tiny_config)
    idx = torch.zeros(2, 1, dtype=torch.long)
    torch.manual_seed(1)
    a = generate(model, idx, 12, generator=torch.Generator().manual_seed(42))
    torch.manual_seed(2)
    b = generate(model, idx, 12, generator=torch.Generator().manual_seed(42))
    c = generate(model, idx, 12, generator=torch.Generator().manual_seed(43))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_stop_sequence_ends_a_sample_and_is_not_included(tiny_config):
    model = perturbed(tiny_config)
    idx = torch.randint(0, 64, (1, 2))
    free = generate(model, idx, 12, temperature=0)[0, 2:].tolist()
    stop = free[4:6]
    first = next(i for i in range(len(free) - 1) if free[i:i + 2] == stop)
    out = generate(model, idx, 12, temperature=0, stop=[stop])
    assert out[0, 2:].tolist() == free[:first]
    two = generate(model, torch.cat([idx, idx.flip(1)]), 12, temperature=0, stop=[stop])
    row = two[0, 2:].tolist()
    assert row[:first] == free[:first] and set(row[first:]) <= {-1}


def test_generate_restores_training_mode(tiny_config):
    model = GPT(replace(tiny_config, dropout=0.5))
    model.train()
    a = generate(model, torch.zeros(1, 1, dtype=torch.long), 5, temperature=0)
    b = generate(model, torch.zeros(1, 1, dtype=torch.long), 5, temperature=0)
    assert torch.equal(a, b) and model.training
    frozen = model.transformer.h[0]
    frozen.eval()  # a part held in eval mode while the rest trains: each module gets its own mode back
    generate(model, torch.zeros(1, 1, dtype=torch.long), 5, temperature=0)
    assert not any(m.training for m in frozen.modules())
    assert all(m.training for m in model.modules() if m not in set(frozen.modules()))


def test_pick_is_inverse_cdf_and_never_picks_a_zero_probability_token():
    from nanogpt.generate import pick
    probs = torch.tensor([[0.1, 0.6, 0.0, 0.3]]).expand(6, 4)
    draws = torch.tensor([[0.0], [0.05], [0.1], [0.69], [0.71], [0.999]])  # cdf: 0.1, 0.7, 0.7, 1.0
    assert pick(probs, draws).tolist() == [0, 0, 1, 1, 3, 3]
    counts = torch.bincount(pick(probs[:1].expand(10000, 4), torch.rand(10000, 1, generator=torch.Generator().manual_seed(0))), minlength=4)
    assert counts[2] == 0 and abs(counts[1].item() / 10000 - 0.6) < 0.02


needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")


@pytest.fixture
def plain_linear_calls(monkeypatch):
    """A list that grows by one at each F.linear call: each linear layer that ran on its plain weights."""
    calls = []
    plain = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(1) or plain(*a))
    return calls


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 8, 100])
def test_packed_linear_computes_the_float32_product(plain_linear_calls, rows, bias):
    """The packed weights give x W^T + b (float64 reference) in inference mode, packed again once W changed (in
    place, or given new data); autograd runs on the plain weights."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(2, rows, 48)
    def reference():
        y = x.double() @ lin.weight.double().T
        return y + lin.bias.double() if bias else y
    with packed_inference([lin], rows) as packed:
        assert list(packed) == [lin]
        with torch.inference_mode():
            y = lin(x)
        assert y.dtype == torch.float32 and y.shape == (2, rows, 80)
        torch.testing.assert_close(y.double(), reference(), atol=1e-5, rtol=0)
        with torch.no_grad():
            lin.weight.mul_(-2)  # an optimizer step: the packed copy is stale and must not be used
        with torch.inference_mode():
            torch.testing.assert_close(lin(x).double(), reference(), atol=1e-5, rtol=0)
        lin.weight.data = lin.weight.data * 2  # as Module.to assigns: same parameter, same version counter
        with torch.inference_mode():
            torch.testing.assert_close(lin(x).double(), reference(), atol=1e-5, rtol=0)
        assert not plain_linear_calls
        lin(x).sum().backward()  # training: autograd through the plain weights
        assert len(plain_linear_calls) == 1 and lin.weight.grad is not None
    assert "forward" not in lin.__dict__  # back to nn.Linear's own forward


@needs_onednn
@pytest.mark.parametrize("option", ["gpt2", "modern", "gqa"])
def test_generation_on_packed_weights_matches_plain_weights(monkeypatch, plain_linear_calls, tiny_config, option):
    model = perturbed(replace(tiny_config, **OPTIONS[option]))
    idx = torch.randint(0, 64, (3, 4))
    packed = generate(model, idx, 12, temperature=0)  # 16 positions: the whole window, no shift
    assert not plain_linear_calls  # every linear layer ran on its packed weights
    assert not any("forward" in m.__dict__ for m in model.modules())  # the copies are freed
    monkeypatch.setattr(kernels, "onednn_available", lambda: False)
    torch.testing.assert_close(packed, generate(model, idx, 12, temperature=0))
    torch.testing.assert_close(packed, greedy_by_hand(model, idx, 12))


@needs_onednn
def test_models_beyond_the_copy_limit_decode_on_their_plain_weights(monkeypatch, tiny_config):
    """No second copy of weights past PACKED_COPY_LIMIT: the fused step runs on the layers' own weights (the plain
    kernel), whatever kernel was measured faster."""
    from nanogpt.cpu.fused_step import Product
    model = perturbed(tiny_config)
    idx = torch.randint(0, 64, (2, 3))
    packed = generate(model, idx, 10, temperature=0)
    kinds, real = [], Product.__init__
    monkeypatch.setattr(Product, "__init__", lambda self, *a: real(self, *a) or kinds.append(self.kind))
    monkeypatch.setattr(nanogpt.cpu, "PACKED_COPY_LIMIT", 1000)  # bytes: less than this model's weights
    monkeypatch.setattr(nanogpt.cpu.kernels, "pack", None)  # nothing may be packed
    torch.testing.assert_close(generate(model, idx, 10, temperature=0), packed)
    assert set(kinds) == {"plain"} and len(kinds) == 9  # 4 linear layers x 2 blocks + the head


def test_streaming_allocates_nothing_that_grows_with_max_new_tokens(tiny_config):
    model = perturbed(tiny_config)
    steps = stream(model, torch.zeros(2, 3, dtype=torch.long), max_new_tokens=10 ** 12, temperature=0)
    first = [next(steps).tolist() for _ in range(40)]  # past block_size: the window shifts
    expected = generate(model, torch.zeros(2, 3, dtype=torch.long), 40, temperature=0)[:, 3:].t().tolist()
    assert first == expected


def test_the_fast_paths_write_what_model_pys_plain_loop_writes(tiny_config):
    """model.generate is nanoGPT's loop, the reference: the cached path (packed weights and the fused step on
    CPU) matches it while the text fits in block_size, the uncached one beyond it too (both slide the window)."""
    model = perturbed(tiny_config)
    idx = torch.randint(0, tiny_config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(3))
    plain = model.generate(idx, 12, temperature=0)  # 16 tokens: block_size
    assert torch.equal(generate(model, idx, 12, temperature=0), plain)
    longer = model.generate(idx, 30, temperature=0)
    assert torch.equal(generate(model, idx, 30, temperature=0, use_cache=False), longer)
    assert torch.equal(model.generate(idx, 12, temperature=1.0, top_k=1), plain)  # top_k=1 keeps the argmax only
