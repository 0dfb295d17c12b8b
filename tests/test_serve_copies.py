"""serve.py's "copies" extension, through the openai client: a request that asks gets, with each choice, the spans
of its prompt and text found verbatim in the training text (against a brute-force search), whole or streamed; one
that does not gets OpenAI's shape unchanged; a wrong value, or a model with no training text, is a 400."""
import json

import pytest
import torch

from conftest import CORPUS
from model import GPTConfig
from nanogpt.generate import generate, sample_seed
from nanogpt.tokenizer import CharTokenizer, ChatTokenizer
from test_copies import brute_force_spans, char_dataset
from model import GPT

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from serve import Service, running  # noqa: E402  (needs starlette)

CHARS = sorted(set(CORPUS))
PROMPT, OTHER = "All:\n", "Speak, speak.\n"
N = 40  # tokens per answer
SEED = 7  # sampled at temperature 1: a random model's greedy text repeats a letter or two


def random_model(vocab_size, block_size=64):
    """A model of random weights (every one drawn wide): its samples are varied text."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=2, n_head=4, n_embd=32))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def sampled(model, ids, i=0, n=N, temperature=1.0):
    """The text of the server's sample i for a request with seed SEED (its generator), decoded alone."""
    generator = torch.Generator().manual_seed(sample_seed(SEED, i))
    out = generate(model, torch.tensor([ids]), n, temperature, generator=generator, use_cache=False)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL of /v1, the training text, {(prompt, i): sample i's text}) of a tiny random char model whose
    training text holds, after the corpus, the last 3 characters of PROMPT and of OTHER each with the first 30 of
    the model's samples 0 and 1 after it (copies that begin in the prompt; the last 10 are new)."""
    tok = CharTokenizer(CHARS)
    model = random_model(len(CHARS))
    texts = {(p, i): tok.decode(sampled(model, tok.encode(p), i)) for p in (PROMPT, OTHER) for i in (0, 1)}
    train = CORPUS + "".join(f"\n{p[-3:]}{text[:30]}" for (p, _), text in texts.items()) + "\n"
    folder = char_dataset(tmp_path_factory.mktemp("copies") / "data", train, chars=CHARS)
    service = Service(model, tok, "tiny", torch.device("cpu"), torch.float32, max_batch=2, max_queue=8, dataset=folder)
    with running(service.app()) as url:
        yield url + "/v1", train, texts


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0], api_key="none", max_retries=0, timeout=30)


def expected(prompt, text, train):
    """(spans as (start, end) from the start of the prompt, copied share of text) by brute force and by hand."""
    spans = [(a, b) for a, b in brute_force_spans(prompt + text, train) if b > len(prompt)]
    covered = {i for a, b in spans for i in range(max(a, len(prompt)), b)}
    return spans, len(covered) / len(text)


def found(copies):
    return [(s["start"], s["end"]) for s in copies["spans"]], copies["copied"]


@pytest.mark.parametrize("echo", [False, True])
def test_a_completion_asking_for_copies_gets_what_a_brute_force_search_finds(served, client, echo):
    """The span begins in the prompt: its offsets count from the prompt's start, echoed or not, and the share
    counts the generated characters alone (a bug that searched the text without its prompt, counted offsets
    from the text's start, or the share over prompt and text, fails)."""
    _, train, texts = served
    text = texts[PROMPT, 0]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=N, temperature=1, seed=SEED, echo=echo,
                                  extra_body={"copies": True})
    choice = r.choices[0]
    assert choice.text == (PROMPT if echo else "") + text
    spans, share = expected(PROMPT, text, train)
    assert spans and spans[0][0] < len(PROMPT)  # the data holds what the test is about
    assert found(choice.copies)[0] == spans and choice.copies["copied"] == pytest.approx(share, abs=1e-4)
    span = choice.copies["spans"][0]
    assert (span["text"], span["count"]) == ((PROMPT + text)[spans[0][0]:spans[0][1]], 1)
    assert choice.copies["longest"] == max(b - a for a, b in spans)


def test_streamed_copies_come_with_the_chunk_that_ends_each_choice(served, client):
    """Two prompts, n=2: each choice's last chunk carries the copies of its own prompt and text, the same as the
    whole response's, and no other chunk carries any (a choice searched after another's prompt, or given
    another's copies, fails: each prompt's copy begins in it)."""
    args = dict(model="tiny", prompt=[PROMPT, OTHER], max_tokens=N, temperature=1, seed=SEED, n=2,
                extra_body={"copies": True})
    whole = client.completions.create(**args)
    texts, ends = [""] * 4, {}
    for chunk in client.completions.create(stream=True, **args):
        for c in chunk.choices:
            texts[c.index] += c.text
            assert (getattr(c, "copies", None) is not None) == (c.finish_reason is not None)
            if c.finish_reason is not None:
                ends[c.index] = c.copies
    prompts = [PROMPT, PROMPT, OTHER, OTHER]
    assert texts == [c.text for c in whole.choices] == [served[2][p, i % 2] for i, p in enumerate(prompts)]
    assert [ends[i] for i in range(4)] == [c.copies for c in whole.choices]
    for prompt, text, copies in zip(prompts, texts, [ends[i] for i in range(4)]):
        spans, share = expected(prompt, text, served[1])
        assert spans and found(copies) == (spans, pytest.approx(share, abs=1e-4))


def test_a_request_that_does_not_ask_gets_openais_shape_unchanged(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    assert "copies" not in r.choices[0].model_dump()
    for chunk in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                           extra_body={"copies": False}):
        assert "copies" not in chunk.choices[0].model_dump()


def test_a_copies_that_is_not_a_bool_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, extra_body={"copies": "yes"})
    assert e.value.body["param"] == "copies" and "copies must be true or false" in e.value.body["message"]


def test_a_model_with_no_training_text_asked_for_copies_is_a_400_before_any_work(served):
    """A pretrained model names no dataset: one line saying so, and nothing decoded."""
    tok = CharTokenizer(CHARS)
    service = Service(random_model(len(CHARS)), tok, "bare", torch.device("cpu"), torch.float32, max_batch=1, max_queue=1)
    with running(service.app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="bare", prompt=PROMPT, max_tokens=5, extra_body={"copies": True})
        assert client.completions.create(model="bare", prompt=PROMPT, max_tokens=5).choices[0].text
    assert e.value.body["param"] == "copies" and "names no dataset" in e.value.body["message"]
    assert "\n" not in e.value.body["message"]


def test_a_chat_answer_copied_from_the_conversations_names_them(tmp_path):
    """A chat model whose fine-tuning conversations hold the very answer it gives: the whole answer is one span,
    found in the conversations (not the base corpus), and its share is 1; offsets count in the answer."""
    from data.prepare import prepare
    from nanogpt.chat_dataset import prepare_chat
    (tmp_path / "input.txt").write_text(CORPUS, encoding="utf-8")
    prepare(str(tmp_path / "input.txt"), "char", str(tmp_path / "base"), 0.1, log=lambda *a: None)
    tok = ChatTokenizer(CharTokenizer(CHARS))
    model = random_model(tok.vocab_size)
    with torch.no_grad():  # the role tokens' logits -100 (ln_f's feature 0 held at 1): the answer is 30 characters
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
        model.transformer.ln_f.weight[0], model.transformer.ln_f.bias[0] = 0.0, 1.0
        model.lm_head.weight[len(CHARS):] = 0
        model.lm_head.weight[len(CHARS):, 0] = -100
    messages = [{"role": "user", "content": "All:"}]
    answer = tok.decode(sampled(model, tok.render(messages)[0], n=30))
    assert len(set(answer)) > 5 and max(tok.encode(answer)) < len(CHARS), answer
    with open(tmp_path / "chats.jsonl", "w", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"messages": [*messages, {"role": "assistant", "content": answer}]}) + "\n")
    prepare_chat(str(tmp_path / "chats.jsonl"), str(tmp_path / "base"), str(tmp_path / "chat"), block_size=64,
                 log=lambda *a: None)
    service = Service(model, tok, "chat", torch.device("cpu"), torch.float32, max_batch=1, max_queue=2,
                      dataset=str(tmp_path / "chat"))
    with running(service.app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
        r = client.chat.completions.create(model="chat", messages=messages, max_tokens=30, temperature=1, seed=SEED,
                                           extra_body={"copies": True})
    copies = r.choices[0].copies
    assert r.choices[0].message.content == answer
    assert found(copies) == ([(0, len(answer))], 1.0)
    assert copies["spans"][0]["part"].endswith("chat") and copies["spans"][0]["where"].startswith("conversation ")
    assert copies["longest"] == len(answer)


def test_the_playground_underlines_copied_tokens_and_shows_their_source_on_hover(served, client):
    """The model card offers copies; the page asks for them, underlines exactly the generated tokens inside a span
    the brute-force search finds, and hovering one shows the span's source and training text around it."""
    from test_serve import chromium_page
    _, train, texts = served
    assert client.models.list().data[0].copies is True
    text = texts[PROMPT, 0]
    spans, share = expected(PROMPT, text, train)
    inside = [any(a < len(PROMPT) + i + 1 and b > len(PROMPT) + i for a, b in spans) for i in range(N)]
    assert any(inside) and not all(inside)  # the data holds what the test is about
    with chromium_page(served[0][:-len("/v1")] + "/") as page:
        page.wait_for_function("!document.querySelector('#copies_label').hidden")
        page.fill("#prompt", PROMPT)
        page.fill("#max_tokens", str(N))
        page.fill("#temperature", "1")
        page.fill("#seed", str(SEED))
        page.click("#generate")
        page.wait_for_function("document.querySelector('#status').textContent.includes('copied')")
        tokens = page.locator("#output .tok")
        assert "".join(tokens.all_text_contents()) == text
        assert tokens.evaluate_all("ts => ts.map(t => t.classList.contains('copied'))") == inside
        assert f"copied from the training text: {100 * share:.0f}%" in page.inner_text("#status")
        tokens.nth(inside.index(True)).hover()
        tip = page.inner_text("#tip")
        span = (PROMPT + text)[spans[0][0]:spans[0][1]]
        assert "copied from" in tip and "line " in tip and span.replace("\n", "") in tip.replace("\n", "")
        tokens.nth(inside.index(False)).hover()
        assert "copied from" not in page.inner_text("#tip")
