"""Generation: the KV cache, sampling, and the decode loop, beside the model (model.py).

The model exposes what a cached step needs, forward(idx, kv_cache=cache);
everything else about producing text lives here: the cache and its
context-shift rule, the sampling settings every program shares (Sampling)
and the sampler (OpenAI's penalties and logit bias, temperature, top-k,
top-p), stop sequences, and the serial loop that feeds each chosen token
back in: prefill, step, sample. How a step runs fast on a CPU is
nanogpt/cpu's (cpu.decoding), which a reader of this file can skip.
"""
import math
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from nanogpt import cpu


class KVCache:
    """Keys and values of every layer for the positions seen so far, the same for every row.

    Holds only the kv heads (GQA/MQA caches n_kv_head heads, not n_head).
    `pos` is the number of positions filled. A forward asks positions(T) and mask(T) for its T new
    tokens, stores each layer's keys and values with update(), then advance(T).
    """

    def __init__(self, config, batch_size, device, dtype):
        shape = (config.n_layer, batch_size, config.kv_heads, config.block_size, config.head_dim)
        # uninitialized: update() writes positions before anything reads them
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.layers = list(zip(self.k.unbind(0), self.v.unbind(0)))  # each layer's views, made once: a decode
        self.pos = 0                                                  # step's update then costs one narrow each

    def positions(self, T):
        """(T,): the positions of T new tokens, after those filled."""
        block = self.k.size(3)
        if self.pos + T > block:
            raise ValueError(f"sequence of {self.pos + T} tokens is longer than block_size ({block}); "
                             f"crop the input to its last {block} tokens")
        return torch.arange(self.pos, self.pos + T, device=self.k.device)

    def mask(self, T):
        """None: every row sits at the same positions, so the causal rule applies."""
        return None

    def decode_rows(self):
        """([the position of each row's next token], [its row of k and v]): where decode.c's block step
        (nanogpt/cpu/fused_step.py) writes and reads, in k and v (n_layer, B, nkv, block, hs). Checks as
        positions(1) does that the block has room."""
        if self.pos + 1 > self.k.size(3):
            self.positions(1)  # its error
        return [self.pos] * self.k.size(1), list(range(self.k.size(1)))

    def advance(self, T):
        self.pos += T

    def update(self, layer, k, v):
        """Store k, v (B, nkv, T, hs) at the next positions; return all positions so far."""
        T, (keys, values) = k.size(2), self.layers[layer]
        keys.narrow(2, self.pos, T).copy_(k)
        values.narrow(2, self.pos, T).copy_(v)
        return keys[:, :, :self.pos + T], values[:, :, :self.pos + T]  # (B, nkv, end, hs)


def window_start(n, start, block):
    """The first of tokens 0 .. n - 1 a cache holds to predict token n, for one that holds tokens start ..
    (start None: holds nothing yet, the last block tokens are prefilled). Unchanged while the window fits
    in block, else the last half of it, recomputed once (llama.cpp's context shift; half: the fewer
    recomputations, the faster)."""
    if start is None:
        return max(0, n - block)
    return start if n - start <= block else n - max(1, block // 2)


# --- sampling -----------------------------------------------------------------------------------------

PENALTY_LIMIT = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2], as OpenAI's
BIAS_LIMIT = 100.0  # a logit_bias lies in [-100, 100], as OpenAI's: -100 bans a token, 100 all but forces it


@dataclass
class Sampling:
    """The sampling keys of every program that generates (sample.py, chat.py, trace.py; serve.py's requests
    take the same names): how each next token is chosen, and the seed of its draws. A program's config
    extends it, so each is a --key of its own."""

    # sampling
    temperature: float = 0.8  # 1.0 as trained, < 1 more conservative, 0 greedy
    top_k: int | None = None  # keep the k most likely tokens (ties kept); None keeps all, as OpenAI's API
    top_p: float | None = None  # keep the smallest set of tokens whose probability reaches p
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted from the logit of every token the text already has
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted once per time the text already has a token
    logit_bias: dict[int, float] = field(default_factory=dict)  # {token id: bias in [-100, 100]} added to logits
    seed: int = 1337  # the same seed, the same text

    def __post_init__(self):
        check_sampling(0, self.temperature, self.top_k, self.top_p, self.presence_penalty, self.frequency_penalty,
                       self.logit_bias)
        check_seed(self.seed)

    def settings(self):
        """The keyword arguments of stream() and generate() these settings give (all but the seed)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                    logit_bias=self.logit_bias)


def check_seed(seed):
    """A seed of every program (sample, chat, trace, train, a request) lies in [0, 2^64): torch's generators' range."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be in [0, 2^64), got {seed}")


def check_sampling(max_new_tokens, temperature, top_k, top_p, presence_penalty=0.0, frequency_penalty=0.0,
                   logit_bias=None):
    """Each message begins with the setting's name (serve.py names it as the error's param)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (temperature >= 0 and math.isfinite(temperature)):  # not: NaN fails every comparison
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 (or None for no limit), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:  # also refuses NaN
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
            raise ValueError(f"{name} must be in [-2, 2] (as OpenAI's), got {value}")
    for token, bias in (logit_bias or {}).items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias has key {token!r}; its keys are token ids (whole numbers >= 0)")
        if not -BIAS_LIMIT <= bias <= BIAS_LIMIT:
            raise ValueError(f"logit_bias of token {token} is {bias}; a bias must be in [-100, 100] (as OpenAI's)")


def sample_seed(seed, i):
    """Sample i's seed: the seed itself for the first, then steps of 2^64 / golden ratio (mod 2^64)."""
    return (seed + i * 0x9E3779B97F4A7C15) % (1 << 64)


class Penalties:
    """OpenAI's presence and frequency penalties and logit bias, for `rows` texts over a vocabulary of V:

        logits[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty + logit_bias[j]

    on the model's raw logits, before temperature, top-k and top-p; c[j] counts the times token j was
    generated in the row so far (the completion's tokens, not the prompt's, as OpenAI's). add(tokens)
    counts each step's tokens (rows,). build() returns None where every setting is off.
    """

    def __init__(self, rows, vocab_size, device, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
        self.presence, self.frequency = presence_penalty, frequency_penalty
        self.counts = torch.zeros(rows, vocab_size, device=device) if presence_penalty or frequency_penalty else None
        self.bias = None
        if logit_bias:
            outside = [t for t in logit_bias if t >= vocab_size]
            if outside:
                raise ValueError(f"logit_bias has token id {outside[0]}, outside the vocabulary [0, {vocab_size})")
            self.bias = torch.zeros(vocab_size, device=device)
            self.bias[list(logit_bias)] = torch.tensor([float(b) for b in logit_bias.values()], device=device)

    @classmethod
    def build(cls, rows, vocab_size, device, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
        if not (presence_penalty or frequency_penalty or logit_bias):
            return None
        return cls(rows, vocab_size, device, presence_penalty, frequency_penalty, logit_bias)

    def __call__(self, logits):
        """The penalized logits (rows, V), in float32."""
        logits = logits.float()
        if self.counts is not None:
            logits = logits - self.counts * self.frequency - (self.counts > 0).float() * self.presence
        if self.bias is not None:
            logits = logits + self.bias
        return logits

    def add(self, tokens):
        if self.counts is not None:
            self.counts[torch.arange(self.counts.size(0), device=self.counts.device), tokens] += 1


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None, report=None, penalties=None):
    """One token per row of logits (B, V), adjusted first by penalties (a Penalties, or None).

    Temperature 0 is greedy (argmax). Otherwise one uniform draw u per row from the generator (or the
    row's own, given a list of B generators) picks the token whose cumulative probability first
    passes u (inverse-CDF sampling). report, a dict, receives the probabilities (B, V) and the draws (B, 1).
    """
    if penalties is not None:
        logits = penalties(logits)
    if temperature == 0:
        token = logits.argmax(dim=-1)
        if report is not None:
            report.update(probs=F.one_hot(token, logits.size(-1)).float(), draws=None)
        return token
    logits = logits.float()
    # subtract the maximum first: a tiny temperature then sends the others to -inf, not inf - inf = nan,
    # and the distribution reaches its limit, the argmax (shared equally among tied maxima). Below 1e-30
    # (where a float32 logit gap of 1e-7 already scales to -1e23) the limit is reached: stop dividing there
    scaled = (logits - logits.max(dim=-1, keepdim=True).values) / max(temperature, 1e-30)
    probs = F.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    draws = uniform_draws(probs.size(0), generator, probs.device)
    if report is not None:
        report.update(probs=probs, draws=draws)
    return pick(probs, draws)


def uniform_draws(rows, generator, device):
    """(rows, 1) uniforms in [0, 1): from one generator, or one per row from a list of generators,
    so that each row's draws depend on its own seed alone, whatever else is in the batch."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != rows:
            raise ValueError(f"{len(generator)} generators for {rows} rows; give one per row")
        return torch.cat([torch.rand(1, 1, generator=g, device=device) for g in generator])
    return torch.rand(rows, 1, generator=generator, device=device)


def draws_ahead(generator, rows, n, device):
    """(draws (n, rows), settle(k)): the uniform draws of the next n steps as n calls of uniform_draws would take
    them from the same generator (None: PyTorch's default), or one per row from a list, and settle(k), which leaves
    the generators as if only k steps had drawn (their states restored, then k steps' draws taken again)."""
    each = isinstance(generator, (list, tuple))
    if each and len(generator) != rows:
        raise ValueError(f"{len(generator)} generators for {rows} rows; give one per row")
    gens = list(generator) if each else [torch.default_generator if generator is None else generator]
    states = [g.get_state() for g in gens]
    take = (lambda k: torch.stack([torch.rand(k, generator=g, device=device) for g in gens], dim=1)) if each else (
        lambda k: torch.rand(k, rows, generator=gens[0], device=device))

    def settle(k):
        if k != n:
            for g, state in zip(gens, states):
                g.set_state(state)
            take(k)
    return take(n), settle


def pick(probs, draw):
    """The token of each row whose cumulative probability first exceeds draw (B, 1) in [0, 1)."""
    cdf = probs.cumsum(dim=-1)
    tok = torch.searchsorted(cdf, draw * cdf[:, -1:], right=True)  # right: a zero-probability token is never picked
    return tok.clamp(max=probs.size(-1) - 1).squeeze(-1)


def filter_logits(logits, top_k=None, top_p=None):
    """Set to -inf the logits outside top-k (ties at the threshold kept) and outside the nucleus."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # the smallest set reaching top_p
        drop_sorted[:, 0] = False  # the most likely token always stays, even where top_p rounds to 0 in float32
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


# --- stops --------------------------------------------------------------------------------------------

MAX_STOPS = 4  # as OpenAI
MAX_STOP_CHARS = 1000  # a stop ends a turn ("\n\n", "User:"); longer text is held back while it could be one


def check_stops(stops):
    """At most MAX_STOPS stops (strings or token ids), each string at most MAX_STOP_CHARS characters."""
    if len(stops) > MAX_STOPS:
        raise ValueError(f"stop has {len(stops)} sequences; at most {MAX_STOPS} are taken (as OpenAI)")
    longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(f"stop has a sequence of {longest:,} characters; at most {MAX_STOP_CHARS:,} are taken")


class StopMatcher:
    """One stop (a string or a list of ids) against a sequence fed an item at a time (Knuth-Morris-Pratt).

    `state` is the length of the longest end of what was fed that begins the stop: the stop is found
    when it reaches len(stop). An item costs O(1) amortized, whatever the stop's length.
    """

    def __init__(self, stop):
        self.stop, self.state = stop, 0
        self.border = [0] * len(stop)  # border[i]: the longest proper prefix of stop[:i + 1] that also ends it
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.border[k - 1]
            k += stop[i] == stop[k]
            self.border[i] = k

    def feed(self, item):
        """Advance by one item; True when what was fed now ends with the stop."""
        k = self.border[-1] if self.state == len(self.stop) else self.state
        while k and item != self.stop[k]:
            k = self.border[k - 1]
        self.state = k + (item == self.stop[k])
        return self.state == len(self.stop)


class Continuation:
    """One sample's text as its tokens arrive.

    Ends at the first stop (token-id sequences or text), which is not part of
    the output, and never hands out text that a stop could still remove.
    tokenizer None: ids only (no text).
    """

    def __init__(self, tokenizer=None, stop_texts=(), stop_ids=()):
        self.decoder = tokenizer.decoder() if tokenizer is not None else None
        self.stop_texts = [StopMatcher(s) for s in stop_texts if s]
        self.stop_ids = [StopMatcher(list(s)) for s in stop_ids if len(s)]
        self.ids, self.fed, self.text, self.shown, self.done = [], 0, "", 0, False

    def add(self, token):
        """Take the next token; return the text that is now safe to show."""
        if self.done:
            return ""
        self.ids.append(token)
        found = [len(m.stop) for m in self.stop_ids if m.feed(token)]  # every matcher sees every token
        if found:
            del self.ids[-found[0]:]
            self.done = True
        if self.decoder is None:
            return ""
        held = 0 if self.done else max((m.state for m in self.stop_ids), default=0)
        while self.fed < len(self.ids) - held:
            self.fed += 1
            if self.add_text(self.decoder.feed(self.ids[self.fed - 1])):
                break
        held_chars = 0 if self.done else max((m.state for m in self.stop_texts), default=0)
        new = self.text[self.shown:len(self.text) - held_chars]
        self.shown += len(new)
        return new

    def add_text(self, piece):
        """Append piece to the text; True when a stop ends in it, the text then cut at that stop's start
        (the earliest start, of all the stops that end in piece)."""
        starts = []
        for m in self.stop_texts:
            end = next((i + 1 for i, c in enumerate(piece) if m.feed(c)), None)
            if end is not None:
                starts.append(len(self.text) + end - len(m.stop))
        self.text += piece
        if starts:
            self.text, self.done = self.text[:min(starts)], True
        return bool(starts)

    def finish(self):
        """The rest of the text once generation is over."""
        if self.decoder is None:
            return ""
        if not self.done:
            for token in self.ids[self.fed:]:
                self.text += self.decoder.feed(token)
            self.text += self.decoder.flush()
            self.fed = len(self.ids)
        new = self.text[self.shown:]
        self.shown = len(self.text)
        return new


# --- the decode loop ----------------------------------------------------------------------------------

GREEDY_RUN = 16  # steps decode.c takes in one call where the caller lets it run ahead (stream's run_ahead)


@torch.inference_mode()  # entered per step, not while the caller holds a token
def stream(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True,
           on_step=None, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, run_ahead=1):
    """Yield the next token of every sample, (B,), one step at a time. Serial by nature.

    With the cache: one prefill of the prompt, then one position per step.
    When the context would pass block_size, the cached path keeps the last
    half of the window, recomputes it once and continues, as llama.cpp's
    context shift does (the uncached path slides the window by one each
    step, so the two differ beyond block_size). Each step after a prefill
    is cpu.decoding's: on a CPU, packed float32 weights (a second copy of
    them held while the generator runs; bfloat16's kept while the weights live) and the fused step where it
    applies.
    on_step(report): called each step with the step's logits, probs, draws and tokens.
    presence_penalty, frequency_penalty and logit_bias: Penalties, counting the tokens of each row
    generated here (not idx's). The yielded tensors are inference tensors: call .tolist() or .clone().
    run_ahead: greedy decoding, and sampling with no top-k, top-p or penalty (on the draws sample_next would
    take), without on_step, may take up to this many steps on decode.c's step in one call (cpu.decoding's
    step.run) and yield its tokens one by one after: the same tokens, without Python between the steps; other
    decoding looks at whether the fused step still applies once in this many steps. The caller then must not change the model while the generator is suspended (a
    change takes effect at the next call or look), nor draw from the sampling generators (PyTorch's default one
    where generator is None): a sampled run has drawn its steps ahead, and winds the generators back to the
    tokens taken when it ends or the stream is closed. 1 runs no step ahead and looks every step.
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p, presence_penalty, frequency_penalty, logit_bias)
    block = model.config.block_size
    B, T = idx.shape
    penalties = Penalties.build(B, model.config.vocab_size, idx.device, presence_penalty, frequency_penalty,
                                logit_bias)
    training = [m for m in model.modules() if m.training]  # put back as they were, each module its own mode
    for m in training:
        m.training = False  # model.eval() sets every module's flag, each a slow Module.__setattr__: 0.4 ms a call
    try:
        scratch = lambda: KVCache(model.config, B, idx.device, torch.float32)  # noqa: E731  (to time kernels on)
        with cpu.decoding(model, B, scratch) as step:  # B rows per step
            # the last `block` tokens are all any forward reads: nothing grows with max_new_tokens. Each step's
            # token is kept as it came (a list append), and joined to the window only where a forward reads it
            window, recent = idx[:, T - min(T, block):], []  # the window's tokens: window's, then recent's

            def last(k):
                nonlocal window, recent
                if recent:
                    window, recent = torch.cat([window, torch.stack(recent, 1)], 1)[:, -block:], []
                return window[:, window.size(1) - k:]
            cache, start, tok = None, None, None  # the cache holds tokens start .. n - 2; tok: token n - 1
            plain = (top_k is None or top_k >= model.config.vocab_size) and (top_p is None or top_p >= 1.0)
            shared = isinstance(generator, (list, tuple)) and len({id(g) for g in generator}) < len(generator)
            # decode.c runs steps ahead: greedy, or sampled at a temperature alone (shared: one generator's draws go
            # round the rows a step at a time, not drawn ahead a row each)
            ahead = run_ahead if penalties is None and on_step is None and (
                temperature == 0 or plain and not shared) else 1
            looks = run_ahead if on_step is None else 1  # steps a look at the fused step's validity covers
            n, end, since = T, T + max_new_tokens, 0
            while n < end:
                if ahead > 1 and cache is not None and window_start(n, start, block) == start:
                    steps = min(ahead, end - n, block - cache.pos)  # to the window's end
                    draws, settle = draws_ahead(generator, B, steps, idx.device) if temperature else (None, lambda k: None)
                    run = step.run(tok, cache, steps, temperature and max(temperature, 1e-30), draws)
                    if run is None:  # decode.c does not run this step: one at a time from here
                        ahead = 1
                        settle(0)
                    else:
                        run, logits = run
                        settle(run.size(0))
                        for i, tok in enumerate(run):  # (B,) each, the last fed to the next step
                            recent.append(tok)
                            try:
                                yield tok
                            except GeneratorExit:  # the consumer stopped here: the draws of the tokens it took
                                settle(i + 1)
                                raise
                        n += run.size(0)
                        if logits is not None:  # a choice decode.c's rounding could make otherwise: sample_next's
                            tok = sample_next(logits, temperature, top_k, top_p, generator)
                            recent.append(tok)
                            yield tok
                            n += 1
                        continue
                if not use_cache:
                    logits, _ = model(last(min(n, block)), last_only=True)
                elif window_start(n, start, block) != start:  # prefill, or shift a full window
                    if cache is None:
                        cache = KVCache(model.config, B, idx.device, model.transformer.wte.weight.dtype)
                    start, cache.pos = window_start(n, start, block), 0
                    logits, _ = model(last(n - start), kv_cache=cache, last_only=True)
                else:
                    logits = step(tok, cache, look=since % looks == 0)
                    since += 1
                report = {} if on_step is not None else None
                tok = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator, report, penalties)  # (B,)
                if penalties is not None:
                    penalties.add(tok)
                if on_step is not None:
                    on_step({"logits": logits[:, -1, :], "temperature": temperature, "tokens": tok, **report})
                recent.append(tok)
                yield tok
                n += 1
    finally:
        for m in training:
            m.training = True


def continue_rows(rows, steps):
    """Feed each step's tokens (B,) from stream() to the rows' Continuations until every row is done (or
    the steps end); each row finished. Returns rows."""
    for tok in steps:
        for row, t in zip(rows, tok.tolist()):
            row.add(t)
        if all(row.done for row in rows):
            break
    for row in rows:
        row.finish()
    return rows


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, stop=None, generator=None,
             use_cache=True, on_step=None, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
    """Continue idx (B, T) by max_new_tokens; returns (B, T + n).

    stop: token-id sequences; a sample ends at its first match, which is
    not included, and its row is padded with -1 after its end. n is the
    number of steps taken: it is smaller than max_new_tokens when every
    sample stopped early. presence_penalty, frequency_penalty, logit_bias: as stream's.
    """
    args = (model, idx, max_new_tokens, temperature, top_k, top_p, generator, use_cache, on_step, presence_penalty,
            frequency_penalty, logit_bias, GREEDY_RUN)  # nothing here changes the model between steps
    stops = [list(s) for s in (stop or []) if len(s)]
    if not stops:  # no host sync per step: the tokens stay on the device until the end
        return torch.cat([idx] + [t[:, None] for t in stream(*args)], dim=1)
    rows = continue_rows([Continuation(stop_ids=stops) for _ in range(idx.size(0))], stream(*args))
    n = max(len(row.ids) for row in rows)
    new = torch.tensor([row.ids + [-1] * (n - len(row.ids)) for row in rows], dtype=idx.dtype, device=idx.device)
    return torch.cat((idx, new.view(idx.size(0), n)), dim=1)
