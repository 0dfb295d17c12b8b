"""Continuous batching: sequences join and leave a running batch that decodes one token per step.

A fixed number of slots share one KV cache (SlotCache). A new sequence is
prefilled alone into a free slot (one forward over its prompt), then decodes
with every other active sequence: each step is one forward of shape (active, 1),
each row at its own position, seeing only its own slot's filled positions. A
sequence leaves its slot when it ends or is cancelled, and the next waiting one
takes it. Work that is not decoding (a Task: scoring a prompt) waits in the same
queue and holds a slot while it runs, one forward between two decode steps, so
that it is admitted and bounded as sequences are and never stalls them. One
thread (Engine.run) does all of this; other threads submit and cancel.

The cache owns the positions (as nanochat's cache_seqlens, litgpt's input_pos):
SlotCache knows how many positions each slot holds, and model.forward asks it for
the new tokens' positions and for the mask that keeps each row to its own slot's
positions; the Engine's decode steps are cpu.decoding's (the fused step where it applies,
else the model) on it. The numbers are those of decoding each sequence alone.
"""
import collections
import threading
import traceback

import torch
import torch.nn.functional as F

from nanogpt import cpu
from nanogpt.generate import KVCache, Penalties, sample_next, window_start


class SlotCache:
    """Keys and values of `slots` sequences, each at its own position.

    lengths[s] is the number of positions slot s holds. select(slots) names the rows of the next
    forward (row i continues slot slots[i]); the forward then asks positions(T) and mask(T), stores
    each layer's keys and values with update() and ends with advance(T), as with generate.KVCache.
    """

    def __init__(self, config, slots, device, dtype):
        shape = (config.n_layer, slots, config.kv_heads, config.block_size, config.head_dim)
        # zeros, not empty: the positions a row does not see are read (and weighted 0), and 0 * NaN is NaN
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = [0] * slots
        self.slots = self.index = self.rows = self.new = self.end = None
        self.same = True

    def restart(self, slot):
        """Forget what slot holds: the next forward fills it from position 0 (a new sequence, a context shift)."""
        self.lengths[slot] = 0

    def select(self, slots):
        """The rows of the next forward: row i continues slot slots[i] (a list of ints) from its length."""
        self.slots, self.index = slots, torch.tensor(slots, device=self.k.device)
        # adjacent slots (the usual case: the lowest free slot is taken first) are read as a view, others copied
        adjacent = slots == list(range(slots[0], slots[0] + len(slots)))
        self.rows = slice(slots[0], slots[0] + len(slots)) if adjacent else self.index

    def positions(self, T):
        """(A, T): row i's T new tokens follow the positions its slot holds. Fixes where update() writes."""
        starts = [self.lengths[s] for s in self.slots]
        self.end = max(starts) + T
        if self.end > self.k.size(3):
            raise ValueError(f"sequence of {self.end} tokens is longer than block_size ({self.k.size(3)}); "
                             f"crop the input to its last {self.k.size(3)} tokens")
        device = self.k.device
        self.same = min(starts) + T == self.end  # every row at the same positions: the causal rule applies
        self.new = torch.tensor(starts, device=device)[:, None] + torch.arange(T, device=device)
        return self.new

    def mask(self, T):
        """None where every row sits at the same positions; else (A, 1, T, L) bool, True where a row's
        query may see a key: its slot's positions up to its own (L reaches the furthest row's)."""
        if self.same:
            return None
        return (torch.arange(self.end, device=self.k.device) <= self.new[..., None])[:, None]

    def decode_rows(self):
        """([the position of each row's next token], [its slot]): where decode.c's block step
        (nanogpt/cpu/fused_step.py) writes and reads, in k and v (n_layer, slots, nkv, block, hs). Fixes, as
        positions(1) does, where advance() moves, and checks that the block has room."""
        self.positions(1)
        return [self.lengths[s] for s in self.slots], list(self.slots)

    def advance(self, T):
        for s in self.slots:
            self.lengths[s] += T

    def update(self, layer, k, v):
        """Store each row's k, v (A, nkv, T, hs) at its positions; return the rows' keys and values up to the
        furthest position (A, nkv, L, hs): positions past a row's own are hidden by the mask."""
        if self.same and isinstance(self.rows, slice):  # one block of positions: written as a view
            self.k[layer, self.rows, :, self.end - k.size(2):self.end] = k
            self.v[layer, self.rows, :, self.end - k.size(2):self.end] = v
        else:
            slots = self.index[:, None]  # (A, 1), against new (A, T); the indexed view is (A, T, nkv, hs)
            self.k[layer, slots, :, self.new] = k.transpose(1, 2)
            self.v[layer, slots, :, self.new] = v.transpose(1, 2)
        return self.k[layer, self.rows, :, :self.end], self.v[layer, self.rows, :, :self.end]


class Sequence:
    """One sequence to decode: prompt ids, sampling settings, its own generator, and a sink.

    sink.add(token, logprobs) takes each new token (logprobs: None, or the token's log-probability
    and the top `logprobs` (id, log-probability) pairs) and returns True when a stop ends the
    sequence; sink.end(reason, error) is called once: reason "stop", "length", "cancelled", or
    "error" with the error's message. Both are called on the engine's thread; cancel() from any.
    presence_penalty, frequency_penalty, logit_bias: generate.Penalties, over the tokens it generates.
    """

    def __init__(self, ids, max_tokens, sink, temperature=1.0, top_k=None, top_p=None, generator=None, logprobs=None,
                 presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
        self.max_tokens, self.sink = max_tokens, sink
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator
        self.logprobs = logprobs
        self.penalty_settings = (presence_penalty, frequency_penalty, logit_bias)
        self.penalties = None  # the Penalties of its one row, built when it is admitted (on the engine's device)
        self.cancelled = False  # set by other threads: a bool's write is atomic
        self.slot, self.last, self.generated = None, None, 0
        # the tokens so far (prompt and generated): a context shift recomputes the cache from their last half
        self.history = list(ids)
        self.start = None  # the first of them its slot holds (generate.window_start); None before its prefill

    def cancel(self):
        self.cancelled = True


class Task:
    """Work for the engine's thread that is not decoding: steps is an iterator whose each next() runs one
    forward (under the engine's lock, between decode steps); done(result, error) is called once, on the
    engine's thread: with the iterator's return value when it is exhausted, or with error (its message, or
    "cancelled") and result None. It waits in the queue and holds a slot while it runs, as a Sequence does."""

    def __init__(self, steps, done):
        self.steps, self.done = steps, done
        self.cancelled, self.slot = False, None

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
        self.cache = SlotCache(model.config, max_batch, device, model.transformer.wte.weight.dtype)
        self.device = device
        self.free = list(range(max_batch - 1, -1, -1))  # popped from the end: slot 0 first
        self.active = {}  # slot -> Sequence
        self.tasks = collections.deque()  # Tasks holding a slot, each run one forward per loop in turn
        self.waiting = collections.deque()
        self.wake = threading.Condition()
        self.lock = threading.Lock()
        self.stopping = False
        self.decode = None  # cpu.decoding's step while run() or drain() holds packed weights
        self.batch_job = False  # drain(): errors propagate

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
        """Active sequences and tasks, and those waiting (a snapshot)."""
        return len(self.active) + len(self.tasks), len(self.waiting)

    @torch.inference_mode()
    def run(self):
        # autocast first: cpu.decoding packs the weights in its dtype
        with self.autocast, cpu.decoding(self.model, self.max_batch, self.scratch) as self.decode:
            while True:
                with self.wake:
                    while not (self.stopping or self.waiting or self.active or self.tasks):
                        self.wake.wait()
                    if self.stopping:
                        break
                self.drop_cancelled()
                self.admit()
                if self.tasks:
                    self.guarded(self.work, [self.tasks[0]])
                if self.active:
                    self.guarded(self.step, list(self.active.values()))
        self.decode = None  # it holds the packed copies
        for seq in list(self.active.values()) + list(self.tasks) + list(self.waiting):
            self.leave(seq, "cancelled", "the server is shutting down")

    @torch.inference_mode()
    def drain(self):
        """Decode every submitted sequence to its end on the calling thread, then return: a batch job (rl.py's
        samples), the same steps as run() takes for a server."""
        self.batch_job = True  # an exception ends the job (guarded re-raises it), not one sequence
        with self.autocast, cpu.decoding(self.model, self.max_batch, self.scratch) as self.decode:  # as run()
            try:
                while self.waiting or self.active:
                    self.drop_cancelled()
                    self.admit()
                    if self.active:
                        self.guarded(self.step, list(self.active.values()))
            finally:
                self.decode = None

    def guarded(self, fn, seqs, *args):
        """fn(seqs, *args); an exception ends those sequences with it (logged) and the engine goes on."""
        try:
            fn(seqs, *args)
        except Exception as e:
            if self.batch_job:
                raise
            traceback.print_exc()
            for seq in seqs:
                if seq.slot is not None:
                    self.leave(seq, "error", f"{type(e).__name__}: {e}")

    def drop_cancelled(self):
        with self.wake:
            gone = [seq for seq in self.waiting if seq.cancelled]
            for seq in gone:
                self.waiting.remove(seq)
        for seq in gone + [seq for seq in [*self.active.values(), *self.tasks] if seq.cancelled]:
            self.leave(seq, "cancelled")

    def admit(self):
        """Prefill waiting sequences into free slots, one forward each; a waiting task takes its slot and runs
        in turn with the others (work)."""
        while self.free:
            with self.wake:
                if not self.waiting:
                    return
                seq = self.waiting.popleft()
            seq.slot = self.free.pop()
            if isinstance(seq, Task):
                self.tasks.append(seq)
                continue
            self.active[seq.slot] = seq
            self.guarded(self.start, [seq])

    def start(self, seqs):
        """A sequence's first prefill, its Penalties built first (they count from its first token on)."""
        (seq,) = seqs
        seq.penalties = Penalties.build(1, self.model.config.vocab_size, self.device, *seq.penalty_settings)
        self.prefill(seqs)

    def work(self, tasks):
        """One forward of the first task, which then goes to the back of the line (or leaves, when done)."""
        (task,) = tasks
        self.tasks.rotate(-1)
        try:
            with self.lock:
                next(task.steps)
        except StopIteration as e:
            self.leave(task, "stop", result=e.value)

    def window_start(self, seq):
        """The first of seq's tokens its slot should hold to predict the next one (generate.window_start)."""
        return window_start(len(seq.history), seq.start, self.model.config.block_size)

    def prefill(self, seqs):
        """Fill a sequence's slot from its window, one forward, and choose its next token: its prompt (the
        last block_size tokens of it), or after a context shift the last half of its window."""
        (seq,) = seqs
        seq.start = self.window_start(seq)
        self.cache.restart(seq.slot)
        self.cache.select([seq.slot])
        with self.lock:
            logits, _ = self.model(torch.tensor([seq.history[seq.start:]], device=self.device), kv_cache=self.cache,
                                   last_only=True)
        self.choose([seq], logits[:, -1])

    def scratch(self):
        """An empty cache of max_batch rows at one position: what cpu.decoding times its kernels on."""
        return KVCache(self.model.config, self.max_batch, self.device, torch.float32)

    def step(self, seqs):
        """One decode step of every active sequence. A sequence whose window is full shifts its context
        instead, as generate.stream does (llama.cpp's context shift): the same text as sample.py."""
        full = [seq for seq in seqs if self.window_start(seq) != seq.start]
        for seq in full:
            self.guarded(self.prefill, [seq])
        seqs = [seq for seq in seqs if seq not in full]
        if not seqs:
            return
        tokens = torch.tensor([seq.last for seq in seqs], device=self.device)
        with self.lock:
            logits = self.decode_step(tokens, [seq.slot for seq in seqs])
        self.choose(seqs, logits)

    def decode_step(self, tokens, slots):
        """Logits (A, V) of one step: tokens[i] (a tensor (A,)) after the positions slot slots[i] holds, on
        cpu.decoding's step (outside run() and drain(): the model's)."""
        self.cache.select(slots)
        if self.decode is None:
            return self.model(tokens[:, None], kv_cache=self.cache)[0][:, -1]
        return self.decode(tokens, self.cache)[:, -1]

    def choose(self, seqs, logits):
        """Sample each sequence's next token from its row of logits (A, V), hand it to its sink. A row that holds
        NaN or +inf (the model's numbers overflowed) ends its sequence with an error instead."""
        broken = (logits.isnan() | logits.isposinf()).any(dim=-1).tolist()  # sync point: .item() follows anyway
        if any(broken):
            for seq in [seq for seq, b in zip(seqs, broken) if b]:
                self.leave(seq, "error", f"the model's logits are not finite (NaN or inf): its numbers overflowed "
                                         f"in {logits.dtype}; a wider --dtype (float32) may help")
            keep = [i for i, b in enumerate(broken) if not b]
            seqs, logits = [seqs[i] for i in keep], logits[keep]
        top = max((seq.logprobs for seq in seqs if seq.logprobs is not None), default=None)
        logp = F.log_softmax(logits.float(), dim=-1) if top is not None else None
        best = torch.topk(logp, min(top, logp.size(-1)), dim=-1) if top is not None else None
        for i, seq in enumerate(seqs):
            token = sample_next(logits[i:i + 1], seq.temperature, seq.top_k, seq.top_p, [seq.generator],
                                penalties=seq.penalties).item()
            if seq.penalties is not None:
                seq.penalties.add(token)
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

    def leave(self, seq, reason, error=None, result=None):
        """seq (a Sequence or a Task) ends for reason: its slot is free, its sink (or done) is told."""
        if seq.slot is not None:
            if isinstance(seq, Task):
                self.tasks.remove(seq)
            else:
                del self.active[seq.slot]
            self.free.append(seq.slot)
            seq.slot = None
        if isinstance(seq, Task):
            seq.done(result, None if reason == "stop" else error or reason)
        else:
            seq.sink.end(reason, error)
