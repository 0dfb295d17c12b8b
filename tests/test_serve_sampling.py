"""serve.py's sampling: the same defaults and seeds as sample.py on a vocabulary past top_k's old 200, OpenAI's
penalties and logit_bias, and text outside the vocabulary answered, never refused."""
import pytest
import torch

from model import GPTConfig
from nanogpt.checkpoint import model_args
from nanogpt.generate import generate, sample_seed
from nanogpt.tokenizer import CHAT_TOKENS
from test_generate import sharp

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from serve import ServeConfig, Service, running  # noqa: E402

# 300 characters, more than the 200 that sample.py's top_k kept until #36: the Tang prompts' (traditional), and
# Hangul syllables, which have no simplified or traditional form
TANG = list("春夜\n李白，。藏頭詩：江花月") + [chr(0xAC00 + i) for i in range(286)]
LATIN = sorted(set("\n !',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))


def save(path, chars, chat=False, scale=1.0):
    vocab = len(chars) + (len(CHAT_TOKENS) if chat else 0)
    config = GPTConfig(block_size=64, vocab_size=vocab, n_layer=2, n_head=4, n_embd=32, pos_emb="rope")
    model = sharp(config, scale=scale, logit_scale=scale).float()
    meta = {"tokenizer": "char", "chars": list(chars)}
    if chat:
        meta.update(chat=list(CHAT_TOKENS), vocab_size=vocab)
    path.mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "tokenizer": meta},
               path / "ckpt.pt")
    return path


@pytest.fixture(scope="module")
def tang(tmp_path_factory):
    """(out_dir, base URL, Service, openai client) of a 300-character model with a wide distribution."""
    out = save(tmp_path_factory.mktemp("tang") / "out-tang", TANG, scale=1.0)
    service = Service.load(ServeConfig(out_dir=str(out), device="cpu", max_batch=2, max_queue=4))
    with running(service.app()) as url:
        yield out, url, service, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_a_seeded_request_gives_sample_pys_text_on_a_vocabulary_past_200(tang, capsys):
    """The request and sample.py leave top_k to their defaults, which are one (Sampling's: every token kept)."""
    import sample
    out, _, _, client = tang
    r = client.completions.create(model="out-tang", prompt="春夜\n李白\n", max_tokens=30, temperature=0.8, seed=1)
    sample.main([f"--out_dir={out}", "--start=春夜\n李白\n", "--max_new_tokens=30", "--seed=1", "--num_samples=1",
                 "--device=cpu"])
    printed = capsys.readouterr().out
    assert printed == "春夜\n李白\n" + r.choices[0].text + "\n---------------\n"
    assert len(set(r.choices[0].text)) > 10  # a wide distribution: top_k=200 would have changed the draws


def test_penalties_and_logit_bias_give_generates_text(tang):
    _, _, service, client = tang
    settings = dict(presence_penalty=1.2, frequency_penalty=0.7, logit_bias={"5": 3.0, "9": -100})
    ids = service.tokenizer.encode("春夜\n")
    for temperature, seed in ((0.0, None), (1.0, 3)):
        r = client.completions.create(model="out-tang", prompt="春夜\n", max_tokens=20, temperature=temperature,
                                      seed=seed, **settings)
        generator = torch.Generator().manual_seed(sample_seed(seed, 0)) if seed is not None else None
        want = generate(service.model, torch.tensor([ids]), 20, temperature, generator=generator, use_cache=False,
                        presence_penalty=1.2, frequency_penalty=0.7, logit_bias={5: 3.0, 9: -100.0})
        assert r.choices[0].text == service.tokenizer.decode(want[0, len(ids):].tolist())
        assert TANG[9] not in r.choices[0].text


@pytest.mark.parametrize("args, param, match", [
    (dict(presence_penalty=2.5), "presence_penalty", r"presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=-3), "frequency_penalty", r"frequency_penalty must be in [-2, 2]"),
    (dict(logit_bias={"7": 101}), "logit_bias", "logit_bias of token 7 is 101.0; a bias must be in [-100, 100]"),
    (dict(logit_bias={"x": 1}), "logit_bias", 'logit_bias has key "x"; its keys are token ids'),
    (dict(logit_bias={"7": "up"}), "logit_bias", "logit_bias of token 7 must be a number"),
    (dict(logit_bias={"300": 1}), "logit_bias", "logit_bias has token id 300, outside the vocabulary [0, 300)"),
])
def test_bad_penalties_and_biases_get_openais_error(tang, args, param, match):
    client = tang[3]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="out-tang", prompt="春", max_tokens=2, **args)
    assert e.value.body["param"] == param and match in e.value.body["message"]


def test_text_outside_the_vocabulary_is_answered_with_a_count(tmp_path, capsys):
    out = save(tmp_path / "out-latin", LATIN)
    service = Service.load(ServeConfig(out_dir=str(out), device="cpu", max_batch=1, max_queue=2))
    with running(service.app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        r = client.completions.create(model="out-latin", prompt="Café 2024 — ROMEO:", max_tokens=5, temperature=0,
                                      echo=True)
        assert r.choices[0].text.startswith("Cafe   ROMEO:")  # the text the model read
        assert (r.usage.prompt_characters_converted, r.usage.prompt_characters_dropped) == (1, 5)
        plain = client.completions.create(model="out-latin", prompt="ROMEO:", max_tokens=5, temperature=0)
        assert "prompt_characters_dropped" not in plain.usage.model_dump()
    assert "one character written in the vocabulary's form (é as e); 5 characters outside the vocabulary left " \
           "out ('2' '0' '4' '—')" in capsys.readouterr().err


def test_simplified_chinese_chats_with_a_tang_model(tmp_path):
    pytest.importorskip("opencc")
    out = save(tmp_path / "out-sft", TANG, chat=True)
    service = Service.load(ServeConfig(out_dir=str(out), device="cpu", max_batch=1, max_queue=2))
    with running(service.app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="out-sft", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "藏头诗：春江花月"}])
        assert r.choices[0].finish_reason in ("stop", "length")
        assert (r.usage.prompt_characters_converted, r.usage.prompt_characters_dropped) == (2, 0)  # 头 诗
        # the template's text as a completions prompt: its role-token names stay the role tokens
        r2 = client.completions.create(model="out-sft", max_tokens=4, temperature=0,
                                       prompt="<|user|>藏头诗：春江花月 ok<|end|><|assistant|>")
        assert r2.usage.prompt_tokens == r.usage.prompt_tokens and r2.choices[0].text == r.choices[0].message.content
        assert (r2.usage.prompt_characters_converted, r2.usage.prompt_characters_dropped) == (2, 3)
