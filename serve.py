"""Serve a model over HTTP: OpenAI's completions API with continuous batching, and a playground page.

    python serve.py --out_dir=out-shakespeare-char-cpu
    python serve.py --init_from=gpt2 --port=8080 --max_batch=4

Open http://127.0.0.1:8000/ for the playground, or use any OpenAI client:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.completions.create(model="out-shakespeare-char-cpu", prompt="ROMEO:", max_tokens=50, temperature=0)

Endpoints: GET /v1/models; POST /v1/completions (prompt as text or token ids, max_tokens, temperature,
top_p, top_k, stop, seed, n, stream, logprobs, echo, as OpenAI's legacy completions); POST
/v1/chat/completions (messages and the same settings, as OpenAI's chat API; for a model fine-tuned on
conversations, docs/chat.md); POST /v1/attention (this server's own: each head's attention weights over
a text); GET /tokenizer_info, POST /tokenize, POST /detokenize (as vLLM's, which lm-evaluation-harness's
local-completions model reads: docs/serving.md). A request joins the running batch at the next step and
leaves it when it ends; the same seed gives the same text whatever else is being served.
logprobs are the model's own (temperature 1, before top-k and top-p), so greedy text has them too;
with echo the prompt's tokens have theirs, each given the tokens before it (prompt_logprobs).
With "copies": true (this server's extension) each choice carries the spans it copied from the
training text (docs/copies.md). Only requests addressed to this server's own names, with JSON bodies
as application/json, and with --api_key=KEY only those carrying Authorization: Bearer KEY, are
served (Guard; docs/serving.md).
This file is the HTTP app; OpenAI's protocol (reading requests, shaping answers and events) is
nanogpt/openai_api.py.
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import asyncio
import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
import uuid
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from configurator import parse_args, report_overrides
from nanogpt.copies import Training
from nanogpt.device import Device, Dtype, autocast, resolve_device, resolve_dtype
from nanogpt.engine import Engine, QueueFull, Sequence, Task
from nanogpt.errors import UserError
from nanogpt.generate import sample_seed
from nanogpt.memory import check_fits, kv_cache_bytes
from nanogpt.openai_api import (CHAT, COMPLETION, BadRequest, Choice, check_answer_size, check_names,
                                collect, echo_logprobs, echoed_first, error_body, events, fitted_usage, floor, is_ids,
                                json_object, parse_chat, parse_completion, parse_messages, typed)
from nanogpt.program import run_main
from nanogpt.source import Source, load_trained
from nanogpt.tokenizer import ChatTokenizer
from nanogpt.tracing import Recorder

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nanogpt", "playground.html")
MAX_BODY_BYTES = 1 << 20  # a request's JSON; a longer prompt would not fit any block_size anyway
LOGITS_MAX_VALUES = 1 << 25  # logits one forward of prompt_logprobs holds (windows x block_size x vocabulary)
# tokens one forward of prompt_logprobs reads (whole windows, at least one): a scoring step between two decode
# steps then costs about what a prefill does, so the sequences being decoded keep their pace
SCORE_TOKENS = 1024
ATTENTION_MAX_VALUES = 1 << 22  # weights one /v1/attention answer holds (layers x heads x tokens^2): about 30 MB
DISCONNECT_POLL_S = 0.25  # while a request waits for tokens, how often it checks that its client is still there
# lm-eval asks /tokenize for this text to learn whether the server tokenizes (utils.check_remote_tokenizer_support)
# and takes an error for "no": a char model without these letters answers it with no tokens, any other text
# outside its vocabulary with a 400
REMOTE_TOKENIZER_PROBE = "test"


@dataclass
class ServeConfig(Source, Device, Dtype):
    host: str = "127.0.0.1"  # this machine only; 0.0.0.0 serves every network the machine is on
    port: int = 8000
    max_batch: int = 8  # sequences decoded together: the KV cache holds this many
    max_queue: int = 64  # sequences that may wait for a free slot; beyond, requests get 429
    max_tokens: int = 4096  # the most tokens one request may ask for (past block_size the context shifts)
    api_key: str | None = None  # clients must send Authorization: Bearer KEY (the playground asks for it)

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.port < 1 << 16:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key == "":
            raise ValueError("api_key is empty; give a key clients must send, or leave it out to need none")
        if min(self.max_batch, self.max_queue, self.max_tokens) < 1:
            raise ValueError(f"max_batch ({self.max_batch}), max_queue ({self.max_queue}) and max_tokens "
                             f"({self.max_tokens}) must be at least 1")


async def server_error(request, e):
    """An error no route expected, as OpenAI's error object (500) rather than a text page (uvicorn logs it)."""
    return error_response(BadRequest(f"the server failed: {type(e).__name__}: {e}"[:500], status=500,
                                     kind="server_error"))


async def unknown_route(request, e):
    """A path or method this server does not serve, as OpenAI's error object (404, 405)."""
    return error_response(BadRequest(f"{request.method} {request.url.path} is not served here ({e.detail}); this "
                                     f"server serves GET /v1/models, POST /v1/completions, POST /v1/chat/completions, "
                                     f"POST /v1/attention, GET /tokenizer_info, POST /tokenize, POST /detokenize "
                                     f"and the playground at /", status=e.status_code))


def error_response(e):
    return JSONResponse(error_body(e), status_code=e.status)


class Guard:
    """Refuses, before any route runs, what a web page elsewhere could send to a server on this machine.

    A browser lets any page POST to 127.0.0.1, and DNS rebinding lets a page read the answers of a host
    name that it points at 127.0.0.1: so the Host header must name this server (localhost, 127.0.0.1,
    [::1], the --host it is bound to, 0.0.0.0 or [::] when that is all interfaces, or the address the
    request came in on), with its port or none (a reverse proxy forwarding its $host sends none), else
    403. Such a page's Host is the page's own name, which is none of these.
    With an api_key every request but GET / (the page, which holds no secret) must carry
    Authorization: Bearer KEY, else 401. (Bodies must be application/json: read_json.)
    """

    def __init__(self, app, api_key=None, host="127.0.0.1"):
        self.app, self.api_key = app, api_key
        self.names = {"localhost", "127.0.0.1", "[::1]", bracketed(host).lower()}

    async def __call__(self, scope, receive, send):
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is not None:
            return await error_response(refusal)(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, scope):
        headers, (address, port) = Headers(scope=scope), scope.get("server") or (None, None)
        host = headers.get("host", "")
        name, _, at = host.rpartition(":") if not host.endswith("]") and ":" in host else (host, "", None)
        if name.lower() not in self.names | {bracketed(address)} or at not in (None, str(port)):
            return BadRequest(f"Host {host[:100]!r} is not this server's name: it answers to "
                              f"{', '.join(sorted(self.names))} (on port {port}, or with no port), so that web "
                              f"pages elsewhere cannot drive it (docs/serving.md)", status=403)
        if self.api_key is None or (scope["method"], scope["path"]) == ("GET", "/"):
            return None
        sent = headers.get("authorization", "").encode("latin-1")  # the header's own bytes
        if not secrets.compare_digest(sent, f"Bearer {self.api_key}".encode()):
            return BadRequest("a missing or wrong API key: send the server's --api_key as Authorization: Bearer KEY "
                              "(the openai client's api_key)", status=401, code="invalid_api_key")
        return None


def bracketed(address):
    """An address as a Host header writes it: IPv6 in brackets."""
    return f"[{address}]" if address and ":" in address else address


# --- the service --------------------------------------------------------------------------------------

class Service:
    """A model and its tokenizer behind the HTTP endpoints; the engine thread runs while the app does."""

    def __init__(self, model, tokenizer, name, device, dtype, max_batch=8, max_queue=64, max_tokens=4096,
                 api_key=None, host="127.0.0.1", dataset=None):
        self.model, self.tokenizer, self.name, self.device, self.dtype = model, tokenizer, name, device, dtype
        self.max_tokens, self.api_key, self.host = max_tokens, api_key, host
        self.dataset = dataset  # the directory of the training text, where "copies" are looked for (or None)
        self.training, self.training_lock = None, threading.Lock()  # its index, opened by the first request asking
        self.engine = Engine(model, max_batch, max_queue, device, autocast(device, dtype))
        self.texts = {}
        with open(PAGE, encoding="utf-8") as f:
            self.page = f.read()

    @classmethod
    def load(cls, cfg):
        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
        model, tokenizer, dataset = load_trained(cfg, device)
        check_fits(kv_cache_bytes(model.config, cfg.max_batch, model.transformer.wte.weight.element_size()), device,
                   f"a KV cache of {cfg.max_batch} sequences", "lower max_batch")
        name = cfg.init_from if cfg.init_from != "resume" else os.path.basename(os.path.abspath(cfg.out_dir))
        return cls(model, tokenizer, name, device, dtype, cfg.max_batch, cfg.max_queue, cfg.max_tokens, cfg.api_key,
                   cfg.host, dataset)

    def app(self):
        @asynccontextmanager
        async def lifespan(app):
            thread = threading.Thread(target=self.engine.run, name="engine", daemon=True)
            thread.start()
            try:
                yield
            finally:
                self.engine.stop()
                await asyncio.to_thread(thread.join)

        routes = [Route("/", lambda request: HTMLResponse(self.page)),
                  Route("/v1/models", self.models),
                  Route("/v1/models/{model:path}", self.model_info),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/attention", self.attention, methods=["POST"]),
                  Route("/tokenizer_info", self.tokenizer_info),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"])]
        return Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(Guard, self.api_key, self.host)],
                         exception_handlers={BadRequest: lambda request, e: error_response(e),
                                             HTTPException: unknown_route, Exception: server_error})

    def token_text(self, token):
        """A token's text alone (a byte-level BPE token that is part of a character shows as U+FFFD)."""
        if token not in self.texts:
            decoder = self.tokenizer.decoder()
            self.texts[token] = decoder.feed(token) + decoder.flush()
        return self.texts[token]

    def fit(self, text, fits, role_names=False):
        """text in the vocabulary's characters (tokenizer.CharTokenizer.fit: converted, or left out; never a 400);
        its Fitted is appended to fits, which the response's usage counts (fitted_usage). role_names: a chat
        model's role-token names stay as they are (a completions prompt: encode_text reads them)."""
        chat = role_names and isinstance(self.tokenizer, ChatTokenizer)
        fits.append(self.tokenizer.fit(text, role_names=True) if chat else self.tokenizer.fit(text))
        return fits[-1].text

    def encode(self, prompt):
        """The prompt's token ids. The model reads the last block_size of them; past that, as text grows,
        the context shifts (engine.Engine.prefill). A chat model's role tokens written as their names
        are those tokens, as /tokenize reads them."""
        try:
            ids = self.encode_text(prompt) or ([self.tokenizer.eot] if self.tokenizer.eot is not None else [])
        except UserError as e:
            raise BadRequest(str(e), "prompt") from None
        if not ids:
            raise BadRequest("the prompt is empty; give some text to continue", "prompt")
        return ids

    def encode_text(self, text):
        """text's token ids; for a chat model, the role tokens' names in it are the role tokens
        (ChatTokenizer.encode_with_role_names), so that the text /tokenizer_info's chat_template writes tokenizes
        as ChatTokenizer.render places it. (A chat request's messages never do: render.)"""
        if isinstance(self.tokenizer, ChatTokenizer):
            return self.tokenizer.encode_with_role_names(text)
        return self.tokenizer.encode(text)

    def prompt_ids(self, prompt):
        """A prompt's token ids: a text encoded, or ids given, each checked against the vocabulary."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        if not prompt:
            raise BadRequest("a prompt is an empty list of token ids; give at least one token", "prompt")
        return self.check_ids(prompt, "prompt")

    def check_ids(self, ids, param):
        vocab = min(self.tokenizer.vocab_size, self.model.config.vocab_size)  # ids the model reads and text shows
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise BadRequest(f"{param} has token id {bad}, outside the vocabulary [0, {vocab})", param)
        return ids

    def model_card(self):
        return {"id": self.name, "object": "model", "created": 0, "owned_by": "nanogpt",
                "block_size": self.model.config.block_size, "chat": isinstance(self.tokenizer, ChatTokenizer),
                "copies": self.dataset is not None}  # requests may ask for "copies" (docs/copies.md)

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model_info(self, request):
        """GET /v1/models/{id}: the model's card (the SDKs' models.retrieve), 404 for a name not served."""
        check_names({"model": request.path_params["model"]}, self.name, {"model"}, {})
        return JSONResponse(self.model_card())

    async def completions(self, request):
        req = parse_completion(await read_json(request), self.name)
        fits = []
        prompts = [self.fit(p, fits, role_names=True) if isinstance(p, str) else p for p in req.prompts]  # echo: read
        prompt_ids = [self.prompt_ids(p) for p in prompts]
        texts = [p if isinstance(p, str) else self.tokenizer.decode(ids) for p, ids in zip(prompts, prompt_ids)]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.name}
        return await self.answer(request, req, prompt_ids, texts, head, (), COMPLETION, texts if req.echo else None,
                                 fits)

    async def chat_completions(self, request):
        if not isinstance(self.tokenizer, ChatTokenizer):
            raise BadRequest(f"{self.name} has no chat template (it was not fine-tuned on conversations: "
                             f"docs/chat.md); use /v1/completions", "model")
        req = parse_chat(await read_json(request), self.name, min(self.max_tokens, self.model.config.block_size))
        fits = []
        ids = self.chat_ids([{**m, "content": self.fit(m["content"], fits)} for m in req.prompts[0]])
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name}
        return await self.answer(request, req, [ids], [""], head, self.tokenizer.answer_stops, CHAT, fits=fits)

    async def answer(self, request, req, prompt_ids, prompt_texts, head, stop_ids, shape, echoes=None, fits=()):
        """Decode each prompt n times in the engine's batch; the response, whole or streamed, in shape's format.
        prompt_texts: each prompt's text, where text offsets (logprobs', copies') count from ("" for a chat).
        echoes: None, or each prompt's text, the first piece of its choices; with logprobs, the engine scores
        the prompts as a Task that waits in its queue and holds a slot as a sequence does. fits: the Fitted of each
        text of the request, whose characters converted or left out the usage counts and the console notes."""
        if req.logit_bias:
            self.check_ids(list(req.logit_bias), "logit_bias")
        if req.max_tokens > self.max_tokens:
            raise BadRequest(f"max_tokens is {req.max_tokens}, beyond this server's limit of {self.max_tokens} (its "
                             f"--max_tokens); ask for fewer", "max_tokens")
        check_answer_size(req, list(map(len, prompt_ids)))
        copies = await self.copies_finder(prompt_texts, req.n, req.echo) if req.copies else None  # before any work
        scoring = echoes is not None and req.logprobs is not None
        if len(prompt_ids) * req.n * (req.max_tokens > 0) + scoring > self.engine.max_queue:
            raise BadRequest(f"{len(prompt_ids)} prompts x n={req.n} is more sequences than the server queues "
                             f"({self.engine.max_queue}); send fewer at once", "n")
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def post(piece):  # called on the engine's thread
            loop.call_soon_threadsafe(queue.put_nowait, piece)
        works = []
        if scoring:
            works.append(Task(self.prompt_logprobs(prompt_ids, req.logprobs), lambda result, error: post(
                {"index": None, "echoes": result, "error": error, "finish_reason": "scored"})))
        for p, (chars, ids) in enumerate(zip(map(len, prompt_texts), prompt_ids)):
            for i in range(req.n * (req.max_tokens > 0)):  # max_tokens 0 (echo alone): nothing to decode
                sink = Choice(p * req.n + i, self.tokenizer, req.stops, chars, req.logprobs is not None,
                              self.token_text, post, stop_ids, with_chosen=shape is COMPLETION)
                generator = torch.Generator(device=self.device).manual_seed(sample_seed(req.seed, i))
                works.append(Sequence(ids, req.max_tokens, sink, req.temperature, req.top_k, req.top_p, generator,
                                      req.logprobs, **req.penalties()))
        try:
            self.engine.submit(works)
        except QueueFull as e:
            raise BadRequest(f"the server is busy: {e}", status=429, kind="server_busy") from None
        usage = {"prompt_tokens": sum(map(len, prompt_ids)), "completion_tokens": 0, "total_tokens": 0,
                 **fitted_usage(fits)}
        for note in [f.note(f"{head['id']}: text {i}") for i, f in enumerate(fits) if f.note()]:
            print(note, file=sys.stderr)
        pieces = arrivals(request, queue, works)
        if echoes is not None:
            pieces = echoed_first(pieces, echoes, req.n, req.max_tokens == 0,
                                  (lambda scores: asyncio.to_thread(self.echo_results, prompt_ids, scores))
                                  if scoring else None)
        if req.stream:
            return StreamingResponse(events(pieces, head, usage, req.include_usage, shape, copies),
                                     media_type="text/event-stream")
        answer = await collect(pieces, head, usage, len(prompt_ids) * req.n, shape, copies)
        return Response(await asyncio.to_thread(json_bytes, answer), media_type="application/json")

    async def copies_finder(self, prompt_texts, n, echo):
        """The async function of a choice's index and text that gives its "copies" (Copies.as_dict): the spans of
        its prompt and text found verbatim in the training text that reach into the text, their offsets counted
        from the start of the prompt (as logprobs' text_offset), and the share of the generated characters they
        cover. The search runs on a thread of its own once a choice has ended, off the engine's thread."""
        training = await asyncio.to_thread(self.training_index)

        def find(i, text):
            prompt = prompt_texts[i // n]
            whole = text if echo else prompt + text  # an echoed choice's text begins with its prompt
            return training.find(whole, start=len(prompt)).as_dict()
        return lambda i, text: asyncio.to_thread(find, i, text)

    def training_index(self):
        """The Training where copies are looked for, opened (and its index built if missing) on first use; a
        BadRequest where the model names no training text, a server_error where its index cannot be used."""
        if self.dataset is None:
            raise BadRequest(f"{self.name} names no dataset it was trained on (a pretrained model), so there is no "
                             f"training text to find copies in; leave copies out", "copies")
        with self.training_lock:  # one build of a missing index, however many requests ask at once
            if self.training is None:
                try:
                    self.training = Training(self.dataset)
                except UserError as e:
                    raise BadRequest(f"copies cannot be looked for: {e}", "copies", status=500,
                                     kind="server_error") from None
        return self.training

    def prompt_logprobs(self, prompts, k):
        """Each prompt's echo logprobs (OpenAI's legacy format): its tokens, each one's log-probability
        given the tokens before it (the first has none) and the top k there (and the token itself, as
        OpenAI's), and their text offsets. A generator for an engine Task: each next() is one forward, and
        its value (StopIteration's) the list; a prompt sent twice is scored once.

        The targets (tokens 1..L-1) are cut into windows of block_size counted back from the last one,
        each scored by one forward over the block_size tokens before it (fewer in the first window): the
        last block_size tokens get what a scorer that keeps the last block_size tokens of the context
        gives them. Windows run several to a forward (at most SCORE_TOKENS tokens and LOGITS_MAX_VALUES
        logits). The lists are built from the scores by echo_results, off the engine's thread."""
        distinct = list(dict.fromkeys(map(tuple, prompts)))
        block, vocab = self.model.config.block_size, self.model.config.vocab_size
        windows = [(p, max(1, end - block), end) for p, ids in enumerate(distinct)
                   for end in range(len(ids), 1, -block)]  # (prompt, first target, end of targets)
        scores = [[(None, None)] + [None] * (len(ids) - 1) for ids in distinct]
        rows = max(1, min(LOGITS_MAX_VALUES // (block * vocab), SCORE_TOKENS // block))
        for g in range(0, len(windows), rows):
            group = windows[g:g + rows]
            x = torch.zeros(len(group), max(end - start for _, start, end in group), dtype=torch.long)
            for row, (p, start, end) in enumerate(group):  # right padding: a causal model ignores it
                x[row, :end - start] = torch.tensor(distinct[p][start - 1:end - 1])
            with torch.no_grad(), autocast(self.device, self.dtype):  # the engine holds its lock around next()
                logits, _ = self.model(x.to(self.device))
            if (logits.isnan() | logits.isposinf()).any():
                raise ValueError(f"the model's logits are not finite (NaN or inf): its numbers overflowed in "
                                 f"{logits.dtype}; a wider --dtype (float32) may help")
            logp = torch.log_softmax(logits.float(), dim=-1)  # (rows, T, V)
            best = torch.topk(logp, min(k, logp.size(-1)), dim=-1)
            for row, (p, start, end) in enumerate(group):
                target = distinct[p][start:end]
                picked = logp[row, :end - start].gather(1, torch.tensor(target, device=logp.device)[:, None])
                top = zip(best.indices[row, :end - start].tolist(), best.values[row, :end - start].tolist())
                scores[p][start:end] = [(floor(lp), {self.token_text(i): floor(v) for i, v in [*zip(*t), (j, lp)]})
                                        for j, lp, t in zip(target, picked[:, 0].tolist(), top)]
            yield
        return dict(zip(distinct, scores))

    def echo_results(self, prompts, scores):
        """Each prompt's echo logprobs from prompt_logprobs' scores of the distinct prompts."""
        echoes = {ids: echo_logprobs(self.tokenizer, ids, s) for ids, s in scores.items()}
        return [echoes[tuple(ids)] for ids in prompts]

    async def tokenizer_info(self, request):
        """As vLLM's: what lm-eval's RemoteTokenizer reads (eos_token, and a chat model's chat_template)."""
        eot = self.tokenizer.eot
        eos = self.token_text(eot) if eot is not None else None
        stoi = getattr(self.tokenizer, "stoi", {})
        info = {"tokenizer_class": self.tokenizer.kind, "eos_token": eos,
                "bos_token": eos if eos is not None else ("\n" if "\n" in stoi else None),
                "pad_token": None, "model_max_length": self.model.config.block_size}
        if isinstance(self.tokenizer, ChatTokenizer):
            info["chat_template"] = self.tokenizer.chat_template()
        return JSONResponse(info)

    async def tokenize(self, request):
        """As vLLM's: a text's token ids (a chat model's role-token names read as the role tokens), or a chat's:
        "messages" (vLLM's chat form) or a prompt that is a list of messages (what lm-eval's remote tokenizer
        sends with --apply_chat_template) give the ids /v1/chat/completions would prompt the model with."""
        body = await read_json(request)
        check_names(body, self.name, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"},
                    {})
        typed(body, "add_special_tokens", bool, False, "true or false")  # none are added either way
        reply = typed(body, "add_generation_prompt", bool, True, "true or false")
        messages = body.get("messages", body.get("prompt") if isinstance(body.get("prompt"), list) else None)
        if messages is not None:
            ids = self.chat_ids(parse_messages(messages), reply)
            return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.model.config.block_size})
        prompt = typed(body, "prompt", str, None, "a string")
        if prompt is None:
            raise BadRequest("prompt is required: the text to tokenize", "prompt")
        try:
            ids = self.encode_text(prompt)
        except UserError as e:
            if prompt == REMOTE_TOKENIZER_PROBE:  # a model whose characters are not Latin: say it tokenizes
                ids = []
            else:
                raise BadRequest(str(e), "prompt") from None
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.model.config.block_size})

    def chat_ids(self, messages, reply=True):
        """The ids of a conversation as the chat template places them (ChatTokenizer.render)."""
        if not isinstance(self.tokenizer, ChatTokenizer):
            raise BadRequest(f"{self.name} has no chat template (it was not fine-tuned on conversations: "
                             f"docs/chat.md); send a prompt", "messages")
        try:
            return self.tokenizer.render(messages, reply=reply)[0]
        except UserError as e:
            raise BadRequest(str(e), "messages") from None

    async def detokenize(self, request):
        body = await read_json(request)
        check_names(body, self.name, {"model", "tokens"}, {})
        ids = body.get("tokens")
        if not is_ids(ids):
            raise BadRequest("tokens must be a list of token ids", "tokens")
        return JSONResponse({"prompt": self.tokenizer.decode(self.check_ids(ids, "tokens"))})

    async def attention(self, request):
        body = await read_json(request)
        check_names(body, self.name, {"model", "prompt", "messages", "layer"}, {})
        prompt = typed(body, "prompt", str, None, "a string")
        if (prompt is None) == (body.get("messages") is None):
            raise BadRequest("give prompt (the text whose attention to show) or, for a chat model, messages "
                             "(the conversation, as the chat API takes it)", "prompt")
        c = self.model.config
        layer = typed(body, "layer", int, None, "an integer")
        if layer is not None and not 0 <= layer < c.n_layer:
            raise BadRequest(f"layer must be in [0, {c.n_layer - 1}], got {layer}", "layer")
        ids = (self.encode(self.fit(prompt, [])) if prompt is not None
               else self.chat_ids(parse_messages(body["messages"]), reply=False))[-c.block_size:]  # what the model reads
        layers = list(range(c.n_layer)) if layer is None else [layer]
        if len(layers) * c.n_head * len(ids) ** 2 > ATTENTION_MAX_VALUES:
            raise BadRequest(f"{len(layers)} layers x {c.n_head} heads x {len(ids)}^2 tokens is more weights than one "
                             f"answer holds ({ATTENTION_MAX_VALUES:,}); ask for one layer or a shorter text", "prompt")
        weights = await asyncio.to_thread(self.attention_weights, ids, layers)
        decoder = self.tokenizer.decoder()
        return JSONResponse({"model": self.name, "tokens": [decoder.feed(i) for i in ids],
                             "layers": [{"layer": l, "heads": w} for l, w in zip(layers, weights)]})

    def attention_weights(self, ids, layers):
        """Each layer's attention weights (heads, T, T) as lists, recorded by tracing.Recorder between engine steps."""
        with self.engine.lock, ExitStack() as stack, torch.no_grad(), autocast(self.device, self.dtype):
            recorders = [stack.enter_context(Recorder(self.model, layer)) for layer in layers]
            self.model(torch.tensor([ids], device=self.device))
        return [rec.stages["attention weights"][0].float().mul(1e4).round().div(1e4).tolist() for rec in recorders]


def json_bytes(obj):
    """obj as JSONResponse writes it (a ValueError for NaN or infinity); a long answer is written off the event
    loop, which meanwhile serves the other clients."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


async def read_json(request):
    """The request's JSON object, sent as application/json (a web page cannot send that to another site
    without the server's consent, which this server never gives); at most MAX_BODY_BYTES are read."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise BadRequest(f"the body's Content-Type is {media or 'missing'!r}; send JSON as application/json",
                         status=415)
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise BadRequest(f"the request body is over {MAX_BODY_BYTES:,} bytes", status=413)
    except ClientDisconnect:  # nothing went wrong here: one line in the log, and no answer anyone reads
        print(f"note: a client went away before its request to {request.url.path} arrived whole", file=sys.stderr)
        raise BadRequest("the request's body was cut short: the client went away") from None
    return json_object(body)


async def chained(first, pieces):
    """The pieces in first, then those of the async iterator pieces."""
    for piece in first:
        yield piece
    async for piece in pieces:
        yield piece


async def arrivals(request, queue, seqs):
    """The pieces of a request's choices as they come, until each has ended. A client that goes away,
    or stops reading, cancels the request's sequences: their slots are free at the engine's next step."""
    ended, checked = 0, time.monotonic()
    try:
        while ended < len(seqs):
            try:
                piece = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                piece = None
            if time.monotonic() - checked >= DISCONNECT_POLL_S:  # also while tokens keep coming
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            if piece is None:
                continue
            ended += piece["finish_reason"] is not None
            yield piece
    finally:
        for seq in seqs:
            seq.cancel()


@contextmanager
def running(app, host="127.0.0.1", port=0):
    """Within: app served by uvicorn on a thread of this process (port 0: a free one); yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()


ALL_INTERFACES = ("0.0.0.0", "::")


def local_name(host):
    """The address a client on this machine reaches a server bound to host at: for all interfaces, the loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, bracketed(host))


def listen(host, port):
    """A socket listening on host:port (port 0: a free one); a UserError naming --port or --host if it cannot be had."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise UserError(f"--host={host} is not an address of this machine ({e.strerror}); use 127.0.0.1, or "
                        f"0.0.0.0 to serve every network") from None
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port a past run left in TIME_WAIT is free
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is in use (another server?); pass another --port, or stop what "
                            f"holds it") from None
        raise UserError(f"cannot serve on {host}:{port} ({e.strerror}); pass another --port or --host") from None
    return sock


def main(argv):
    cfg, overrides = parse_args(ServeConfig, argv)
    report_overrides(overrides, ServeConfig())
    sock = listen(cfg.host, cfg.port)  # before loading the model: a busy port fails at once
    service = Service.load(cfg)
    base = f"http://{local_name(cfg.host)}:{sock.getsockname()[1]}"
    everywhere = (f" (listening on all interfaces: other machines use this one's address instead of "
                  f"{local_name(cfg.host)})" if cfg.host in ALL_INTERFACES else "")
    print(f"serving {service.name} on {base}/ (the playground) and {base}/v1 (OpenAI's completions API){everywhere}; "
          f"Ctrl-C stops", file=sys.stderr)
    uvicorn.Server(uvicorn.Config(service.app(), log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    run_main(main)
