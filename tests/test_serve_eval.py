"""serve.py for lm-evaluation-harness: token-id prompts, echo with the prompt's logprobs, the tokenizer
endpoints, and the real lm_eval CLI (local-completions) run against the real server."""
import asyncio
import json

import numpy as np
import pytest
import torch

from conftest import CORPUS, run_script
from nanogpt.tokenizer import GPT2BPE, CharTokenizer, ChatTokenizer
from reference import next_token_log_probs

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from nanogpt.openai_api import parse_chat  # noqa: E402
from serve import Service  # noqa: E402
from test_serve import CHARS, alone, out_dir, server  # noqa: E402,F401  (the same tiny checkpoint and server)


def reference_echo(model, ids, block):
    """Each token's log-probability given the tokens before it, in windows of block targets counted back from
    the last token (docs/serving.md); None for the first. Also the argmax at each position."""
    out, best = [None] * len(ids), [None] * len(ids)
    end = len(ids)
    while end > 1:
        start = max(1, end - block)
        lp = next_token_log_probs(model, ids[start - 1:end - 1])
        for t in range(start, end):
            out[t], best[t] = lp[t - start, ids[t]], int(lp[t - start].argmax())
        end = start
    return out, best


def complete(url, **body):
    r = httpx.post(url + "/v1/completions", json={"model": "out-tiny", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def check_echo(choice, service, ids, text, generated):
    """choice's echo: the prompt's text first, its tokens' logprobs as the reference, then `generated` more."""
    lp = choice["logprobs"]
    want, best = reference_echo(service.model, ids, service.model.config.block_size)
    assert choice["text"].startswith(text) and len(lp["tokens"]) == len(ids) + generated
    assert lp["tokens"][:len(ids)] == [CHARS[i] for i in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    np.testing.assert_allclose(lp["token_logprobs"][1:len(ids)], want[1:], rtol=1e-5, atol=1e-4)
    assert [max(top, key=top.get) for top in lp["top_logprobs"][1:len(ids)]] == [CHARS[i] for i in best[1:]]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert "".join(lp["tokens"]) == choice["text"]


def test_echo_gives_the_prompts_logprobs_as_the_models_forward(server):
    """A token-id prompt and a text prompt in one request, as lm-eval sends them (echo, logprobs 1, one
    token): the prompt's tokens first, the first with no logprob, each later one the model's own."""
    url, service = server
    text = "First Citizen:\nYou are all"
    ids = service.tokenizer.encode("All:\nSpeak, speak.")
    r = complete(url, prompt=[ids, ids], max_tokens=1, temperature=0, logprobs=1, echo=True, seed=1234)
    check_echo(r["choices"][0], service, ids, "All:\nSpeak, speak.", 1)
    assert r["choices"][1] == {**r["choices"][0], "index": 1}
    r = complete(url, prompt=text, max_tokens=3, temperature=0, logprobs=2, echo=True)
    (choice,) = r["choices"]
    check_echo(choice, service, service.tokenizer.encode(text), text, 3)
    assert choice["text"] == text + alone(service, text, 3)
    assert r["usage"] == {"prompt_tokens": len(text), "completion_tokens": 3, "total_tokens": len(text) + 3}


def test_echo_of_a_prompt_past_block_size_ends_its_last_window_at_the_last_token(server):
    """150 tokens, block_size 64: the last 64 tokens are scored from the 64 before each window's end, as a
    scorer that keeps the last block_size tokens of the context; the others by earlier windows."""
    url, service = server
    ids = service.tokenizer.encode(CORPUS[:150])
    r = complete(url, prompt=ids, max_tokens=0, logprobs=1, echo=True)
    check_echo(r["choices"][0], service, ids, CORPUS[:150], 0)
    last = next_token_log_probs(service.model, ids[-65:-1])[np.arange(64), ids[-64:]]
    np.testing.assert_allclose(r["choices"][0]["logprobs"]["token_logprobs"][-64:], last, rtol=1e-5, atol=1e-4)


def test_echo_with_max_tokens_0_is_the_prompt_alone(server):
    url, service = server
    r = complete(url, prompt=["All:", "Speak"], max_tokens=0, echo=True, n=2)
    assert [(c["index"], c["text"], c["logprobs"], c["finish_reason"]) for c in r["choices"]] == [
        (0, "All:", None, "length"), (1, "All:", None, "length"), (2, "Speak", None, "length"),
        (3, "Speak", None, "length")]
    assert r["usage"] == {"prompt_tokens": 9, "completion_tokens": 0, "total_tokens": 9}
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "All:", "max_tokens": 0, "echo": True,
                                                             "logprobs": 0, "stream": True}) as s:
        events = s.read().decode().split("\n\n")
    (chunk,) = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert chunk["choices"][0]["text"] == "All:" and chunk["choices"][0]["logprobs"]["text_offset"] == [0, 1, 2, 3]
    assert events[-2:] == ["data: [DONE]", ""]


def test_tokenize_and_detokenize_round_trip_as_vllms(server):
    url, service = server
    info = httpx.get(url + "/tokenizer_info").json()
    assert info == {"tokenizer_class": "char", "eos_token": None, "bos_token": "\n", "pad_token": None,
                    "model_max_length": 64}
    r = httpx.post(url + "/tokenize", json={"prompt": "All:\nSpeak", "add_special_tokens": False}).json()
    assert r == {"tokens": [CHARS.index(c) for c in "All:\nSpeak"], "count": 10, "max_model_len": 64}
    assert httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "All:\nSpeak"}
    bad = httpx.post(url + "/detokenize", json={"tokens": [1, 99]})
    assert bad.status_code == 400 and "token id 99, outside the vocabulary [0, 34)" in bad.json()["error"]["message"]
    bad = httpx.post(url + "/tokenize", json={"prompt": "ü"})
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    assert "POST /tokenize" in httpx.get(url + "/v2/nothing").json()["error"]["message"]


def test_tokenizer_info_names_end_of_text_and_a_chat_models_template(server):
    """GPT-2's BPE ends texts with <|endoftext|>; a chat model's template writes what render() places."""
    import jinja2
    model = server[1].model

    def info(tokenizer):
        return asyncio.run(Service(model, tokenizer, "m", "cpu", torch.float32).tokenizer_info(None)).body
    assert json.loads(info(GPT2BPE()))["eos_token"] == "<|endoftext|>"
    chat = ChatTokenizer(CharTokenizer(CHARS))
    got = json.loads(info(chat))
    assert got["eos_token"] == "<|end|>" and got["chat_template"] == chat.chat_template()
    messages = [{"role": "system", "content": "Speak."}, {"role": "user", "content": "All:"},
                {"role": "assistant", "content": "hear me"}, {"role": "user", "content": "You"}]
    template = jinja2.Environment().from_string(got["chat_template"])
    assert template.render(messages=messages, add_generation_prompt=True) == chat.decode(chat.render(messages)[0])
    assert template.render(messages=messages) == chat.decode(chat.render(messages, reply=False)[0])


# --- the lm_eval CLI ----------------------------------------------------------------------------------

MC_DOCS = [{"context": "First Citizen:\n", "choices": ["Before", "You are", "All:"], "label": 0},
           {"context": "All:\nSpeak, ", "choices": ["speak.", "hear", "resolved"], "label": 1},
           {"context": CORPUS[:90], "choices": [CORPUS[90:100], "speak, speak", "famish?"], "label": 0}]


ROLL_DOCS = [{"text": "All:\nSpeak, speak."}, {"text": "First Citizen:\nYou are all resolved"}, {"text": CORPUS[:150]}]


def write_tasks(directory, gen_docs, until):
    """tiny_mc (MC_DOCS), tiny_gen (gen_docs, sampled at temperature 2 until `until`) and tiny_roll
    (ROLL_DOCS' perplexity), over local JSONL."""
    directory.mkdir()
    (directory / "tiny_roll.jsonl").write_text("".join(json.dumps(d) + "\n" for d in ROLL_DOCS))
    (directory / "tiny_roll.yaml").write_text(
        f"task: tiny_roll\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {directory}/tiny_roll.jsonl\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n")
    for name, docs, kind in (("tiny_mc", MC_DOCS, "multiple_choice"), ("tiny_gen", gen_docs, "generate_until")):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (directory / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {directory / name}.jsonl\n"
            f"test_split: test\noutput_type: {kind}\ndoc_to_text: '{{{{context}}}}'\n" + (
                "doc_to_choice: '{{choices}}'\ndoc_to_target: label\ntarget_delimiter: ''\n"
                "metric_list:\n  - metric: acc\n" if kind == "multiple_choice" else
                f"doc_to_target: '{{{{answer}}}}'\ngeneration_kwargs:\n  until: [{json.dumps(until)}]\n"
                "  max_gen_toks: 12\n  temperature: 2.0\nmetric_list:\n  - metric: exact_match\n"))


def loglikelihood(model, tok, context, continuation, block):
    """The continuation's summed log-probability, the context left-truncated to block_size; the context's
    trailing whitespace moved to the continuation, as lm-eval's TemplateLM splits a pair."""
    moved = len(context) - len(context.rstrip())
    context, continuation = tok.encode(context[:len(context) - moved]), tok.encode(context[len(context) - moved:]
                                                                                  + continuation)
    ids = (context + continuation)[-(block + 1):]
    lp = next_token_log_probs(model, ids[:-1])
    return float(sum(lp[len(ids) - 1 - len(continuation) + i, t] for i, t in enumerate(continuation)))


def test_lm_eval_cli_scores_a_multiple_choice_and_a_generate_until_task(server, tmp_path):
    """python -m lm_eval --model local-completions with base_url and model only: acc and each choice's
    log-likelihood equal a forward of the model (and harness.NanoGPT, eval.py's model); exact_match
    counts the text sampled for lm-eval's seed, cut at the stop."""
    url, service = server
    model, tok, block = service.model, service.tokenizer, service.model.config.block_size
    prompts, until = ("All:\n", "You are all "), "S"
    texts = [alone(service, p, 12, temperature=2.0, seed=1234).split(until)[0] for p in prompts]  # lm-eval's seed
    write_tasks(tmp_path / "tasks", [{"context": prompts[0], "answer": texts[0]},
                                     {"context": prompts[1], "answer": texts[1] + "x"}], until)
    run = run_script(["-m", "lm_eval", "--model", "local-completions", "--model_args",
                      f"base_url={url}/v1/completions,model=out-tiny", "--tasks", "tiny_mc,tiny_gen",
                      "--include_path", str(tmp_path / "tasks"), "--output_path", str(tmp_path / "out"),
                      "--log_samples"], env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Auto-detected remote tokenizer support" in run.stderr  # our /tokenizer_info and /tokenize, not HF's
    (results,) = tmp_path.glob("out/*/results_*.json")
    scores = json.loads(results.read_text())["results"]
    (samples,) = tmp_path.glob("out/*/samples_tiny_mc_*.jsonl")
    got = {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in map(json.loads, samples.open())}
    want = [[loglikelihood(model, tok, d["context"], c, block) for c in d["choices"]] for d in MC_DOCS]
    for i, lls in enumerate(want):
        np.testing.assert_allclose(got[i], lls, rtol=1e-5, atol=1e-4)
    assert scores["tiny_mc"]["acc,none"] == np.mean([np.argmax(w) == d["label"] for w, d in zip(want, MC_DOCS)])
    (samples,) = tmp_path.glob("out/*/samples_tiny_gen_*.jsonl")
    assert [s["resps"] for s in map(json.loads, samples.read_text().splitlines())] == [[[t]] for t in texts]
    assert scores["tiny_gen"]["exact_match,none"] == 0.5 and all(0 < len(t) < 12 for t in texts)
    from lm_eval.api.instance import Instance

    from nanogpt.harness import NanoGPT
    requests = [Instance("loglikelihood", d, (d["context"], c), i) for d in MC_DOCS for i, c in enumerate(d["choices"])]
    harness = [ll for ll, _ in NanoGPT(model, tok).loglikelihood(requests)]
    np.testing.assert_allclose(harness, [g for i in range(len(MC_DOCS)) for g in got[i]], rtol=1e-5, atol=1e-4)


def test_lm_eval_scores_perplexity_as_eval_py_with_the_newline_as_prefix_token(server, tmp_path):
    """lm_eval.simple_evaluate with local-completions on a loglikelihood_rolling task: each text's log-likelihood
    after the prefix token is harness.NanoGPT's (eval.py's), a text of 150 tokens too. A char model's prefix,
    the newline, is id 0, which lm-eval takes for none (bos_token_id or eos_token_id): the run names it;
    max_length=block_size+2 makes lm-eval's windows block_size tokens, as eval.py's (it windows at
    max_length - 2: one token for context, one for generation)."""
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    from nanogpt.harness import NanoGPT
    url, service = server
    assert service.tokenizer.stoi["\n"] == 0 and len(ROLL_DOCS[-1]["text"]) > 2 * service.model.config.block_size
    write_tasks(tmp_path / "tasks", [], "S")
    results = lm_eval.simple_evaluate(
        model="local-completions", model_args=f"base_url={url}/v1/completions,model=out-tiny,custom_prefix_token_id=0,"
                                              f"max_length={service.model.config.block_size + 2}",
        tasks=["tiny_roll"], task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        log_samples=True)
    got = [float(s["resps"][0][0]) for s in sorted(results["samples"]["tiny_roll"], key=lambda s: s["doc_id"])]
    want = NanoGPT(service.model, service.tokenizer).loglikelihood_rolling(
        [Instance("loglikelihood_rolling", d, (d["text"],), 0) for d in ROLL_DOCS])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_lm_eval_finds_the_remote_tokenizer_of_a_model_without_latin_letters():
    """lm-eval probes /tokenize with "test" and takes an error for "this server does not tokenize": a Tang char
    model answers that probe with no tokens; other text outside its vocabulary is still a 400."""
    from lm_eval.utils import check_remote_tokenizer_support

    from model import GPT, GPTConfig
    from serve import running
    chars = list("春江花月夜，。\n")
    model = GPT(GPTConfig(block_size=16, vocab_size=len(chars), n_layer=1, n_head=2, n_embd=16)).eval()
    service = Service(model, CharTokenizer(chars), "tang", torch.device("cpu"), torch.float32, max_batch=1, max_queue=1)
    with running(service.app()) as url:
        assert check_remote_tokenizer_support(url + "/v1/completions")
        assert httpx.post(url + "/tokenize", json={"prompt": "test"}).json()["tokens"] == []
        bad = httpx.post(url + "/tokenize", json={"prompt": "tests"})
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
        assert httpx.post(url + "/tokenize", json={"prompt": "春江"}).json()["tokens"] == [0, 1]


# --- lm-eval's local-chat-completions -----------------------------------------------------------------

def write_chat_task(directory, docs, shot, stop):
    """tiny_chat: generate_until over docs, one few-shot example (shot) from its own split, sampled at
    temperature 2 for at most 8 tokens until `stop`."""
    directory.mkdir()
    for split, rows in (("test", docs), ("train", [shot])):
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in rows))
    (directory / "tiny_chat.yaml").write_text(
        f"task: tiny_chat\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {directory}/test.jsonl\n"
        f"    train: {directory}/train.jsonl\ntest_split: test\nfewshot_split: train\noutput_type: generate_until\n"
        "doc_to_text: '{{context}}'\ndoc_to_target: '{{answer}}'\ngeneration_kwargs:\n"
        f"  until: [{json.dumps(stop)}]\n  max_gen_toks: 8\n  do_sample: true\n  temperature: 2.0\n"
        "metric_list:\n  - metric: exact_match\n")


def sampled_reply(model, tok, messages, n, seed):
    """What the model samples at temperature 2 after the template's prompt (generate.py, uncached, sample 0's
    generator for the seed), up to <|end|>, as text."""
    from nanogpt.generate import generate
    from sample import sample_seed
    ids = tok.render(messages)[0]
    out = generate(model, torch.tensor([ids]), n, temperature=2.0, use_cache=False,
                   generator=torch.Generator().manual_seed(sample_seed(seed, 0)))[0, len(ids):].tolist()
    return tok.decode(out[:out.index(tok.end)] if tok.end in out else out)


def test_lm_eval_local_chat_completions_runs_a_generate_until_task(tmp_path, monkeypatch):
    """lm_eval's local-chat-completions with apply_chat_template, a system instruction and a multi-turn
    few-shot example: it sends OpenAI chat messages, max_tokens, temperature, stop and its seed, and reads back
    the text the model samples after ChatTokenizer.render's prompt, cut at the stop."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import serve
    from model import GPTConfig
    from test_generate import sharp
    tok = ChatTokenizer(CharTokenizer(CHARS))
    model = sharp(GPTConfig(block_size=64, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32)).float().eval()
    system, shot = "Speak.", {"context": "All:", "answer": "Resolved."}
    docs = [{"context": "First Citizen:"}, {"context": "You are all"}]
    turns = [[{"role": "system", "content": system}, {"role": "user", "content": shot["context"]},
              {"role": "assistant", "content": shot["answer"]}, {"role": "user", "content": d["context"]}]
             for d in docs]
    full = [sampled_reply(model, tok, m, 8, seed=1234) for m in turns]  # lm-eval's seed
    stop = next(c for c in full[0][2:] if c.isalpha())
    texts = [t.split(stop)[0] for t in full]
    docs = [{**docs[0], "answer": texts[0]}, {**docs[1], "answer": texts[1] + "x"}]
    write_chat_task(tmp_path / "tasks", docs, shot, stop)
    sent = []
    monkeypatch.setattr(serve, "parse_chat", lambda body, *a: sent.append(body) or parse_chat(body, *a))
    service = Service(model, tok, "tiny-chat", torch.device("cpu"), torch.float32, max_batch=2, max_queue=4)
    with serve.running(service.app()) as url:
        results = lm_eval.simple_evaluate(
            model="local-chat-completions", model_args={"base_url": f"{url}/v1/chat/completions",
                                                        "model": "tiny-chat"},
            tasks=["tiny_chat"], task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
            apply_chat_template=True, system_instruction=system, num_fewshot=1, log_samples=True)
    assert sorted((json.dumps(b["messages"]), b) for b in sent) == sorted(
        (json.dumps(m), {"messages": m, "model": "tiny-chat", "max_tokens": 8, "temperature": 2.0, "stop": [stop],
                         "seed": 1234}) for m in turns)
    samples = sorted(results["samples"]["tiny_chat"], key=lambda s: s["doc_id"])
    assert [s["resps"] for s in samples] == [[[t]] for t in texts]
    assert results["results"]["tiny_chat"]["exact_match,none"] == 0.5 and len(texts[0]) < len(full[0])


def test_chat_token_limits_are_read_as_openais():
    """max_completion_tokens (openai-chat-completions sends it) wins over max_tokens (local-chat-completions
    sends that); 0 of either is refused naming the one sent, as OpenAI refuses it."""
    from nanogpt.openai_api import BadRequest
    messages = [{"role": "user", "content": "All:"}]
    assert parse_chat({"messages": messages, "max_completion_tokens": 5, "max_tokens": 9}, "m", 64).max_tokens == 5
    assert parse_chat({"messages": messages, "max_tokens": 9}, "m", 64).max_tokens == 9
    assert parse_chat({"messages": messages}, "m", 64).max_tokens == 64
    for name in ("max_completion_tokens", "max_tokens"):
        with pytest.raises(BadRequest, match=f"^{name} must be at least 1") as e:
            parse_chat({"messages": messages, name: 0, "model": "m"}, "m", 64)
        assert e.value.param == name


def test_lm_eval_perplexity_without_the_prefix_id_is_told_to_name_it(server, caplog):
    """lm-eval reads the newline's id 0 as no prefix token and sends null in its place: the 400 it logs says
    to add custom_prefix_token_id=0."""
    import requests
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    url, _ = server
    lm = LocalCompletionsAPI(base_url=url + "/v1/completions", model="out-tiny", max_retries=1)
    assert lm.prefix_token_id is None
    with pytest.raises(requests.HTTPError, match="400"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("All:\nSpeak",), 0)], disable_tqdm=True)
    assert "add custom_prefix_token_id=0 to --model_args" in caplog.text
    bad = httpx.post(url + "/v1/completions", json={"prompt": [[None, 1, 2]], "max_tokens": 0, "echo": True})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    bad = httpx.post(url + "/v1/completions", json={"prompt": [[1, None]], "max_tokens": 0, "echo": True})
    assert bad.json()["error"]["message"].startswith("prompt must be a string, a list of token ids")


def test_lm_eval_local_completions_with_the_chat_template_runs_on_a_chat_model(tmp_path):
    """lm_eval --model local-completions --apply_chat_template: it renders /tokenizer_info's template itself,
    tokenizes the text through /tokenize (role tokens written as their names are the role tokens) and sends
    the ids: the prompt is ChatTokenizer.render's, and the answers the ones local-chat-completions gets."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import RemoteTokenizer

    from model import GPTConfig
    from serve import running
    from test_generate import sharp
    tok = ChatTokenizer(CharTokenizer(CHARS))
    model = sharp(GPTConfig(block_size=64, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32)).float().eval()
    system, shot = "Speak.", {"context": "All:", "answer": "Resolved."}
    docs = [{"context": "First Citizen:"}, {"context": "You are all"}]
    turns = [[{"role": "system", "content": system}, {"role": "user", "content": shot["context"]},
              {"role": "assistant", "content": shot["answer"]}, {"role": "user", "content": d["context"]}]
             for d in docs]
    full = [sampled_reply(model, tok, m, 8, seed=1234) for m in turns]
    stop = next(c for c in full[0][2:] if c.isalpha())
    texts = [t.split(stop)[0] for t in full]
    write_chat_task(tmp_path / "tasks", [{**docs[0], "answer": texts[0]}, {**docs[1], "answer": texts[1] + "x"}],
                    shot, stop)
    service = Service(model, tok, "tiny-chat", torch.device("cpu"), torch.float32, max_batch=2, max_queue=4)
    with running(service.app()) as url:
        remote = RemoteTokenizer(url + "/v1/completions")
        assert remote.encode(remote.apply_chat_template(turns[0])) == tok.render(turns[0])[0]
        assert remote.eos_token_id == tok.end
        results = lm_eval.simple_evaluate(
            model="local-completions", model_args={"base_url": f"{url}/v1/completions", "model": "tiny-chat",
                                                   "tokenizer_backend": "remote"},
            tasks=["tiny_chat"], task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
            apply_chat_template=True, system_instruction=system, num_fewshot=1,
            log_samples=False)  # lm-eval's sample log hashes the prompt as text, and this one is a chat
    assert results["results"]["tiny_chat"]["exact_match,none"] == 0.5  # doc 0's answer matched, doc 1's cannot
