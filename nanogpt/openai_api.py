"""OpenAI's completions and chat APIs as data: requests read and checked, responses and server-sent events
shaped, errors as OpenAI's error object. No HTTP here (serve.py is the app), so a test can use it alone.

parse_completion and parse_chat turn a request's JSON into a CompletionRequest or raise BadRequest
(error_body is its JSON); Choice is an engine.Sequence's sink that turns tokens into pieces (text,
logprobs, finish_reason); collect joins a request's pieces into the whole response and events writes
them as OpenAI's chunks. The tokenizer endpoints' shapes follow vLLM's, which lm-evaluation-harness reads
(docs/serving.md); the chat template they publish is the chat tokenizer's (ChatTokenizer.chat_template).
"""
import json
import math
import secrets
from dataclasses import dataclass

from nanogpt.errors import UserError, nearest
from nanogpt.generate import MAX_STOPS, Continuation, Sampling, check_sampling, check_seed, check_stops
from nanogpt.tokenizer import chat_messages

MAX_LOGPROBS = 20  # alternatives per token (OpenAI's limit is 5)
# OpenAI's parameters this server takes only at the value that means "off"
OFF = {"best_of": (1,), "suffix": ("",)}
# the sampler's (generate.Sampling's keys, as sample.py and chat.py take them)
SAMPLING = {"temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "logit_bias", "seed"}
# a request's defaults are Sampling's (as sample.py's), but for OpenAI's temperature 1 and a random seed
DEFAULTS = Sampling()
# this server's own extension: "copies": true asks, with each choice, for the spans it took verbatim from the model's
# training text (nanogpt/copies.py; docs/copies.md); OpenAI's clients send it through extra_body
EXTENSIONS = {"copies"}
PARAMS = {"model", "prompt", "max_tokens", *SAMPLING, "stop", "n", "stream", "stream_options", "logprobs", "echo",
          "user", *OFF, *EXTENSIONS}
# lm-eval's perplexity requests begin with its prefix token, read as `bos_token_id or eos_token_id`: an id of 0
# (a character model's newline) reads as none and is sent as null
NULL_PREFIX = ("a token-id prompt begins with null: lm-eval sends that for a perplexity task when its prefix token "
               "(/tokenizer_info's bos_token, a character model's newline) has id 0, which it takes for none; add "
               "custom_prefix_token_id=0 to --model_args (docs/serving.md)")
CHAT_OFF = {}
CHAT_PARAMS = {"model", "messages", "max_tokens", "max_completion_tokens", *SAMPLING, "stop", "n", "stream",
               "stream_options", "logprobs", "top_logprobs", "user", *CHAT_OFF, *EXTENSIONS}
# OpenAI's chat parameters for what this server does not do, taken (besides null) only at the values that ask
# nothing of it: name -> (those values, what a client is told otherwise)
NEUTRAL = {
    "tools": (([],), "this server cannot call tools (a model here writes text only); send no tools"),
    "functions": (([],), "this server cannot call functions (a model here writes text only); send none"),
    "tool_choice": (("none", "auto"), "this server cannot call tools; tool_choice can only be \"none\" (or \"auto\")"),
    "function_call": (("none", "auto"), "this server cannot call functions; function_call can only be \"none\""),
    "parallel_tool_calls": ((True, False), "parallel_tool_calls must be true or false (no tool is called here)"),
    "response_format": (({"type": "text"},), "this server cannot constrain the output to JSON (no structured "
                        "output): response_format can only be {\"type\": \"text\"}"),
    "modalities": ((["text"],), "this server writes text only: modalities can only be [\"text\"]"),
    "audio": ((), "this server writes text only (no audio)"),
    "reasoning_effort": (("none",), "the models here do not reason before answering: reasoning_effort can only "
                         "be \"none\""),
    "verbosity": (("medium",), "verbosity cannot be set here: it can only be \"medium\", OpenAI's default"),
    "web_search_options": ((), "this server cannot search the web"),
    "moderation": ((), "this server does not moderate requests or answers"),
    "service_tier": (("auto", "default"), "this server has one service tier: service_tier can only be \"auto\" or "
                     "\"default\""),
}
# OpenAI's documented parameters that change nothing in the answer here (identifiers, storing, caching hints,
# a predicted output that only speeds OpenAI's decoding): name -> the JSON type they must have; then ignored
IGNORED = {"user": str, "safety_identifier": str, "prompt_cache_key": str, "prompt_cache_retention": str,
           "prompt_cache_options": dict, "store": bool, "metadata": dict, "prediction": dict}
CHAT_PARAMS |= set(NEUTRAL) | set(IGNORED)
MAX_ANSWER_VALUES = 1 << 20  # tokens and log-probabilities one answer holds (n x (echoed + generated) x (1 + k)): ~30 MB
LOGPROB_FLOOR = -9999.0  # a log-probability of -inf is sent as this, as OpenAI sends it: JSON has no infinity


class BadRequest(Exception):
    """A request the server refuses: an OpenAI error object with this status."""

    def __init__(self, message, param=None, status=400, kind="invalid_request_error", code=None):
        super().__init__(message)
        self.param, self.status, self.kind, self.code = param, status, kind, code


def error_body(e):
    """OpenAI's error object for a BadRequest."""
    return {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}}


def json_object(raw):
    """The JSON object a request's body (bytes) holds; a BadRequest if it is not JSON, or not an object."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:  # deep nesting exhausts the parser's recursion
        raise BadRequest(f"the body is not JSON ({e}); send a JSON object") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the body is a JSON {type(value).__name__}; send a JSON object")
    check_text(value)
    return value


def check_text(body):
    """A BadRequest naming the parameter where the body holds a lone surrogate: JSON's "\\ud800" parses as one,
    which no text holds (UTF-8 cannot write it, so neither could an answer echoing it), as OpenAI refuses it."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return
    except RecursionError:
        raise BadRequest("the body is nested too deep; send a flatter JSON object") from None
    except UnicodeEncodeError:
        pass
    for name, value in body.items():
        try:
            json.dumps([name, value], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            shown = name.encode("utf-8", "backslashreplace").decode()  # the error object itself must be text
            raise BadRequest(f"{shown} holds {e.object[e.start:e.end]!r}, a lone surrogate (half of a UTF-16 "
                             f"pair), which is not text; send valid Unicode", shown) from None


# --- reading a request --------------------------------------------------------------------------------

def typed(body, name, types, default, what):
    """body[name] if it is one of types (a bool is not a number), default if absent or null."""
    value, types = body.get(name), types if isinstance(types, tuple) else (types,)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise BadRequest(f"{name} must be {what}, got {json.dumps(value)[:60]}", name)
    return value


def number(body, name, default):
    """body[name] as a float (an integer too), default if absent or null."""
    value = typed(body, name, (int, float), default, "a number")
    try:
        return float(value) if value is not None else None
    except OverflowError:
        raise BadRequest(f"{name} must be a number of float range, got an integer of {len(str(value))} digits",
                         name) from None


@dataclass
class CompletionRequest:
    prompts: list  # of str, or of lists of token ids
    max_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    stops: list  # of str
    seed: int
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None
    echo: bool = False  # the prompt comes first in the text (and its tokens in logprobs)
    presence_penalty: float = DEFAULTS.presence_penalty
    frequency_penalty: float = DEFAULTS.frequency_penalty
    logit_bias: dict = None  # {token id: bias}; None: none
    copies: bool = False  # each choice carries the spans copied from the training text (EXTENSIONS)

    def penalties(self):
        """The keyword arguments of engine.Sequence for the penalties and logit_bias."""
        return dict(presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                    logit_bias=self.logit_bias)


def check_names(body, model_name, params, off):
    """Every argument is one this endpoint takes (those in off only at their "off" value), for this model."""
    for name in sorted(set(body) - params):
        hint = nearest(name, params) or f"; this server takes {', '.join(sorted(params))}"
        raise BadRequest(f"unrecognized request argument: {name}{hint}", name)
    for name, values in off.items():
        if body.get(name) is not None and body[name] not in values:
            raise BadRequest(f"{name} is not supported by this server; leave it out", name)
    model = typed(body, "model", str, model_name, "a string")
    if model != model_name:
        raise BadRequest(f"model {model!r} is not served here; this server serves {model_name!r}", "model", 404,
                         code="model_not_found")


def check_neutral(body, neutral=NEUTRAL, ignored=IGNORED):
    """The parameters for what this server does not do are null or at a value that asks nothing of it; those
    that change nothing here have their documented type."""
    for name, (values, why) in neutral.items():
        value = body.get(name)
        if value is not None and not any(value == v and type(value) is type(v) for v in values):
            raise BadRequest(f"{name}={json.dumps(value)[:80]} is not supported: {why}", name,
                             code="unsupported_value")
    for name, kind in ignored.items():
        typed(body, name, kind, None, {str: "a string", bool: "true or false", dict: "an object"}[kind])


def parse_stops(body):
    stops = typed(body, "stop", (str, list), [], "a string or a list of strings")
    stops = [stops] if isinstance(stops, str) else stops
    if not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", "stop")
    try:
        check_stops(stops)
    except ValueError as e:
        raise BadRequest(str(e), "stop") from None
    return stops


def parse_completion(body, model_name):
    """The request's settings, checked; a BadRequest names the first wrong one."""
    check_names(body, model_name, PARAMS, OFF)
    prompts = body.get("prompt", "")
    prompts = [prompts] if isinstance(prompts, str) or is_ids(prompts) else prompts
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) or is_ids(p) for p in prompts)):
        if isinstance(prompts, list) and any(isinstance(p, list) and p and p[0] is None and is_ids(p[1:])
                                             for p in prompts):
            raise BadRequest(NULL_PREFIX, "prompt")
        raise BadRequest("prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")
    req = CompletionRequest(
        prompts=prompts, stops=parse_stops(body),
        max_tokens=typed(body, "max_tokens", int, 16, "an integer"), **sampling_settings(body),
        logprobs=typed(body, "logprobs", int, None, "an integer"),
        echo=typed(body, "echo", bool, False, "true or false"))
    check_settings(req)
    return req


def sampling_settings(body):
    """The settings the completions and chat APIs share, as CompletionRequest's fields."""
    return dict(temperature=number(body, "temperature", 1.0), top_k=typed(body, "top_k", int, DEFAULTS.top_k,
                                                                           "an integer"),
                top_p=number(body, "top_p", DEFAULTS.top_p), seed=typed(body, "seed", int, None, "an integer"),
                presence_penalty=number(body, "presence_penalty", DEFAULTS.presence_penalty),
                frequency_penalty=number(body, "frequency_penalty", DEFAULTS.frequency_penalty),
                logit_bias=parse_logit_bias(body), copies=typed(body, "copies", bool, False, "true or false"),
                n=typed(body, "n", int, 1, "an integer"), stream=typed(body, "stream", bool, False, "true or false"),
                include_usage=stream_options(body))


def stream_options(body):
    """stream_options' include_usage (include_obfuscation is taken and ignored: this server pads nothing)."""
    options = typed(body, "stream_options", dict, {}, "an object")
    for name in sorted(set(options) - {"include_usage", "include_obfuscation"}):
        raise BadRequest(f"unrecognized request argument: stream_options.{name}; stream_options takes "
                         f"include_usage and include_obfuscation", "stream_options")
    typed(options, "include_obfuscation", bool, False, "true or false")
    return typed(options, "include_usage", bool, False, "true or false")


def parse_logit_bias(body):
    """OpenAI's logit_bias, {"token id": bias}, as {id: bias}; None where it is absent, null or empty."""
    bias = typed(body, "logit_bias", dict, {}, "an object mapping token ids to biases")
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise BadRequest(f"logit_bias has key {json.dumps(key)[:40]}; its keys are token ids (non-negative "
                             f"integers, written as strings as JSON does)", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequest(f"logit_bias of token {key} must be a number in [-100, 100], got "
                             f"{json.dumps(value)[:40]}", "logit_bias")
        try:
            token = int(key)
        except ValueError:  # int() refuses a string of more than 4,300 digits
            raise BadRequest(f"logit_bias has a key of {len(key):,} digits; its keys are token ids of this "
                             f"vocabulary", "logit_bias") from None
        try:
            out[token] = float(value)
        except OverflowError:
            raise BadRequest(f"logit_bias of token {key} must be a number in [-100, 100], got an integer of "
                             f"{len(str(value)):,} digits", "logit_bias") from None
    return out or None


def is_ids(value):
    """A list of token ids (ints, not bools): a prompt already tokenized."""
    return isinstance(value, list) and all(type(i) is int for i in value)


def parse_chat(body, model_name, max_tokens):
    """A chat request's settings, as a CompletionRequest whose one prompt is its messages."""
    check_names(body, model_name, CHAT_PARAMS, CHAT_OFF)
    check_neutral(body)
    top = typed(body, "top_logprobs", int, None, "an integer")
    wanted = typed(body, "logprobs", bool, False, "true or false")
    if top is not None and not wanted:
        raise BadRequest("top_logprobs needs logprobs: send \"logprobs\": true with it", "top_logprobs")
    limit = typed(body, "max_completion_tokens", int, None, "an integer")  # OpenAI's name; max_tokens is older
    if limit is not None and limit < 1:
        raise BadRequest(f"max_completion_tokens must be at least 1, got {limit}", "max_completion_tokens")
    req = CompletionRequest(
        prompts=[parse_messages(body.get("messages"))], stops=parse_stops(body),
        max_tokens=limit or typed(body, "max_tokens", int, max_tokens, "an integer"), **sampling_settings(body),
        logprobs=(top or 0) if wanted else None)
    check_settings(req)
    return req


def parse_messages(messages):
    """[{"role", "content"}] of a chat request under the chat template's rules (tokenizer.chat_messages: OpenAI's
    other roles as the template's, an assistant's null content left out, lists of text parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {\"role\": ..., \"content\": ...}", "messages")
    try:
        out = chat_messages(messages)
    except UserError as e:
        raise BadRequest(str(e), "messages") from None
    if not out:
        raise BadRequest("messages hold no text: every one is an assistant's with content null", "messages")
    return out


def check_settings(req):
    if req.max_tokens < 1 - req.echo:  # with echo, 0 asks for the prompt's logprobs alone
        raise BadRequest(f"max_tokens must be at least 1 (0 with echo), got {req.max_tokens}", "max_tokens")
    if req.top_p == 1:
        req.top_p = None  # OpenAI's default: no nucleus
    try:
        check_sampling(req.max_tokens, req.temperature, req.top_k, req.top_p, **req.penalties())
        if req.seed is not None:
            check_seed(req.seed)
    except ValueError as e:
        raise BadRequest(str(e), str(e).split()[0]) from None
    if req.n < 1:
        raise BadRequest(f"n must be at least 1, got {req.n}", "n")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise BadRequest(f"logprobs must be in [0, {MAX_LOGPROBS}], got {req.logprobs}", "logprobs")
    if req.seed is None:
        req.seed = secrets.randbits(64)


# --- one choice's text --------------------------------------------------------------------------------

class Choice:
    """A engine.Sequence's sink: one choice's text, its stops and logprobs as its tokens arrive.

    Text that a stop could still remove is held back (generate.Continuation), and so is each
    token's logprobs entry until its text has been sent; entries past a stop are dropped. Each
    piece goes to post(piece), from the engine's thread. with_chosen: a token's alternatives hold the
    token itself too (the completions API's top_logprobs do, the chat API's do not).
    """

    def __init__(self, index, tokenizer, stops, prompt_chars, logprobs, token_text, post, stop_ids=(),
                 with_chosen=False):
        self.index, self.post, self.token_text, self.logprobs = index, post, token_text, logprobs
        self.with_chosen = with_chosen
        self.text = Continuation(tokenizer, stops, stop_ids)
        self.decoder = tokenizer.decoder()  # each token's own text, for logprobs
        self.entries, self.chars, self.prompt_chars, self.tokens = [], 0, prompt_chars, 0

    def add(self, token, logprobs):
        self.tokens += 1
        new = self.text.add(token)
        if logprobs is not None:
            lp, top = logprobs
            if self.with_chosen and token not in (i for i, _ in top):
                logprobs = (lp, [*top, (token, lp)])
            piece = self.decoder.feed(token)
            self.entries.append((piece, logprobs, self.chars))
            self.chars += len(piece)
        shown = [e for e in self.entries if e[2] + len(e[0]) <= self.text.shown]  # entries are in text order
        self.entries = self.entries[len(shown):]
        self.send(new, shown, None)
        return self.text.done

    def end(self, reason, error):
        new = self.text.finish() if error is None else ""
        cut = len(self.text.text) if self.text.done else math.inf  # a stop cut the text there
        entries, self.entries = [e for e in self.entries if e[2] < cut], []
        self.send(new, entries, reason, error)

    def send(self, text, entries, finish_reason, error=None):
        if text or entries or finish_reason:
            self.post({"index": self.index, "text": text, "logprobs": self.logprobs_json(entries),
                       "finish_reason": finish_reason, "error": error, "tokens": self.tokens})

    def logprobs_json(self, entries):
        """OpenAI's legacy format; text_offset counts characters from the start of the prompt, as OpenAI's."""
        if not self.logprobs:
            return None
        return {"tokens": [piece for piece, _, _ in entries],
                "token_logprobs": [floor(lp) for _, (lp, _), _ in entries],
                "top_logprobs": [{self.token_text(i): floor(v) for i, v in top} for _, (_, top), _ in entries],
                "text_offset": [self.prompt_chars + offset for _, _, offset in entries]}


def floor(logprob):
    """A log-probability as JSON can hold it: -inf as OpenAI's -9999.0."""
    return max(logprob, LOGPROB_FLOOR)


def answer_values(req, prompt_lengths):
    """How many tokens and log-probabilities the answer to req holds (at most): each choice's echoed and
    generated tokens, each with its log-probability and k alternatives when logprobs are asked for."""
    per_token = 1 + (req.logprobs + 2 if req.logprobs is not None else 0)
    return req.n * sum(length * req.echo + req.max_tokens for length in prompt_lengths) * per_token


def check_answer_size(req, prompt_lengths):
    """An answer holds at most MAX_ANSWER_VALUES tokens and log-probabilities: a request cannot make the server
    build (and send) more than that, whatever n, echo and logprobs multiply."""
    values = answer_values(req, prompt_lengths)
    if values > MAX_ANSWER_VALUES:
        param = "n" if req.n > 1 else "logprobs" if req.logprobs else "prompt" if req.echo else "max_tokens"
        raise BadRequest(f"this answer would hold {values:,} tokens and log-probabilities (n={req.n} x "
                         f"{sum(prompt_lengths) * req.echo:,} echoed and {req.max_tokens * len(prompt_lengths):,} "
                         f"generated tokens x {1 + (req.logprobs + 2 if req.logprobs is not None else 0)}), more than "
                         f"one answer holds here ({MAX_ANSWER_VALUES:,}); ask for fewer choices, fewer logprobs or a "
                         f"shorter prompt", param)


def echo_logprobs(tokenizer, ids, scores):
    """The legacy logprobs of a prompt's tokens: each token's text and its offset in the prompt's.
    scores: (log-probability, {text: log-probability} of the top k) of each token, (None, None) for the first."""
    decoder, offset, tokens, offsets = tokenizer.decoder(), 0, [], []
    for i in ids:
        tokens.append(decoder.feed(i))
        offsets.append(offset)
        offset += len(tokens[-1])
    tokens[-1] += decoder.flush()  # a character the last tokens left unfinished
    return {"tokens": tokens, "token_logprobs": [lp for lp, _ in scores],
            "top_logprobs": [top for _, top in scores], "text_offset": offsets}


class Completion:
    """The legacy completions API's choices: text, and logprobs as four parallel lists."""
    chunk_object = "text_completion"

    @staticmethod
    def delta(piece, first):
        return {**{k: piece[k] for k in ("text", "index", "finish_reason")}, "logprobs": streamed_logprobs(piece)}

    @staticmethod
    def empty(index):
        return {"text": "", "index": index, "logprobs": None, "finish_reason": None}

    @staticmethod
    def extend(choice, piece):
        choice["text"] += piece["text"]
        if piece["logprobs"] is not None:
            lp = choice["logprobs"] = choice["logprobs"] or {k: [] for k in piece["logprobs"]}
            for k, values in piece["logprobs"].items():
                lp[k] += values


class Chat:
    """The chat API's choices: the assistant's message (a delta of it when streamed), logprobs per token."""
    chunk_object = "chat.completion.chunk"

    @staticmethod
    def logprobs(legacy):
        if legacy is None:
            return None
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                             "top_logprobs": [{"token": k, "logprob": v, "bytes": list(k.encode())}
                                              for k, v in top.items()]}
                            for t, lp, top in zip(legacy["tokens"], legacy["token_logprobs"], legacy["top_logprobs"])]}

    @classmethod
    def delta(cls, piece, first):
        delta = {"role": "assistant", "content": piece["text"]} if first else {"content": piece["text"]}
        return {"index": piece["index"], "delta": delta, "logprobs": cls.logprobs(streamed_logprobs(piece)),
                "finish_reason": piece["finish_reason"]}

    @staticmethod
    def empty(index):
        return {"index": index, "message": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    @classmethod
    def extend(cls, choice, piece):
        choice["message"]["content"] += piece["text"]
        if piece["logprobs"] is not None:
            lp = choice["logprobs"] = choice["logprobs"] or {"content": []}
            lp["content"] += cls.logprobs(piece["logprobs"])["content"]


COMPLETION, CHAT = Completion(), Chat()


def streamed_logprobs(piece):
    """A piece's logprobs as a chunk carries them: null in a chunk of no tokens (the last, which only ends a
    choice), as OpenAI's; a whole answer's choice has its lists, empty or not."""
    logprobs = piece["logprobs"]
    return logprobs if logprobs is not None and (piece["text"] or logprobs["tokens"]) else None


async def echoed_first(pieces, texts, n, alone, scored=None):
    """Each choice's echo (its prompt's text) as its first piece, then the choices' own pieces. scored: None,
    or (the engine scores the prompts) an async function that turns the scores, which come in a piece of
    their own ("echoes"), into each prompt's logprobs; the echo waits for them, and so does what arrives
    before them. alone: nothing is generated (max_tokens 0), so the echo ends each choice."""
    held = []
    if scored is None:
        for piece in echo_pieces(texts, [None] * len(texts), n, alone):
            yield piece
    async for piece in pieces:
        if scored is None:
            yield piece
        elif piece["index"] is not None:
            held.append(piece)
        elif piece["error"] is not None:
            await pieces.aclose()  # its sequences are cancelled
            yield {**piece, "index": 0}
            return
        else:
            logprobs, scored = await scored(piece["echoes"]), None
            for piece in echo_pieces(texts, logprobs, n, alone) + held:
                yield piece


def echo_pieces(texts, logprobs, n, alone):
    return [{"index": p * n + i, "text": text, "logprobs": lp, "finish_reason": "length" if alone else None,
             "error": None, "tokens": 0} for p, (text, lp) in enumerate(zip(texts, logprobs)) for i in range(n)]


async def events(pieces, head, usage, include_usage, shape=COMPLETION, copies=None):
    """Server-sent events in OpenAI's chunk format, ending with data: [DONE]. copies: None, or an async function
    of a choice's index and whole text whose value the chunk that ends the choice carries as "copies"."""
    head, started, texts = {**head, "object": shape.chunk_object}, set(), {}
    async for piece in pieces:
        if piece["error"] is not None:
            yield sse({"error": {"message": piece["error"], "type": "server_error", "param": None, "code": None}})
            return
        count(usage, piece)
        choice = shape.delta(piece, piece["index"] not in started)
        texts[piece["index"]] = texts.get(piece["index"], "") + piece["text"]
        if copies is not None and piece["finish_reason"] is not None:
            choice["copies"] = await copies(piece["index"], texts[piece["index"]])
        chunk = {**head, "choices": [choice]}
        started.add(piece["index"])
        try:
            event = sse({**chunk, "usage": None} if include_usage else chunk)
        except ValueError as e:  # a number JSON cannot hold: the stream ends with an error, as a failure does
            yield sse({"error": {"message": f"the answer holds a value JSON cannot: {e}", "type": "server_error",
                                 "param": None, "code": None}})
            return
        yield event
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


async def collect(pieces, head, usage, n, shape=COMPLETION, copies=None):
    """The whole response: each choice's pieces joined. copies: None, or an async function of a choice's index
    and whole text whose value the choice carries as "copies"."""
    choices, texts = [shape.empty(i) for i in range(n)], [""] * n
    async for piece in pieces:
        if piece["error"] is not None:
            raise BadRequest(f"generation failed: {piece['error']}", status=500, kind="server_error")
        count(usage, piece)
        choice = choices[piece["index"]]
        shape.extend(choice, piece)
        texts[piece["index"]] += piece["text"]
        choice["finish_reason"] = piece["finish_reason"]
    for i, choice in enumerate(choices if copies is not None else []):
        choice["copies"] = await copies(i, texts[i])
    return {**head, "choices": choices, "usage": usage}


def fitted_usage(fits):
    """The usage's count of a request's characters outside the vocabulary (tokenizer.Fitted): those written in a
    form the vocabulary has, and those left out; nothing where every character was inside it."""
    usage = {"prompt_characters_converted": sum(len(f.converted) for f in fits),
             "prompt_characters_dropped": sum(len(f.dropped) for f in fits)}
    return usage if any(usage.values()) else {}


def count(usage, piece):
    if piece["finish_reason"] is not None:
        usage["completion_tokens"] += piece["tokens"]
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


def sse(obj):
    """One server-sent event; a value JSON cannot hold (NaN, infinity) is a ValueError, never sent."""
    return f"data: {json.dumps(obj, allow_nan=False)}\n\n"
