"""Continuous batching: sequences join and leave a running batch that decodes one token per step.

A fixed number of slots share one KV cache (SlotCache). A new sequence is
prefilled alone into a free slot (one forward over its prompt), then decodes
with every other active sequence: each step is one forward of shape (active, 1),
each row at its own position, seeing only its own slot's filled positions. A
sequence leaves its slot when it ends or is cancelled, and the next waiting one
takes it. One thread (Engine.run) does all of this; other threads submit and
cancel sequences.

model.py takes one position for a whole batch (kv_cache.pos) and no mask, so a
decode step runs on decode.FusedStep.rows, which takes each row's position and
masks inside SDPA, wherever the fused step applies; elsewhere (hooks on the
model, another dtype) it passes per-row positions and the mask through the
model's standard forward hooks (per_row): the learned position embedding's
output, the RoPE rotation of q and k, and the masked attention scores of the
manual attention path. The numbers are those of decoding each sequence alone.
"""
import collections
import threading
import traceback
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F

from decode import FusedStep
from generate import KVCache, packed_weights, sample_next
from model import apply_rope


class SlotCache:
    """Keys and values of `slots` sequences, each at its own position.

    A decode step sets `slots` and `positions` (the rows' cache slots and the
    positions their new tokens take); model.forward (or decode.FusedStep.rows) then calls update() per layer.
    """

    def __init__(self, config, slots, device, dtype):
        shape = (config.n_layer, slots, config.kv_heads, config.block_size, config.head_dim)
        # zeros, not empty: the positions a row does not see are read (and weighted 0), and 0 * NaN is NaN
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0  # what model.forward adds to every row's position: 0, the hooks give each row its own
        self.slots = self.positions = self.rows = self.end = None

    def row(self, slot):
        """One slot as a KVCache of batch 1 from position 0: a prefill writes the slot's keys and values."""
        view = KVCache.__new__(KVCache)  # not __init__: its tensors are views of this cache, not new ones
        view.k, view.v, view.pos = self.k[:, slot:slot + 1], self.v[:, slot:slot + 1], 0
        return view

    def update(self, layer, k, v):
        """Store each row's k, v (A, nkv, 1, hs) at its position; return the rows' keys and values up to the
        furthest position (A, nkv, L, hs): positions past a row's own are hidden by per_row's mask."""
        self.k[layer, self.slots, :, self.positions] = k[:, :, 0]
        self.v[layer, self.slots, :, self.positions] = v[:, :, 0]
        return self.k[layer, self.rows, :, :self.end], self.v[layer, self.rows, :, :self.end]

    def decode(self, model, tokens, slots, positions, fused=None):
        """Logits (A, V) of one step: tokens[i] at position positions[i] of the sequence in slot slots[i]
        (tokens a tensor (A,), slots and positions lists of ints). fused: the model's decode.FusedStep, or None
        (the step then runs on it).
        """
        if len(slots) == 1:  # one row has one position: the model's own cached step, no hooks
            view = self.row(slots[0])
            view.pos = positions[0]
            if fused is not None and fused.valid():
                return fused(tokens, view)[:, -1]
            logits, _ = model(tokens[:, None], kv_cache=view)
            return logits[:, -1]
        device = tokens.device
        self.slots, self.positions = torch.tensor(slots, device=device), torch.tensor(positions, device=device)
        self.pos, self.end = 0, max(positions) + 1
        # adjacent slots (the usual case: the lowest free slot is taken first) are read as a view, others copied
        adjacent = slots == list(range(slots[0], slots[0] + len(slots)))
        self.rows = slice(slots[0], slots[0] + len(slots)) if adjacent else self.slots
        if fused is not None and fused.valid():
            return fused.rows(tokens, self)
        with per_row(model, self.positions):
            logits, _ = model(tokens[:, None], kv_cache=self)
        return logits[:, -1]


@contextmanager
def per_row(model, positions):
    """Within: a forward of one token per row places row i at positions[i] and hides from it every key
    beyond that position. Forward hooks replace the position embedding's output and the RoPE rotations,
    and the manual attention path (switched on here) masks its scores; removed on exit."""
    ends = positions[:, None, None, None]  # (A, 1, 1, 1)
    blocks = model.transformer.h
    impls = [block.attn.impl for block in blocks]
    with ExitStack() as hooks:
        def hook(module, fn):
            hooks.callback(module.register_forward_hook(fn).remove)
        if "wpe" in model.transformer:
            hook(model.transformer.wpe, lambda m, args, out: F.embedding(positions[:, None], m.weight))  # (A, 1, C)
        rope = model.rope[positions][:, None, None] if model.config.pos_emb == "rope" else None  # (A, 1, 1, hs/2)
        for block in blocks:
            attn = block.attn
            if rope is not None:
                unrotated = {}
                hook(attn.hook_q, lambda m, args, out, u=unrotated: u.__setitem__("q", out))
                hook(attn.hook_k, lambda m, args, out, u=unrotated: u.__setitem__("k", out))
                hook(attn.hook_q_rot, lambda m, args, out, u=unrotated: apply_rope(u["q"], rope))
                hook(attn.hook_k_rot, lambda m, args, out, u=unrotated: apply_rope(u["k"], rope))
            hook(attn.hook_masked, lambda m, args, out: out.masked_fill(
                torch.arange(out.size(-1), device=out.device) > ends, float("-inf")))  # (A, nh, 1, L)
            attn.impl = "manual"
        try:
            yield
        finally:
            for block, impl in zip(blocks, impls):
                block.attn.impl = impl


class Sequence:
    """One sequence to decode: prompt ids, sampling settings, its own generator, and a sink.

    sink.add(token, logprobs) takes each new token (logprobs: None, or the token's log-probability
    and the top `logprobs` (id, log-probability) pairs) and returns True when a stop ends the
    sequence; sink.end(reason, error) is called once: reason "stop", "length", "cancelled", or
    "error" with the error's message. Both are called on the engine's thread; cancel() from any.
    """

    def __init__(self, ids, max_tokens, sink, temperature=1.0, top_k=None, top_p=None, generator=None, logprobs=None):
        self.max_tokens, self.sink = max_tokens, sink
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator
        self.logprobs = logprobs
        self.cancelled = False  # set by other threads: a bool's write is atomic
        self.slot, self.pos, self.last, self.generated = None, 0, None, 0
        # the tokens so far (prompt and generated): a context shift recomputes the cache from their last half
        self.history = list(ids)

    def cancel(self):
        self.cancelled = True


class QueueFull(Exception):
    """More sequences wait for a slot than the engine queues."""


class Engine:
    """The decode loop of continuous batching, run by one thread (run); submit() from any thread.

    `lock` is held during each forward: another user of the model (an attention
    view) takes it to run between steps.
    """

    def __init__(self, model, max_batch, max_queue, device, autocast_ctx):
        self.model, self.max_batch, self.max_queue, self.autocast = model, max_batch, max_queue, autocast_ctx
        self.cache = SlotCache(model.config, max_batch, device, model.lm_head.weight.dtype)
        self.device = device
        self.free = list(range(max_batch - 1, -1, -1))  # popped from the end: slot 0 first
        self.active = {}  # slot -> Sequence
        self.waiting = collections.deque()
        self.wake = threading.Condition()
        self.lock = threading.Lock()
        self.stopping = False
        self.fused = None  # decode.FusedStep while run() holds packed weights

    def submit(self, seqs):
        with self.wake:
            if len(self.waiting) + len(seqs) > self.max_queue:
                raise QueueFull(f"{len(self.waiting)} sequences already wait for one of {self.max_batch} slots "
                                f"(at most {self.max_queue} wait); try again later")
            self.waiting.extend(seqs)
            self.wake.notify()

    def stop(self):
        with self.wake:
            self.stopping = True
            self.wake.notify()

    def busy(self):
        """Active and waiting sequences (a snapshot)."""
        return len(self.active), len(self.waiting)

    @torch.inference_mode()
    def run(self):
        with packed_weights(self.model, self.max_batch) as packed, self.autocast:
            self.fused = FusedStep.build(self.model, packed)  # every decode step runs on it where it applies
            while True:
                with self.wake:
                    while not (self.stopping or self.waiting or self.active):
                        self.wake.wait()
                    if self.stopping:
                        break
                self.drop_cancelled()
                self.admit()
                if self.active:
                    self.guarded(self.step, list(self.active.values()))
        self.fused = None  # it holds the packed copies
        for seq in list(self.active.values()) + list(self.waiting):
            self.leave(seq, "cancelled", "the server is shutting down")

    def guarded(self, fn, seqs, *args):
        """fn(seqs, *args); an exception ends those sequences with it (logged) and the engine goes on."""
        try:
            fn(seqs, *args)
        except Exception as e:
            traceback.print_exc()
            for seq in seqs:
                if seq.slot is not None:
                    self.leave(seq, "error", f"{type(e).__name__}: {e}")

    def drop_cancelled(self):
        with self.wake:
            gone = [seq for seq in self.waiting if seq.cancelled]
            for seq in gone:
                self.waiting.remove(seq)
        for seq in gone + [seq for seq in self.active.values() if seq.cancelled]:
            self.leave(seq, "cancelled")

    def admit(self):
        """Prefill waiting sequences into free slots, one forward each."""
        while self.free:
            with self.wake:
                if not self.waiting:
                    return
                seq = self.waiting.popleft()
            seq.slot = self.free.pop()
            self.active[seq.slot] = seq
            self.guarded(self.prefill, [seq])

    def prefill(self, seqs):
        """Fill a sequence's slot from its last tokens, one forward, and choose its next token: its prompt
        (the last block_size tokens of it), or after a context shift the last half of its window."""
        (seq,) = seqs
        block = self.model.config.block_size
        keep = seq.history[-block:] if seq.generated == 0 else seq.history[-max(1, block // 2):]
        with self.lock:
            logits, _ = self.model(torch.tensor([keep], device=self.device), kv_cache=self.cache.row(seq.slot),
                                   last_only=True)
        seq.pos = len(keep)
        self.choose([seq], logits[:, -1])

    def step(self, seqs):
        """One decode step of every active sequence. A sequence whose window is full shifts its context
        instead, as generate.stream does (llama.cpp's context shift): the same text as sample.py."""
        full = [seq for seq in seqs if seq.pos >= self.model.config.block_size]
        for seq in full:
            self.guarded(self.prefill, [seq])
        seqs = [seq for seq in seqs if seq not in full]
        if not seqs:
            return
        tokens = torch.tensor([seq.last for seq in seqs], device=self.device)
        with self.lock:
            logits = self.cache.decode(self.model, tokens, [seq.slot for seq in seqs], [seq.pos for seq in seqs],
                                       self.fused)
        for seq in seqs:
            seq.pos += 1
        self.choose(seqs, logits)

    def choose(self, seqs, logits):
        """Sample each sequence's next token from its row of logits (A, V), hand it to its sink."""
        top = max((seq.logprobs for seq in seqs if seq.logprobs is not None), default=None)
        logp = F.log_softmax(logits.float(), dim=-1) if top is not None else None
        best = torch.topk(logp, min(top, logp.size(-1)), dim=-1) if top is not None else None
        for i, seq in enumerate(seqs):
            token = sample_next(logits[i:i + 1], seq.temperature, seq.top_k, seq.top_p, [seq.generator]).item()
            seq.last, seq.generated = token, seq.generated + 1
            seq.history.append(token)
            info = None
            if seq.logprobs is not None:
                k = seq.logprobs
                info = (logp[i, token].item(), list(zip(best.indices[i, :k].tolist(), best.values[i, :k].tolist())))
            if seq.sink.add(token, info):
                self.leave(seq, "stop")
            elif seq.generated == seq.max_tokens:
                self.leave(seq, "length")

    def leave(self, seq, reason, error=None):
        if seq.slot is not None:
            del self.active[seq.slot]
            self.free.append(seq.slot)
            seq.slot = None
        seq.sink.end(reason, error)
