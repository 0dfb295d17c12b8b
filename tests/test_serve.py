"""serve.py: the real server on a free local port, spoken to with the openai package and a headless Chromium."""
import concurrent.futures
import json
import os
import shutil
import socket
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from conftest import CORPUS, run_script
from model import GPTConfig
from nanogpt.checkpoint import model_args
from nanogpt.generate import generate, sample_seed
from test_generate import attention_weights, sharp

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from serve import ServeConfig, Service, running  # noqa: E402  (needs starlette)

CHROMIUM = "/usr/bin/chromium"
CHARS = sorted(set(CORPUS))


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    """A tiny random char-level checkpoint (sharp: a token at a wrong position changes what follows)."""
    config = GPTConfig(block_size=64, vocab_size=len(CHARS), n_layer=2, n_head=4, n_embd=32, pos_emb="rope")
    model = sharp(config).float()
    out = tmp_path_factory.mktemp("serve") / "out-tiny"
    out.mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config),
                "tokenizer": {"tokenizer": "char", "chars": CHARS}}, out / "ckpt.pt")
    return out


@pytest.fixture(scope="module")
def server(out_dir):
    """(base URL, Service) of a server run by uvicorn in a thread: 3 slots, at most 4 sequences waiting."""
    service = Service.load(ServeConfig(out_dir=str(out_dir), device="cpu", max_batch=3, max_queue=4))
    with running(service.app()) as url:
        yield url, service


API_KEY = "sekret-key"


@pytest.fixture(scope="module")
def keyed_server(out_dir):
    """(base URL, Service) of a server started with --api_key."""
    service = Service.load(ServeConfig(out_dir=str(out_dir), device="cpu", max_batch=2, max_queue=2, api_key=API_KEY))
    with running(service.app()) as url:
        yield url, service


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=30)


def alone(service, prompt, max_tokens, temperature=0.0, seed=None, top_k=None, use_cache=False):
    """The text generate decodes for prompt alone (sample i=0's generator for a seed); uncached by default,
    which equals the cached path while prompt and text fit in block_size. It holds the engine's lock, as
    every user of the served model must: a forward between the hooks of a /v1/attention answer would be
    recorded in its place."""
    ids = service.tokenizer.encode(prompt)
    generator = torch.Generator().manual_seed(sample_seed(seed, 0)) if seed is not None else None
    with service.engine.lock:
        out = generate(service.model, torch.tensor([ids]), max_tokens, temperature, top_k=top_k,
                       generator=generator, use_cache=use_cache)
    return service.tokenizer.decode(out[0, len(ids):].tolist())


def test_models_lists_the_checkpoint(client):
    (model,) = client.models.list().data
    assert model.id == "out-tiny" and model.block_size == 64


def test_greedy_completion_equals_the_uncached_path(server, client):
    r = client.completions.create(model="out-tiny", prompt="First Citizen:\n", max_tokens=40, temperature=0)
    assert r.choices[0].text == alone(server[1], "First Citizen:\n", 40)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (15, 40, 55)


def test_seeded_samples_equal_sample_py(out_dir, client):
    """n samples with a seed: sample.py's samples for that seed (sample i from sample_seed(seed, i))."""
    r = client.completions.create(model="out-tiny", prompt="All:", max_tokens=30, temperature=1.2, seed=7, n=2,
                                  extra_body={"top_k": 10})
    run = run_script(["sample.py", f"--out_dir={out_dir}", "--start=All:", "--max_new_tokens=30", "--temperature=1.2",
                      "--top_k=10", "--seed=7", "--num_samples=2", "--device=cpu"])
    assert run.returncode == 0, run.stderr
    samples = [s[len("All:"):-1] for s in run.stdout.split("---------------\n")[:2]]  # prompt + text + "\n"
    assert [c.text for c in r.choices] == samples and samples[0] != samples[1]


def test_a_top_p_below_float32s_range_is_greedy(server, client):
    """top_p=1e-300 is inside (0, 1] but 0 in float32: the most likely token still survives, every step."""
    r = client.completions.create(model="out-tiny", prompt="All:", max_tokens=30, temperature=1.0, top_p=1e-300,
                                  seed=5)
    assert r.choices[0].text == alone(server[1], "All:", 30)


def test_stop_ends_the_text_before_the_stop(server, client):
    free = alone(server[1], "All:", 40)
    stop = free[5:7]
    r = client.completions.create(model="out-tiny", prompt="All:", max_tokens=40, temperature=0, stop=[stop, "QQ"])
    assert r.choices[0].text == free[:free.index(stop)] and r.choices[0].finish_reason == "stop"


def test_streamed_text_and_logprobs_equal_the_whole_response(server, client):
    args = dict(model="out-tiny", prompt=["All:", "Speak"], max_tokens=25, temperature=0.9, seed=3, n=2, logprobs=3)
    args["stop"] = client.completions.create(**args).choices[0].text[8:10]  # a stop that ends the first choice
    whole = client.completions.create(**args)
    parts = {}
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks[:-1]:
        (c,) = chunk.choices
        text, lp, reason = parts.get(c.index, ("", {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                                      "text_offset": []}, None))
        assert (c.logprobs is None) == (c.text == ""), c  # a chunk of no text has logprobs null, as OpenAI's
        parts[c.index] = (text + c.text, {k: v + (getattr(c.logprobs, k) if c.logprobs else []) for k, v in lp.items()},
                          c.finish_reason or reason)
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert len(chunks) > 8  # pieces, not one answer
    for c in whole.choices:
        text, lp, reason = parts[c.index]
        assert (text, reason) == (c.text, c.finish_reason)
        assert lp == c.logprobs.model_dump()
        assert "".join(lp["tokens"]).startswith(c.text)  # the tokens make the text (and a stop's start, if any)
        prompt = args["prompt"][c.index // 2]
        assert lp["text_offset"] == [len(prompt) + len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
        assert all(len(top) >= 3 and lp["tokens"][i] in top or lp["token_logprobs"][i] < min(top.values())
                   for i, top in enumerate(lp["top_logprobs"]))
    assert whole.choices[0].finish_reason == "stop" and len(whole.choices[0].text) <= 8



def test_logprobs_are_the_models_full_distribution_whatever_the_sampling_settings(server, client):
    """Sampled at temperature 0.7 through top_k 3 and top_p 0.6: each token's logprob and the top 5 are those
    of the model's log-softmax at temperature 1 over the whole vocabulary (a numpy log-softmax of its own
    forward over prompt and text), so the 4th and 5th are finite although sampling could not pick them."""
    from reference import next_token_log_probs
    service = server[1]
    r = client.completions.create(model="out-tiny", prompt="All:", max_tokens=20, temperature=0.7, top_p=0.6, seed=3,
                                  logprobs=5, extra_body={"top_k": 3})
    lp = r.choices[0].logprobs
    prompt, text = service.tokenizer.encode("All:"), service.tokenizer.encode(r.choices[0].text)
    assert lp.tokens == list(r.choices[0].text) and len(text) == 20
    logp = next_token_log_probs(service.model, prompt + text[:-1])[len(prompt) - 1:]  # (20, V): before each token
    for i, (token, row) in enumerate(zip(text, logp)):
        assert lp.token_logprobs[i] == pytest.approx(row[token], abs=1e-4), i
        best = np.argsort(-row)[:5]
        assert lp.top_logprobs[i] == pytest.approx({CHARS[j]: row[j] for j in best}, abs=1e-4), i
    assert max(row[np.argsort(-row)[3:]].max() - row.max() for row in logp) > -5  # mass outside the top 3

def test_the_stream_is_server_sent_events_ending_with_done(server):
    with httpx.stream("POST", server[0] + "/v1/completions", json={"prompt": "All:", "max_tokens": 5, "stream": True}) as r:
        body = r.read().decode()
    assert r.headers["content-type"].startswith("text/event-stream")
    events = body.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: {") for e in events[:-2])


@pytest.fixture
def slow_steps(server, monkeypatch):
    """Each decode step of the server's engine takes at least 20 ms, so that a client can act between steps;
    the list of each step's number of sequences."""
    engine, sizes = server[1].engine, []
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda seqs: sizes.append(len(seqs)) or time.sleep(0.02) or step(seqs))
    return sizes


def test_concurrent_requests_give_the_texts_they_give_alone(server, slow_steps):
    """More requests than slots, greedy and seeded, prompts and lengths different: each joins and leaves
    the running batch, and its text is the one decoded alone."""
    url, service = server
    asks = [("First", 30, 0.0, None), ("All:\nS", 20, 1.0, 11), ("Before we", 41, 0.0, None), ("R", 12, 0.7, 5),
            ("You are all", 33, 1.3, 8), ("hear me", 25, 0.0, None), ("Speak", 17, 1.0, 9)]

    def ask(a):
        prompt, n, temperature, seed = a
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=5, timeout=60)
        return c.completions.create(model="out-tiny", prompt=prompt, max_tokens=n, temperature=temperature,
                                    seed=seed, extra_body={"top_k": 20}).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        texts = list(pool.map(ask, asks))
    assert texts == [alone(service, p, n, t, s, top_k=20) for p, n, t, s in asks]
    assert max(slow_steps) == 3 and min(slow_steps) < 3  # every slot busy, then fewer: requests joined and left


def shifted(service, prompt, max_tokens, temperature, seed):
    """generate's cached path (its context shift past block_size): the text and each token's log-probability."""
    ids, logits = service.tokenizer.encode(prompt), []
    generator = torch.Generator().manual_seed(sample_seed(seed, 0)) if seed is not None else None
    with service.engine.lock:  # as alone()
        out = generate(service.model, torch.tensor([ids]), max_tokens, temperature, generator=generator,
                       on_step=lambda report: logits.append(report["logits"][0].clone()))
    tokens = out[0, len(ids):].tolist()
    logprobs = [torch.log_softmax(l.float(), -1)[t].item() for l, t in zip(logits, tokens)]
    return service.tokenizer.decode(tokens), logprobs


def test_text_past_block_size_shifts_the_context_as_sample_py_does(server, slow_steps):
    """A prompt longer than the 64-token context, and text that runs past it, decoded together: each the
    text and log-probabilities of generate's cached path (the last half of the window recomputed when full)."""
    url, service = server
    asks = [(CORPUS[:70], 90, 0.0, None), ("All:", 150, 1.0, 4), (CORPUS[100:140], 70, 0.8, 6)]

    def ask(a):
        prompt, n, temperature, seed = a
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=5, timeout=60)
        r = c.completions.create(model="out-tiny", prompt=prompt, max_tokens=n, temperature=temperature, seed=seed,
                                 logprobs=0)
        return r.choices[0].text, r.choices[0].logprobs.token_logprobs, r.usage.prompt_tokens

    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        results = list(pool.map(ask, asks))
    assert [r[2] for r in results] == [70, 4, 40]  # the whole prompt is counted; the model reads its last 64
    for (text, logprobs, _), ask_ in zip(results, asks):
        want_text, want_logprobs = shifted(service, *ask_)
        assert text == want_text
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-5, rtol=0)
    assert max(slow_steps) == 3


@pytest.mark.parametrize("args, status, param, match", [
    (dict(temperature=-1), 400, "temperature", "temperature must be a finite number >= 0"),
    (dict(top_p=1.5), 400, "top_p", "top_p must be in"),
    (dict(extra_body={"top_k": 0}), 400, "top_k", "top_k must be >= 1"),
    (dict(max_tokens=5000), 400, "max_tokens", "max_tokens is 5000, beyond this server's limit of 4096"),
    (dict(logprobs=50), 400, "logprobs", "logprobs must be in"),
    (dict(n=5), 400, "n", "more sequences than the server queues"),
    (dict(stop=["a", ""]), 400, "stop", "non-empty"),
    (dict(stop=list("abcde")), 400, "stop", "stop has 5 sequences; at most 4 are taken"),
    (dict(stop=["a", "x" * 300_000]), 400, "stop", "stop has a sequence of 300,000 characters; at most 1,000"),
    (dict(seed=-1), 400, "seed", "seed must be in"),
    (dict(best_of=2), 400, "best_of", "not supported"),
    (dict(echo="yes"), 400, "echo", "echo must be true or false"),
    (dict(max_tokens=0), 400, "max_tokens", "at least 1 (0 with echo)"),
    (dict(prompt=[[3, 34]]), 400, "prompt", "prompt has token id 34, outside the vocabulary [0, 34)"),
    (dict(prompt=[3, True]), 400, "prompt", "a list of token ids, or a non-empty list of either"),
    (dict(prompt=[[]]), 400, "prompt", "empty list of token ids"),
    (dict(extra_body={"top_kk": 3}), 400, "top_kk", "unrecognized request argument: top_kk (did you mean 'top_k'?)"),
    (dict(max_tokens="many"), 400, "max_tokens", "max_tokens must be an integer"),
    (dict(temperature=10**400), 400, "temperature", "float range"),
    (dict(model="gpt-4"), 404, "model", "'gpt-4' is not served here"),
])
def test_bad_requests_get_openai_errors(client, args, status, param, match):
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(**{"model": "out-tiny", "prompt": "All:", "max_tokens": 5, **args})
    error = e.value.body
    assert e.value.status_code == status and error["param"] == param and match in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] in (None, "model_not_found")
    assert "\n" not in error["message"]
    assert client.completions.create(model="out-tiny", prompt="All:", max_tokens=3).choices[0].text  # still serving


@pytest.mark.parametrize("method, path, status", [("POST", "/v1/embeddings", 404), ("GET", "/v1/completions", 405)])
def test_routes_not_served_get_openai_errors_that_list_the_served_ones(server, method, path, status):
    r = httpx.request(method, server[0] + path)
    assert r.status_code == status and "POST /v1/completions" in r.json()["error"]["message"]


@pytest.mark.parametrize("body", [b"{prompt", b"[" * 200_000], ids=["broken", "nested-too-deep"])
def test_a_body_that_is_not_json_is_a_400(server, body):
    r = httpx.post(server[0] + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "All:\\ud800", "echo": true, "logprobs": 1, "max_tokens": 2}', "prompt"),
    (b'{"prompt": "All:", "\\ud800": 1}', "\\ud800"),
    (b'{"prompt": "All:", "logit_bias": {"' + b"9" * 5000 + b'": 1}}', "logit_bias")],
    ids=["surrogate-in-an-echoed-prompt", "surrogate-as-a-name", "logit-bias-key-of-5000-digits"])
def test_text_utf8_cannot_write_and_keys_int_cannot_read_are_a_400_not_a_500(server, body, param):
    r = httpx.post(server[0] + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def assert_openai_error(r, status, match, code=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and match in error["message"], error
    assert error["type"] == "invalid_request_error" and error["code"] == code


ASK = {"prompt": "All:", "max_tokens": 3}


@pytest.mark.parametrize("host", ["evil.example:{port}", "localhost.evil.example:{port}", "evil-localhost:{port}",
                                  "evil.localhost", "x127.0.0.1:{port}", "127.0.0.1:1", "0.0.0.0:{port}", ""])
def test_a_host_that_is_not_this_servers_is_refused(server, host):
    """DNS rebinding: a page's own name pointed at 127.0.0.1 sends its Host; neither page nor API is served to it.
    A name is this server's whole, never by its start or its end (evil-localhost)."""
    url = server[0]
    host = host.format(port=url.rsplit(":", 1)[1])
    for method, path, body in (("POST", "/v1/completions", ASK), ("GET", "/", None), ("GET", "/v1/models", None)):
        r = httpx.request(method, url + path, json=body, headers={"host": host})
        assert_openai_error(r, 403, "is not this server's name")


@pytest.mark.parametrize("host", ["localhost:{port}", "LOCALHOST:{port}", "127.0.0.1:{port}", "localhost",
                                  "127.0.0.1"])
def test_this_servers_own_names_are_served(server, host):
    r = httpx.get(server[0] + "/v1/models", headers={"host": host.format(port=server[0].rsplit(":", 1)[1])})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "out-tiny"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_body_not_sent_as_application_json_is_a_415(server, content_type):
    """A web page may POST text/plain (or a form) anywhere without asking: such bodies are not read."""
    headers = {"content-type": content_type} if content_type else {}
    for path in ("/v1/completions", "/v1/attention"):
        r = httpx.post(server[0] + path, content=json.dumps(ASK), headers=headers)
        assert_openai_error(r, 415, "send JSON as application/json")
    r = httpx.post(server[0] + "/v1/completions", content=json.dumps(ASK),
                   headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Bearer {API_KEY}x", API_KEY, f"Basic {API_KEY}"])
def test_without_the_api_key_the_api_is_a_401(keyed_server, authorization):
    headers = {"authorization": authorization} if authorization else {}
    for method, path, body in (("POST", "/v1/completions", ASK), ("GET", "/v1/models", None),
                               ("POST", "/v1/attention", {"prompt": "All:"})):
        r = httpx.request(method, keyed_server[0] + path, json=body, headers=headers)
        assert_openai_error(r, 401, "missing or wrong API key", "invalid_api_key")
        assert API_KEY not in r.text
    assert httpx.get(keyed_server[0] + "/").status_code == 200  # the page holds no secret: it asks for the key


def test_the_openai_client_with_the_api_key_is_served(keyed_server):
    url = keyed_server[0] + "/v1"
    good = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=30)
    r = good.completions.create(model="out-tiny", prompt="All:", max_tokens=20, temperature=0)
    assert r.choices[0].text == alone(keyed_server[1], "All:", 20)
    with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
        openai.OpenAI(base_url=url, api_key="none", max_retries=0).completions.create(model="out-tiny", prompt="A")


def wait_for(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_full_queue_gets_429_and_the_queued_requests_finish(server, client):
    url, service = server
    engine = service.engine
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with engine.lock:  # the engine stops at its next forward: one sequence prefilling, three waiting
            first = pool.submit(client.completions.create, model="out-tiny", prompt="All:", max_tokens=5, n=4)
            wait_for(lambda: engine.busy() == (1, 3), "the engine to take one sequence of four")
            with pytest.raises(openai.RateLimitError, match="busy"):
                client.completions.create(model="out-tiny", prompt="All:", max_tokens=5, n=2)
        assert [c.finish_reason for c in first.result().choices] == ["length"] * 4




def test_a_client_that_disconnects_mid_stream_frees_its_slot(server, slow_steps):
    url, service = server
    body = {"prompt": "All:", "max_tokens": 55, "stream": True, "temperature": 0}
    with httpx.stream("POST", url + "/v1/completions", json=body) as r:
        next(r.iter_lines())
        (seq,) = service.engine.active.values()
    wait_for(lambda: not service.engine.active, "the slot to be freed")
    assert seq.cancelled and seq.generated < 20  # 55 would take more than a second


def test_a_client_that_disconnects_while_waiting_for_a_whole_answer_frees_its_slot(server, slow_steps):
    url, service = server
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(url + "/v1/completions", json={"prompt": "All:", "max_tokens": 4000}, timeout=1.0)
    (seq,) = service.engine.active.values()
    wait_for(lambda: not service.engine.active, "the slot to be freed", timeout=5)
    assert seq.cancelled and seq.generated < 1000  # 4000 steps would take 80 s


def test_a_client_that_drops_mid_body_is_one_log_line(server, capfd):
    """A client gone before its body arrived is a note in the server's log, not a 40-line traceback."""
    import socket
    host, port = server[0].removeprefix("http://").rsplit(":", 1)
    capfd.readouterr()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: 1000\r\n\r\n{{\"prompt\": \"All".encode())
        time.sleep(0.2)
    logged = []
    wait_for(lambda: logged.extend(capfd.readouterr().err.splitlines()) or logged, "the server's log line")
    time.sleep(0.5)  # anything more it would write
    logged += capfd.readouterr().err.splitlines()
    assert logged == ["note: a client went away before its request to /v1/completions arrived whole"], logged
    assert httpx.post(server[0] + "/v1/completions", json=ASK).status_code == 200  # still serving


def test_the_attention_view_returns_each_heads_weights(server):
    r = httpx.post(server[0] + "/v1/attention", json={"prompt": "All: hear"})
    data = r.json()
    assert data["tokens"] == list("All: hear") and len(data["layers"]) == 2
    heads = torch.tensor(data["layers"][1]["heads"])  # (heads, T, T)
    assert heads.shape == (4, 9, 9)
    ids = torch.tensor([server[1].tokenizer.encode("All: hear")])
    expected = attention_weights(server[1].model, ids)[1][0]  # layer 1, through the manual path's hook
    torch.testing.assert_close(heads, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(heads.sum(-1), torch.ones(4, 9), atol=1e-3, rtol=0)
    assert heads.triu(1).abs().max() == 0  # causal: no weight on later tokens
    r = httpx.post(server[0] + "/v1/attention", json={"prompt": "All:", "layer": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "layer"


def test_serve_py_help_and_a_missing_checkpoint(tmp_path):
    run = run_script(["serve.py", "--help"])
    assert run.returncode == 0 and "--max_batch=8" in run.stdout and "--host='127.0.0.1'" in run.stdout
    run = run_script(["serve.py", f"--out_dir={tmp_path}", "--port=0"])
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("error: no checkpoint at")


def test_serve_py_on_a_busy_port_is_one_line_naming_port(out_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = run_script(["serve.py", f"--out_dir={out_dir}", f"--port={port}", "--device=cpu"], timeout=60)
    errors = [line for line in run.stderr.splitlines() if not line.startswith("override: ")]
    assert run.returncode == 2 and errors == [f"error: port {port} on 127.0.0.1 is in use (another server?); pass "
                                               f"another --port, or stop what holds it"], run.stderr


@contextmanager
def chromium_page(url, expected=()):
    """A headless Chromium's page at url. Its console then holds no warning or error (Chromium's own advice
    on the page, such as "[DOM] Password field is not contained in a form", included) but those containing
    one of the expected strings."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM) and not shutil.which("chromium"):
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    console = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"))
        page = browser.new_page()
        page.on("console", lambda message: console.append((message.type, message.text)))
        page.on("pageerror", lambda error: console.append(("error", str(error))))
        page.goto(url)
        yield page
        browser.close()
    bad = [f"{kind}: {text}" for kind, text in console if (kind in ("error", "warning") or text.startswith("[DOM]"))
           and not any(e in text for e in expected)]
    assert not bad, bad


@pytest.fixture
def page(server):
    with chromium_page(server[0] + "/") as page:
        yield page


def test_the_playground_streams_tokens_shaded_with_alternatives_and_attention(server, page, slow_steps):
    page.fill("#prompt", "All:")
    page.fill("#max_tokens", "30")
    page.fill("#temperature", "0")
    page.click("#generate")
    # tokens arrive while generation goes on
    page.wait_for_function("document.querySelectorAll('#output .tok').length > 2 && document.querySelector('#generate').disabled")
    page.wait_for_function("!document.querySelector('#generate').disabled")
    tokens = page.locator("#output .tok")
    assert tokens.count() == 30 and page.inner_text("#status").startswith("30 tokens")
    assert "".join(tokens.all_text_contents()) == alone(server[1], "All:", 30)
    assert tokens.first.evaluate("e => getComputedStyle(e).backgroundColor").startswith("rgba(255, 140, 0")
    tokens.nth(3).hover()
    tip = page.locator("#tip")
    assert tip.is_visible() and tip.locator("tr").count() >= 5 and "%" in tip.inner_text()
    assert tip.locator("tr.chosen").inner_text().startswith(f'"{tokens.nth(3).inner_text()}"'[:-1])
    att = page.locator("#attention .tok")
    att.nth(33).wait_for()
    assert att.count() == 34
    att.nth(33).hover()  # the last token: every token before it shaded by its weight
    shaded = att.evaluate_all("spans => spans.filter(s => s.style.background).length")
    assert shaded > 1


def test_the_playground_asks_for_the_api_key_and_then_generates(keyed_server):
    """The page is served without the key (it holds none); the API answers it only once the key is typed."""
    with chromium_page(keyed_server[0] + "/", expected=["status of 401"]) as page:  # the key, asked for
        page.wait_for_function("document.querySelector('#status').textContent.includes('needs its API key')")
        assert page.is_visible("#api_key") and page.inner_text("#model") == ""
        page.fill("#api_key", "wrong")
        page.press("#api_key", "Enter")  # a change event
        page.wait_for_function("document.querySelector('#status').textContent === 'wrong API key'")
        page.fill("#api_key", API_KEY)
        page.press("#api_key", "Enter")
        page.wait_for_function("document.querySelector('#model').textContent.startsWith('out-tiny')")
        page.fill("#prompt", "All:")
        page.fill("#max_tokens", "12")
        page.fill("#temperature", "0")
        page.click("#generate")
        page.wait_for_function("document.querySelector('#status').textContent.startsWith('12 tokens')")
        assert "".join(page.locator("#output .tok").all_text_contents()) == alone(keyed_server[1], "All:", 12)
        page.locator("#attention .tok").nth(15).wait_for()  # the attention view, through the key too


# --- what one request may cost (issue 31) --------------------------------------------------------------

ECHO = {"prompt": "All: hear me speak.", "max_tokens": 0, "echo": True, "logprobs": 1}


def test_echoed_prompt_scoring_waits_in_the_queue_and_holds_a_slot(server):
    """An echo with logprobs and max_tokens 0 decodes nothing, but scoring its prompt is the engine's work: it
    holds a slot while it runs and waits in the queue (max_queue=4) as sequences do, so one more is a 429."""
    url, service = server
    engine = service.engine
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with engine.lock:  # the engine stops at its next forward: the echo's scoring
            scoring = pool.submit(httpx.post, url + "/v1/completions", json=ECHO, timeout=30)
            wait_for(lambda: engine.busy() == (1, 0), "the echo to take a slot")
            four = pool.submit(httpx.post, url + "/v1/completions", json={**ASK, "n": 4}, timeout=30)
            wait_for(lambda: engine.busy() == (1, 4), "four sequences to wait")
            busy = httpx.post(url + "/v1/completions", json=ECHO)
            assert busy.status_code == 429 and "busy" in busy.json()["error"]["message"]
        echoed = scoring.result().json()["choices"][0]
        assert four.result().status_code == 200
    assert echoed["text"] == ECHO["prompt"] and echoed["finish_reason"] == "length"
    lp = echoed["logprobs"]
    assert lp["tokens"] == list(ECHO["prompt"]) and lp["token_logprobs"][0] is None
    wait_for(lambda: engine.busy() == (0, 0), "the engine to be idle")


def test_a_long_echo_is_scored_between_decode_steps_and_others_keep_being_served(server, monkeypatch):
    """A prompt of 200 windows, one forward each (each at least 20 ms here): a short request sent after it
    finishes while it is still being scored, and its scores are those of each window alone."""
    import serve
    url, service = server
    c = service.model.config
    monkeypatch.setattr(serve, "LOGITS_MAX_VALUES", c.block_size * c.vocab_size)  # one window to a forward
    work = service.engine.work
    monkeypatch.setattr(service.engine, "work", lambda tasks: time.sleep(0.02) or work(tasks))
    prompt = (CORPUS * 2)[:c.block_size * 200]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        big = pool.submit(httpx.post, url + "/v1/completions", json={**ECHO, "prompt": prompt, "logprobs": 0},
                          timeout=120)
        wait_for(lambda: service.engine.tasks, "the scoring to start")
        short = httpx.post(url + "/v1/completions", json={"prompt": "All:", "max_tokens": 3, "temperature": 0})
        assert not big.done() and short.json()["choices"][0]["text"] == alone(service, "All:", 3)
        lp = big.result().json()["choices"][0]["logprobs"]
    ids = service.tokenizer.encode(prompt)
    end = len(ids)  # the last window: its targets are the last block_size tokens, each given those before it
    x = torch.tensor([ids[end - c.block_size - 1:end - 1]])
    want = torch.log_softmax(service.model(x)[0][0].float(), -1)[torch.arange(c.block_size), ids[end - c.block_size:]]
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][-c.block_size:]), want, atol=1e-5, rtol=0)
    assert len(lp["token_logprobs"]) == len(ids) and all(len(top) == 1 for top in lp["top_logprobs"][1:])


def test_an_answer_too_big_to_build_is_refused_before_any_work(server, client):
    """n, echo and logprobs multiply: 4 choices x 15,000 echoed tokens x 21 alternatives would be a response of
    about 50 MB from a 15 KB request."""
    with pytest.raises(openai.BadRequestError, match="tokens and log-probabilities") as e:
        client.completions.create(model="out-tiny", prompt=(CORPUS * 3)[:15_000], max_tokens=0, echo=True, logprobs=20, n=4)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError, match="tokens and log-probabilities"):
        client.completions.create(model="out-tiny", prompt=(CORPUS * 9)[:60_000], max_tokens=1, echo=True, logprobs=20)


@pytest.fixture(scope="module")
def overflowing(out_dir):
    """A server whose model's logits overflow float32 (its output layer scaled by 1e38): NaN and inf."""
    service = Service.load(ServeConfig(out_dir=str(out_dir), device="cpu", max_batch=2, max_queue=4))
    with torch.no_grad():
        service.model.lm_head.weight.mul_(1e38)
    with running(service.app()) as url:
        yield url


def strict_json(text):
    """text as JSON, refusing NaN and Infinity (which Python's json reads, and JSON has not)."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("body", [dict(max_tokens=3, logprobs=2), dict(max_tokens=3),
                                  dict(max_tokens=0, echo=True, logprobs=2), dict(max_tokens=2, echo=True, logprobs=0)])
def test_overflowing_logits_are_openais_error_object_never_nan(overflowing, body):
    r = httpx.post(overflowing + "/v1/completions", json={"prompt": "All:", "temperature": 0, **body})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
    error = strict_json(r.text)["error"]
    assert error["type"] == "server_error" and "logits are not finite" in error["message"]
    with httpx.stream("POST", overflowing + "/v1/completions", json={"prompt": "All:", "temperature": 0,
                                                                     "stream": True, **body}) as r:
        events = r.read().decode().split("\n\n")
    data = [strict_json(e[len("data: "):]) for e in events if e.startswith("data: {")]
    assert "logits are not finite" in data[-1]["error"]["message"]


def test_the_attention_view_takes_only_its_own_arguments_for_this_model(server):
    url = server[0]
    r = httpx.post(url + "/v1/attention", json={"prompt": "All:", "layers": 1})
    assert_openai_error(r, 400, "unrecognized request argument: layers (did you mean 'layer'?)")
    r = httpx.post(url + "/v1/attention", json={"prompt": "All:", "model": "gpt-4"})
    assert_openai_error(r, 404, "'gpt-4' is not served here", "model_not_found")
    assert httpx.post(url + "/v1/attention", json={"prompt": "All:", "model": "out-tiny", "layer": 0}).status_code == 200


# --- as clients send it (issue 33) ---------------------------------------------------------------------

def test_models_retrieve_gives_the_models_card_and_404_for_another(client):
    model = client.models.retrieve("out-tiny")
    assert model.id == "out-tiny" and model.object == "model" and model.block_size == 64
    with pytest.raises(openai.NotFoundError, match="'gpt-4' is not served here"):
        client.models.retrieve("gpt-4")


def test_completion_top_logprobs_hold_the_chosen_token_as_openais(server, client):
    """Sampled at temperature 2, most tokens are not the most likely one: top_logprobs (logprobs=1) then hold
    two entries, the most likely and the chosen, as OpenAI's (up to logprobs + 1)."""
    r = client.completions.create(model="out-tiny", prompt="All:", max_tokens=30, temperature=2.0, seed=1,
                                  logprobs=1)
    lp = r.choices[0].logprobs
    assert all(tok in top and top[tok] == lp_ for tok, lp_, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    assert sum(len(top) == 2 for top in lp.top_logprobs) >= 5 and max(map(len, lp.top_logprobs)) == 2


def test_a_server_on_all_interfaces_prints_a_url_that_works(out_dir):
    """--host=0.0.0.0: the printed URL is the loopback's (0.0.0.0 is not an address to connect to), and the
    Host a client or a proxy sends for this machine is served; another name still gets 403."""
    import subprocess
    import sys

    from conftest import ROOT
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "serve.py"), f"--out_dir={out_dir}", "--host=0.0.0.0",
                             "--port=0", "--device=cpu"], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = next(line for line in proc.stderr if line.startswith("serving"))
        base = line.split(" and ")[1].split()[0]
        assert base.startswith("http://127.0.0.1:") and base.endswith("/v1") and "all interfaces" in line, line
        port = base.rsplit(":", 1)[1][:-len("/v1")]
        model = openai.OpenAI(base_url=base, api_key="none", max_retries=0).models.list().data[0]
        assert model.id == "out-tiny"
        for host, status in ((f"0.0.0.0:{port}", 200), ("localhost", 200), (f"evil.example:{port}", 403)):
            assert httpx.get(base + "/models", headers={"host": host}).status_code == status, host
    finally:
        proc.terminate()
        proc.wait(timeout=30)
