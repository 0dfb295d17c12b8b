"""fused_step.FusedStep: GPT.forward's math for one cached position, against the model's uncached forward."""
import contextlib
import dataclasses
from dataclasses import replace

import pytest
import torch

from model import GPT, GPTConfig
from nanogpt import cpu
from nanogpt.cpu import fused_step, native
from nanogpt.cpu.fused_step import SUPPORTED, FusedStep
from nanogpt.cpu.kernels import onednn_available, packed_inference
from nanogpt.generate import KVCache, generate, stream
from test_generate import assert_attention_is_sharp, greedy_by_hand, sharp
from test_model_options import OPTIONS

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")
NATIVE = pytest.mark.skipif(not native.available(), reason=f"no native products here: {native.why()}")


def packed_weights(model, rows):
    """The packed copies of model's linear layers that cpu.decoding makes for `rows` rows: {linear: packed}."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return packed_inference(linears, max(rows, cpu.PACK_MIN_ROWS))


def sharp32(config):
    """test_generate.sharp in float32: attention far from uniform, logits spread, biases and gains random."""
    return sharp(config).float()


def record_runs(monkeypatch):
    """FusedStep.run's calls where decode.c ran, as (steps asked, steps it chose, 1 where it handed a step's choice
    back to sample_next else 0)."""
    runs, real = [], FusedStep.run

    def run(self, tokens, cache, n, *args):
        result = real(self, tokens, cache, n, *args)
        if result is not None:
            runs.append((n, result[0].size(0), int(result[1] is not None)))
        return result
    monkeypatch.setattr(FusedStep, "run", run)
    return runs


@pytest.mark.parametrize("kernel", ["packed", "plain", pytest.param("native", marks=NATIVE)])
@pytest.mark.parametrize("option", list(OPTIONS) + ["no_bias", "softcap_rope_swiglu"])
def test_fused_steps_match_the_full_forward_for_every_option(tiny_config, option, kernel):
    """Prefill 5 positions with the model, then one fused step per position: each step's logits equal the
    last row of a full (uncached) forward over the sequence so far, and the cache holds the model's keys. Both
    float32 kernels: packed copies (bias, activation and residual inside oneDNN's product), the plain
    weights (PyTorch's matmul, then the rest) and decode.c's products on them (bias, activation and residual
    inside)."""
    extra = {"no_bias": dict(bias=False), "softcap_rope_swiglu": dict(logit_softcap=3.0, pos_emb="rope",
                                                                      activation="swiglu")}
    model = sharp32(replace(tiny_config, **OPTIONS.get(option, extra.get(option, {}))))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert_attention_is_sharp(model, idx)
    fused_cache, model_cache = (KVCache(model.config, 2, "cpu", torch.float32) for _ in range(2))
    copied = kernel == "packed"
    with torch.inference_mode(), (packed_weights(model, 2) if copied else contextlib.nullcontext({})) as packed:
        step = FusedStep.build(model, packed, kernel=kernel)
        assert step is not None and step.valid()
        assert {p.kind for b in step.blocks for p in b[1:6] if isinstance(p, fused_step.Product)} == {kernel}
        # decode.c's whole blocks on native products, but where a block has what they leave to Python
        assert (step.layers is not None) == (kernel == "native" and option not in ("swiglu", "softcap_rope_swiglu",
                                                                                   "value_embeds"))
        full, _ = model(idx)
        model(idx[:, :5], kv_cache=fused_cache)
        model(idx[:, :5], kv_cache=model_cache)
        for t in range(5, 16):
            logits = step(idx[:, t], fused_cache)
            assert logits.shape == (2, 1, 64) and fused_cache.pos == t + 1
            torch.testing.assert_close(logits[:, 0], full[:, t], atol=2e-5, rtol=1e-5)
            model(idx[:, t:t + 1], kv_cache=model_cache)
        torch.testing.assert_close(fused_cache.k, model_cache.k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_cache.v, model_cache.v, atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="block_size"):
            step(idx[:, 0], fused_cache)


def test_generation_runs_on_the_fused_step_and_gives_the_greedy_tokens(monkeypatch, tiny_config):
    model = sharp32(replace(tiny_config, **OPTIONS["modern"]))
    calls = []
    real = FusedStep.__call__
    monkeypatch.setattr(FusedStep, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    idx = torch.randint(0, 64, (3, 4), generator=torch.Generator().manual_seed(2))
    out = generate(model, idx, 12, temperature=0)
    assert len(calls) == 11  # every step after the prefill
    torch.testing.assert_close(out, greedy_by_hand(model, idx, 12))


@NATIVE
@pytest.mark.parametrize("option", [  # sharp models whose greedy text does not repeat one token (tied ones do)
    OPTIONS["modern"], dict(OPTIONS["modern"], pos_emb="learned"), dict(OPTIONS["modern"], **OPTIONS["qk_norm"]),
    dict(OPTIONS["modern"], logit_softcap=0.5)])  # logits to +-12 capped to 0.5: six tie at the top on average
def test_greedy_runs_in_one_call_give_the_tokens_of_one_step_at_a_time(monkeypatch, tiny_config, option):
    """generate() lets decode.c run greedy steps ahead (GREEDY_RUN in one call, each step's argmax fed to the
    next): the tokens are those of one fused step at a time with sample_next's argmax (stream's run_ahead=1),
    through three context shifts (block 16, 40 new tokens), and the uncached model's up to the first shift."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(replace(tiny_config, **option))
    idx = torch.randint(0, 64, (3, 4), generator=torch.Generator().manual_seed(2))
    steps, real_step = [], FusedStep.__call__
    monkeypatch.setattr(FusedStep, "__call__", lambda self, *a: steps.append(1) or real_step(self, *a))
    recorded = record_runs(monkeypatch)
    out = generate(model, idx, 40, temperature=0)
    runs = [asked for asked, _, _ in recorded]
    made = [chosen + handed for _, chosen, handed in recorded]  # the tokens each run gave
    # every token from runs but the prefill's and three shifts' (at tokens 17, 26 and 35: half the window kept)
    assert not steps and sum(made) == 36
    if option.get("logit_softcap") is None:  # each to the window's end: positions 4 .. 15 for tokens 5 .. 16 first
        assert runs == made == [12, 8, 8, 8]
    else:  # a near tie under the cap (here exact ties at the cap) ends a run with torch's choice
        assert len(runs) > 4 and min(made) >= 1
    assert all(len(set(row)) >= 4 for row in out[:, 4:].tolist())  # a token fed twice or a position kept would show
    one_at_a_time = torch.cat([idx] + [t[:, None] for t in stream(model, idx, 40, temperature=0)], dim=1)
    assert len(steps) == 36 and len(recorded) == len(made)  # no run where run_ahead is 1
    assert torch.equal(out, one_at_a_time)
    torch.testing.assert_close(out[:, :17], greedy_by_hand(model, idx, 13))


@NATIVE
def test_a_greedy_run_gives_a_tie_to_the_first_token(monkeypatch, tiny_config):
    """Every token tied with the next (rows 2i and 2i + 1 of the output layer equal, so are their logits):
    decode.c's argmax takes the even one each step, as torch.argmax does one step at a time."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(replace(tiny_config, bias=False))
    with torch.no_grad():
        model.lm_head.weight[1::2] = model.lm_head.weight[0::2]
    runs = record_runs(monkeypatch)
    idx = torch.tensor([[1, 2], [7, 30]])
    out = generate(model, idx, 12, temperature=0)
    one_at_a_time = torch.cat([idx] + [t[:, None] for t in stream(model, idx, 12, temperature=0)], dim=1)
    assert [asked for asked, _, _ in runs] == [11] and torch.equal(out, one_at_a_time)
    assert (out[:, 2:] % 2 == 0).all() and len(set(out[:, 2:].flatten().tolist())) > 2


@NATIVE
def test_sampled_decoding_looks_at_the_fused_step_once_a_run(monkeypatch, tiny_config):
    """generate() at temperature 0.8 with top-k takes one step a call, and looks at whether the fused step still
    applies (valid()) once in GREEDY_RUN steps, as nothing it runs changes the model: the same seeded tokens as a
    stream that looks every step."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(replace(tiny_config, **OPTIONS["modern"]))
    looks, real = [], FusedStep.valid
    monkeypatch.setattr(FusedStep, "valid", lambda self: looks.append(1) or real(self))
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(4))
    args = dict(temperature=0.8, top_k=10)  # top-k: one step a call (no sampled runs)
    out = generate(model, idx, 12, generator=torch.Generator().manual_seed(5), **args)
    assert len(looks) == 2  # the build's, then the first step's: 11 steps in one run of 16
    every = torch.cat([idx] + [t[:, None] for t in stream(model, idx, 12, generator=torch.Generator().manual_seed(5),
                                                          **args)], dim=1)
    assert len(looks) == 2 + 1 + 11 and torch.equal(out, every)


def seeded(kind, seed, rows):
    """sample_next's generator argument: one generator, one a row, or None (PyTorch's default, seeded here)."""
    if kind == "none":
        torch.manual_seed(seed)
        return None
    if kind == "each":
        return [torch.Generator().manual_seed(seed + i) for i in range(rows)]
    return torch.Generator().manual_seed(seed)


@NATIVE
@pytest.mark.parametrize("kind", ["one", "each", "none"])
@pytest.mark.parametrize("option", [OPTIONS["modern"], dict(OPTIONS["modern"], pos_emb="learned"),
                                    dict(OPTIONS["modern"], logit_softcap=2.0)])
def test_sampled_runs_give_the_seeded_tokens_of_one_step_at_a_time(monkeypatch, tiny_config, option, kind):
    """generate() at a temperature lets decode.c sample runs of steps on the draws sample_next would take
    (native.model_run): the same seeded tokens as one step at a time, through three context shifts, and the
    generators left where one step at a time leaves them."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(replace(tiny_config, **option))
    idx = torch.randint(0, 64, (3, 4), generator=torch.Generator().manual_seed(2))
    made = record_runs(monkeypatch)
    gen = seeded(kind, 7, 3)
    out = generate(model, idx, 40, temperature=0.8, generator=gen)
    after = [torch.rand(1, generator=g) for g in (gen if kind == "each" else [gen])] if gen is not None else [torch.rand(1)]
    assert len(made) >= 4 and sum(chosen for _, chosen, _ in made) > 30  # runs, a few ended at an edge at most
    gen = seeded(kind, 7, 3)
    one = torch.cat([idx] + [t[:, None] for t in stream(model, idx, 40, temperature=0.8, generator=gen)], dim=1)
    again = [torch.rand(1, generator=g) for g in (gen if kind == "each" else [gen])] if gen is not None else [torch.rand(1)]
    assert torch.equal(out, one) and all(map(torch.equal, after, again))
    assert len(set(out[:, 4:].flatten().tolist())) > 10


@NATIVE
def test_a_draw_near_a_tokens_edge_is_left_to_torch(monkeypatch, tiny_config):
    """With the edge's margin at 0.3 of the total most draws lie near one: each such step ends its run and is
    sample_next's, on its own draw (the generator wound back to it); the tokens and the generator's next draw
    are one step at a time's."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    monkeypatch.setattr(native, "SAMPLE_TOLERANCE", 0.3)
    model = sharp32(replace(tiny_config, **OPTIONS["modern"]))
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(3))
    made = record_runs(monkeypatch)
    gen = torch.Generator().manual_seed(11)
    out = generate(model, idx, 30, temperature=1.0, generator=gen)
    assert sum(handed for _, _, handed in made) > 10
    one_gen = torch.Generator().manual_seed(11)
    one = torch.cat([idx] + [t[:, None] for t in stream(model, idx, 30, temperature=1.0, generator=one_gen)], dim=1)
    assert torch.equal(out, one) and torch.equal(torch.rand(3, generator=gen), torch.rand(3, generator=one_gen))


def two_logits_an_ulp_apart(tiny_config):
    """A model whose logits are lm_head.weight[:, 0] at every position (ln_f's weight 0, its bias e_0): 0 and 1
    are 30.0000286 and the next float, the rest 0, capped at 15: tanhf and torch.tanh round them apart (they did
    on the machine this was written on), and a temperature scales that difference up."""
    model = GPT(replace(tiny_config, tie_weights=False, logit_softcap=15.0)).eval()
    x0 = 30.000028610229492
    x1 = float(torch.nextafter(torch.tensor(x0), torch.tensor(31.0)))
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[0, 0], model.lm_head.weight[1, 0] = x0, x1
    return model


def one_step_at_a_time(model, idx, n, **kwargs):
    return torch.cat([idx] + [t[:, None] for t in stream(model, idx, n, **kwargs)], dim=1)


@NATIVE
@pytest.mark.parametrize("temperature", [1e-6, 0.01, 1.0])
def test_a_cold_sample_between_capped_near_ties_is_left_to_torch(monkeypatch, tiny_config, temperature):
    """Sampled runs on two capped logits an ulp apart: at a low temperature their shares hang on that ulp, so the
    margin grows with the cap over the temperature and those steps are sample_next's: the same tokens and the
    same generator state as one step at a time."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = two_logits_an_ulp_apart(tiny_config)
    idx = torch.zeros(1, 1, dtype=torch.long)
    runs, one = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    out = generate(model, idx, 13, temperature=temperature, generator=runs)
    assert torch.equal(out, one_step_at_a_time(model, idx, 13, temperature=temperature, generator=one))
    assert torch.equal(torch.rand(2, generator=runs), torch.rand(2, generator=one))


@NATIVE
def test_a_stream_stopped_inside_a_sampled_run_leaves_the_generator_at_its_last_token(monkeypatch, tiny_config):
    """A run draws 16 steps ahead; a consumer that stops after 5 tokens (chat.py at the end of an answer, with
    one generator for the whole session) finds the generator where 5 steps leave it: the next answer is the
    same as one step at a time's. generate()'s stops too. And the same generator twice in a list (its draws go
    round the rows) takes no runs."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(replace(tiny_config, **OPTIONS["modern"]))
    idx = torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(6))

    def answers(run_ahead):
        gen, texts = torch.Generator().manual_seed(3), []
        for _ in range(2):
            text = []
            for tok in stream(model, idx, 12, temperature=0.9, generator=[gen], run_ahead=run_ahead):
                text.append(tok.item())
                if len(text) == 5:
                    break
            texts.append(text)
        return texts, torch.rand(1, generator=gen)
    ahead, one = answers(16), answers(1)
    assert ahead[0] == one[0] and torch.equal(ahead[1], one[1])
    gens = [torch.Generator().manual_seed(4) for _ in range(2)]
    out = generate(model, idx, 12, temperature=0.9, generator=gens[0], stop=[[int(ahead[0][0][2])]])
    one_out = generate(model, idx, 12, temperature=0.9, generator=gens[1], stop=[[int(ahead[0][0][2])]])
    assert torch.equal(out, one_out) and torch.equal(torch.rand(1, generator=gens[0]), torch.rand(1, generator=gens[1]))
    twice = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(7))
    g1, g2 = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    assert torch.equal(generate(model, twice, 12, temperature=0.9, generator=[g1, g1]),
                       one_step_at_a_time(model, twice, 12, temperature=0.9, generator=[g2, g2]))


@NATIVE
def test_decoding_on_decode_c_ignores_the_default_dtype(monkeypatch, tiny_config):
    """decode.c writes float32: its buffers are float32 under torch.set_default_dtype(torch.float64) too."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(replace(tiny_config, **OPTIONS["modern"]))
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(9))
    expected = one_step_at_a_time(model, idx, 10, temperature=0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.equal(one_step_at_a_time(model, idx, 10, temperature=0), expected)
        assert torch.equal(generate(model, idx, 10, temperature=0), expected)
    finally:
        torch.set_default_dtype(default)


@NATIVE
def test_a_near_tie_under_the_softcap_is_left_to_torch(monkeypatch, tiny_config):
    """Two logits an ulp or so apart (30.0000286 and the next float) capped at 15: libm's tanhf and torch.tanh
    can round them to a tie or not (they did on the machine this was written on), so decode.c leaves each such
    step's choice to torch: every run gives one token, and the tokens are one step at a time's."""
    monkeypatch.setattr(cpu, "FLOAT32_KERNEL", "native")
    model = two_logits_an_ulp_apart(tiny_config)
    made = record_runs(monkeypatch)
    idx = torch.zeros(1, 1, dtype=torch.long)
    out = generate(model, idx, 8, temperature=0)
    one_at_a_time = torch.cat([idx] + [t[:, None] for t in stream(model, idx, 8, temperature=0)], dim=1)
    assert [chosen + handed for _, chosen, handed in made] == [1] * 7 and torch.equal(out, one_at_a_time)


def test_every_gptconfig_field_is_one_the_fused_step_knows():
    """A field added to GPTConfig must be decided on in fused_step.SUPPORTED: until then the step is off."""
    assert set(SUPPORTED) == {f.name for f in dataclasses.fields(GPTConfig)}
    assert fused_step.supported(GPTConfig())

    @dataclasses.dataclass
    class Extended(GPTConfig):
        new_option: bool = False
    assert not fused_step.supported(Extended())


def test_the_model_runs_itself_where_the_fused_step_does_not_apply(tiny_config):
    """Hooks (trace.py, batching), the manual attention path, other dtypes, autocast, a changed weight and
    training mode all send a step back to the model's forward."""
    def built(model):
        with packed_weights(model, 1) as packed:
            return FusedStep.build(model, packed)

    model = sharp32(tiny_config)
    assert built(model) is not None
    assert built(sharp32(replace(tiny_config, attn_impl="manual"))) is None
    assert built(sharp(tiny_config)) is None  # float64
    handle = model.transformer.h[1].attn.hook_weights.register_forward_hook(lambda *a: None)
    assert built(model) is None
    handle.remove()
    with packed_weights(model, 1) as packed:
        step = FusedStep.build(model, packed)
        assert step.valid()
        handle = model.transformer.h[0].mlp.register_forward_pre_hook(lambda *a: None)
        assert not step.valid()  # a hook added after the step was built
        handle.remove()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not step.valid()
        model.transformer.h[1].attn.impl = "manual"  # as trace.py does, for the scores
        assert not step.valid()
        model.transformer.h[1].attn.impl = "sdpa"
        model.train()
        assert not step.valid()
        model.eval()
        assert step.valid()
        with torch.no_grad():
            model.transformer.ln_f.weight.mul_(2)  # not a packed weight: the step reads it as it is now
        assert step.valid()
        with torch.inference_mode():
            cached = KVCache(model.config, 1, "cpu", torch.float32), KVCache(model.config, 1, "cpu", torch.float32)
            token = torch.tensor([3])
            torch.testing.assert_close(step(token, cached[0]), model(token[:, None], kv_cache=cached[1])[0])
        with torch.no_grad():
            model.transformer.h[0].mlp.c_fc.weight.mul_(2)  # a packed weight: its copy is stale
        assert not step.valid()
    with packed_weights(model, 1) as packed:
        step = FusedStep.build(model, packed)
        model.transformer.ln_f.weight = torch.nn.Parameter(model.transformer.ln_f.weight.detach() * 2)
        assert not step.valid()  # replaced, not changed in place


@pytest.mark.parametrize("kernel", ["packed", pytest.param("native", marks=NATIVE)])
@pytest.mark.parametrize("name", ["transformer.h.0.mlp.c_fc.weight", "lm_head.weight", "transformer.ln_f.weight",
                                  "transformer.wpe.weight"])
def test_a_weight_given_new_data_sends_the_step_back(tiny_config, kernel, name):
    """`.data =` (as Module.to and Module.half assign) keeps the parameter and its version counter: the packed
    copy is stale all the same, and so is the memory decode.c reads by address."""
    model = sharp32(replace(tiny_config, tie_weights=False)).eval()
    with torch.inference_mode(), (packed_weights(model, 1) if kernel == "packed" else contextlib.nullcontext({})
                                  ) as packed:
        step = FusedStep.build(model, packed, kernel=kernel)
        assert step.valid()
        weight = model.get_parameter(name)
        weight.data = weight.data * 2
        assert not step.valid()


@NATIVE
def test_int8_rows_or_ropes_table_replaced_send_the_native_step_back(tiny_config):
    """Buffers decode.c reads: an int8 layer's rows given new data, RoPE's table replaced (crop_block_size)."""
    from nanogpt.quantize import quantize
    model = quantize(sharp32(replace(tiny_config, pos_emb="rope")), "int8")
    step = FusedStep.build(model, {}, kernel="native", int8_kernel="native")
    assert step.layers is not None and step.valid()
    rows = model.transformer.h[0].attn.c_attn.qweight
    rows.data = rows.data.clone()
    assert not step.valid()
    step = FusedStep.build(model, {}, kernel="native", int8_kernel="native")
    model.crop_block_size(8)
    assert not step.valid()


def engine_for(model, slots, decode):
    """A engine.Engine on model whose decode steps run on decode (cpu.decoding's step, or None: the model)."""
    from nanogpt.engine import Engine
    engine = Engine(model, slots, 16, torch.device("cpu"), contextlib.nullcontext())
    engine.decode = decode
    return engine


def test_one_active_sequence_in_the_batching_engine_decodes_on_the_fused_step(monkeypatch, tiny_config):
    """serve.py with one client: its slot of the shared cache, at its own position, through the fused step."""
    model = sharp32(replace(tiny_config, pos_emb="rope"))
    calls = []
    real = FusedStep.__call__
    monkeypatch.setattr(FusedStep, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode(), cpu.decoding(model, 3) as step:
        engine = engine_for(model, 3, step)
        full, _ = model(idx)
        engine.cache.select([2])
        model(idx[:, :7], kv_cache=engine.cache)
        for t in range(7, 12):
            logits = engine.decode_step(idx[:, t], [2])
            torch.testing.assert_close(logits, full[:, t], atol=2e-5, rtol=1e-5)
    assert len(calls) == 5


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("option", ["gpt2", "modern", "value_embeds", "qk_norm"])
@pytest.mark.parametrize("slots", [[0, 1, 2], [3, 0, 2]])  # adjacent (read as a view) and scattered (gathered)
def test_rows_at_their_own_positions_match_each_sequence_alone(monkeypatch, tiny_config, option, slots, fused):
    """Continuous batching's step, on the fused path and on the model's: three sequences in slots of one cache,
    each at its own position, give the logits of a full forward over each alone."""
    model = sharp32(replace(tiny_config, **OPTIONS[option]))
    calls = []
    real = FusedStep.__call__
    monkeypatch.setattr(FusedStep, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    seqs = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(6))
    lengths = [9, 4, 13]  # each row's prompt; then three steps together
    with torch.inference_mode(), cpu.decoding(model, 4) as step:
        engine = engine_for(model, 4, step if fused else None)
        full, _ = model(seqs)
        for slot, seq, n in zip(slots, seqs, lengths):
            engine.cache.select([slot])
            model(seq[None, :n], kv_cache=engine.cache)
        for t in range(3):
            positions = [n + t for n in lengths]
            tokens = torch.stack([seq[p] for seq, p in zip(seqs, positions)])
            logits = engine.decode_step(tokens, slots)
            expected = torch.stack([full[r, p] for r, p in enumerate(positions)])
            torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)
    assert len(calls) == (3 if fused else 0)
