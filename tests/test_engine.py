"""Continuous batching: each sequence decodes as if alone while others join and leave the batch."""
import contextlib
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from nanogpt.engine import Engine, QueueFull, Sequence
from nanogpt.generate import generate
from test_generate import sharp
from test_model_options import OPTIONS


class Tokens:
    """A sink that keeps the tokens; ends the sequence when `stop` is generated."""

    def __init__(self, stop=None):
        self.tokens, self.logprobs, self.reason, self.stop = [], [], None, stop

    def add(self, token, logprobs):
        self.tokens.append(token)
        self.logprobs.append(logprobs)
        return token == self.stop

    def end(self, reason, error):
        assert error is None, error
        self.reason = reason


def engine_for(model, slots=3, queue=16):
    return Engine(model, slots, queue, torch.device("cpu"), contextlib.nullcontext())


def drive(engine, joins):
    """Run the engine's loop by hand: joins[i] is submitted before step i. Returns the steps taken."""
    steps = 0
    with torch.inference_mode():
        while steps < len(joins) or engine.waiting or engine.active:
            if steps < len(joins):
                engine.submit(joins[steps])
            engine.admit()
            if engine.active:
                engine.step(list(engine.active.values()))
            steps += 1
    return steps


def alone(model, ids, n, temperature=0.0, seed=None, top_k=None):
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    out = generate(model, torch.tensor([ids]), n, temperature, top_k=top_k, generator=generator, use_cache=False)
    return out[0, len(ids):].tolist()


PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12], [3, 3], [60, 1, 2, 3, 4], [9]]
LENGTHS = [10, 13, 7, 12, 9, 11]  # prompts of 1 to 6 tokens, reaching 14 of block_size 16


@pytest.mark.parametrize("option", ["gpt2", "rope", "gqa", "modern"])
def test_sequences_joining_and_leaving_decode_as_if_alone(tiny_config, option):
    """Greedy and seeded sampling, 6 sequences through 3 slots, joining at different steps with different
    prompt lengths: each row's positions, mask and cache rows are its own (sharp: a wrong one changes tokens)."""
    model = sharp(replace(tiny_config, **OPTIONS[option]))
    sinks, joins = [], [[] for _ in range(8)]
    for i, (ids, n) in enumerate(zip(PROMPTS, LENGTHS)):
        temperature, seed = (0.0, None) if i % 2 else (1.5, 100 + i)
        sink = Tokens()
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        joins[i if i < 3 else i + 2].append(Sequence(ids, n, sink, temperature=temperature, generator=gen, top_k=20))
        sinks.append((sink, ids, n, temperature, seed))
    engine = engine_for(model)
    drive(engine, joins)
    assert len(engine.free) == 3 and not engine.active
    for sink, ids, n, temperature, seed in sinks:
        assert sink.reason == "length"
        assert sink.tokens == alone(model, ids, n, temperature, seed, top_k=20)


def test_a_stop_frees_the_slot_for_the_next_sequence(tiny_config):
    model = sharp(tiny_config)
    free = alone(model, [1, 2], 10)
    first = Tokens(stop=free[3])
    waiting = Tokens()
    engine = engine_for(model, slots=1)
    drive(engine, [[Sequence([1, 2], 10, first, temperature=0.0), Sequence([4], 6, waiting, temperature=0.0)]])
    assert first.tokens == free[:free.index(free[3]) + 1] and first.reason == "stop"
    assert waiting.tokens == alone(model, [4], 6) and waiting.reason == "length"


def test_cancelled_sequences_leave_at_the_next_step(tiny_config):
    engine = engine_for(sharp(tiny_config), slots=2)
    a, b, c = Tokens(), Tokens(), Tokens()
    seqs = [Sequence([1], 12, s, temperature=0.0) for s in (a, b, c)]
    with torch.inference_mode():
        engine.submit(seqs)
        engine.admit()
        engine.step(list(engine.active.values()))
        seqs[0].cancel()
        seqs[2].cancel()  # still waiting for a slot
        engine.drop_cancelled()
    assert a.reason == "cancelled" and c.reason == "cancelled" and len(a.tokens) == 2 and not c.tokens
    assert list(engine.active.values()) == [seqs[1]] and len(engine.free) == 1


def test_logprobs_are_the_models_log_softmax(tiny_config):
    model = sharp(tiny_config)
    sink = Tokens()
    drive(engine_for(model), [[Sequence([1, 2], 3, sink, temperature=0.0, logprobs=4)]])
    with torch.no_grad():
        logits, _ = model(torch.tensor([[1, 2] + sink.tokens[:-1]]))
    expected = torch.log_softmax(logits[0, 1:].double(), -1)
    for t, (token, (lp, top)) in enumerate(zip(sink.tokens, sink.logprobs)):
        assert lp == pytest.approx(expected[t, token].item(), abs=1e-6)
        ids = [i for i, _ in top]
        assert ids == expected[t].topk(4).indices.tolist() and ids[0] == token  # greedy: the first is chosen


def test_a_full_queue_refuses_more(tiny_config):
    engine = engine_for(sharp(tiny_config), slots=1, queue=2)
    engine.submit([Sequence([1], 3, Tokens()), Sequence([1], 3, Tokens())])
    with pytest.raises(QueueFull, match="2 sequences already wait"):
        engine.submit([Sequence([1], 3, Tokens())])


@pytest.mark.parametrize("option", ["gpt2", "rope"])
def test_a_batched_step_with_hooks_runs_sdpa_and_decodes_as_if_alone(monkeypatch, tiny_config, option):
    """A forward hook on the model (any tool's) leaves batched steps on SDPA with the cache's mask, not the
    manual path, and each sequence still decodes the tokens it decodes alone."""
    model = sharp(replace(tiny_config, **OPTIONS[option]))
    sdpa, masked = F.scaled_dot_product_attention, []  # masked: a call with a mask, over several rows

    def spy(q, *args, **kwargs):
        masked.append(kwargs.get("attn_mask") is not None and q.size(0) > 1)
        return sdpa(q, *args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    manual = []
    for block in model.transformer.h:
        block.attn.hook_scores.register_forward_hook(lambda m, args, out: manual.append(1))  # the manual path only
    sinks = [Tokens() for _ in PROMPTS[:3]]
    drive(engine_for(model), [[Sequence(ids, 6, sink, temperature=0.0) for ids, sink in zip(PROMPTS[:3], sinks)]])
    for ids, sink in zip(PROMPTS[:3], sinks):  # prompts of 3, 1 and 6 tokens: rows at different positions
        assert sink.tokens == alone(model, ids, 6)
    assert any(masked) and not manual


@pytest.mark.parametrize("option", ["gpt2", "rope"])
def test_hook_points_see_each_rows_own_tensors_in_a_batched_step(tiny_config, option):
    """HookPoints return their input unchanged and show what the model computes: in a step of three rows at
    different positions, trace's recording of each row (its position embedding, q and k after RoPE, the masked
    scores...) equals the recording of a forward over that sequence alone, at its last position."""
    from trace import Recorder
    model = sharp(replace(tiny_config, **OPTIONS[option]))
    engine = engine_for(model)
    seqs = [Sequence(ids, 4, Tokens(), temperature=0.0) for ids in PROMPTS[:3]]  # prompts of 3, 1 and 6 tokens
    with torch.inference_mode():
        engine.submit(seqs)
        engine.admit()  # each prefilled alone, its first token chosen
        with Recorder(model, 1) as batched:
            engine.step(seqs)
    for i, seq in enumerate(seqs):
        ids = seq.history[:-1]  # the step fed the last of these, at position len(ids) - 1
        with Recorder(model, 1) as single, torch.no_grad():
            model(torch.tensor([ids]))
        p = len(ids) - 1
        assert set(batched.stages) == set(single.stages)
        for name, tensor in batched.stages.items():
            assert tensor.dim() > 2 and tensor.size(0) == len(seqs), f"{name} {tuple(tensor.shape)}: not one per row"
            mine = tensor[i, ..., 0, :]  # the step's (A, ..., 1, X): row i
            expected = single.stages[name]
            expected = (expected if expected.dim() > 2 else expected[None])[0, ..., p, :]  # (1, ..., T, X) at p
            n = expected.size(-1)  # the keys row i sees, where the last axis is keys
            torch.testing.assert_close(mine[..., :n], expected, msg=f"{name}, row {i}")
            if name == "masked scores":
                assert mine[..., n:].eq(float("-inf")).all(), f"row {i} sees keys past its position"
