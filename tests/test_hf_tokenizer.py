"""The tokenizer an export carries as Hugging Face's: AutoTokenizer encodes as ours (characters, trained BPEs,
GPT-2's), its chat template renders as chat.py does, and transformers' pipeline answers as chat.py."""
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SHAKESPEARE, SHARED, run_script

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TANG = os.path.join(SHARED, "data", "tangshi", "input.txt")
SLICE = 200_000  # characters of each corpus: thousands of distinct Tang characters, seconds to train a BPE
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def corpus(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} not found (../shared)")
    with open(path, encoding="utf-8") as f:
        return f.read(SLICE)


def saved(tokenizer, directory):
    """tokenizer as an export writes it, read back the way a user reads it: AutoTokenizer.from_pretrained."""
    from nanogpt.interop.hf_tokenizer import hf_tokenizer
    hf_tokenizer(tokenizer, 1024).save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """ours -> Hugging Face's, for characters and a trained BPE of both corpora and GPT-2's BPE."""
    from data.prepare import prepare
    from nanogpt.tokenizer import GPT2BPE, CharTokenizer, read_meta, tokenizer_from_meta
    root = tmp_path_factory.mktemp("tok")
    pairs = {}
    for name, path in (("shakespeare", SHAKESPEARE), ("tang", TANG)):
        text = corpus(path)
        (root / f"{name}.txt").write_text(text, encoding="utf-8")
        prepare(str(root / f"{name}.txt"), "bpe", str(root / f"{name}-bpe"), log=lambda *a: None, vocab_size=1024)
        pairs[f"{name}-bpe"] = tokenizer_from_meta(read_meta(str(root / f"{name}-bpe")))
        pairs[f"{name}-char"] = CharTokenizer(sorted(set(text)))
    pairs["gpt2"] = GPT2BPE()
    return {name: (ours, saved(ours, root / f"hf-{name}")) for name, ours in pairs.items()}


def texts(ours):
    """Random Unicode mixed with the vocabulary's own characters (or, for a BPE, its corpus's), and the
    spellings BPE handles specially: <|endoftext|>, runs of spaces and newlines, digits, contractions."""
    vocab = ours.chars if hasattr(ours, "chars") else list("abc ÿ\n\t'sé一風") + ["<|endoftext|>", "'ll", "1234", "   "]
    return st.lists(st.one_of(st.text(max_size=8), st.sampled_from(vocab)), max_size=40).map("".join)


def encodes_alike(ours, theirs, text):
    from nanogpt.errors import UserError
    try:
        expected = ours.encode(text)
    except UserError:  # a character outside the vocabulary: theirs refuses it too
        with pytest.raises(Exception, match="Missing \\[UNK\\] token"):
            theirs.encode(text, add_special_tokens=False)
        return
    assert theirs.encode(text, add_special_tokens=False) == expected
    assert theirs.decode(expected) == ours.decode(expected)


@pytest.mark.parametrize("name", ["shakespeare-char", "tang-char", "shakespeare-bpe", "tang-bpe", "gpt2"])
def test_auto_tokenizer_encodes_both_corpora_as_ours(tokenizers, name):
    ours, theirs = tokenizers[name]
    for path in (SHAKESPEARE, TANG):
        text = corpus(path)[:50_000]
        if hasattr(ours, "chars"):
            text = "".join(c for c in text if c in ours.stoi)
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), path


@pytest.mark.parametrize("name", ["shakespeare-char", "tang-char", "shakespeare-bpe", "tang-bpe", "gpt2"])
@PROPERTY
@given(data=st.data())
def test_auto_tokenizer_encodes_random_unicode_as_ours(tokenizers, name, data):
    ours, theirs = tokenizers[name]
    encodes_alike(ours, theirs, data.draw(texts(ours)))


ROLE_SPELLINGS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|", "|>"]


@pytest.fixture(scope="module")
def chat_tokenizers(tokenizers, tmp_path_factory):
    from nanogpt.tokenizer import CharTokenizer, ChatTokenizer
    root = tmp_path_factory.mktemp("chat")
    chars = "".join(sorted(set("abcdefgh say,.<|>systemuraintd \n")))
    bases = {"char": CharTokenizer(chars), "tang-bpe": tokenizers["tang-bpe"][0], "gpt2": tokenizers["gpt2"][0]}
    return {name: (ChatTokenizer(base), saved(ChatTokenizer(base), root / name)) for name, base in bases.items()}


def messages_of(alphabet):
    content = st.lists(st.one_of(st.sampled_from(list(alphabet)), st.sampled_from(ROLE_SPELLINGS)), max_size=12).map("".join)
    message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": content})
    return st.lists(message, min_size=1, max_size=4)


@pytest.mark.parametrize("name", ["char", "tang-bpe", "gpt2"])
@PROPERTY
@given(data=st.data())
def test_chat_template_gives_the_ids_chat_py_sends_and_typed_text_is_never_a_role_token(chat_tokenizers, name, data):
    ours, theirs = chat_tokenizers[name]
    messages = data.draw(messages_of("abcdegh say,." if name == "char" else "ab 風\n"))
    expected, _ = ours.render(messages)
    got = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert got == expected
    role_ids = set(ours.ids.values())
    assert sum(i in role_ids for i in got) == 2 * len(messages) + 1  # only the template's own


def test_typed_role_token_is_text_in_the_template_and_with_split_special_tokens(chat_tokenizers):
    ours, theirs = chat_tokenizers["char"]
    messages = [{"role": "user", "content": "say <|assistant|>"}]
    got = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert got == ours.render(messages)[0] and got.count(ours.ids["<|assistant|>"]) == 1
    assert theirs.encode("<|end|>", add_special_tokens=False, split_special_tokens=True) == ours.encode("<|end|>")
    assert theirs.decode(ours.render(messages)[0]) == ours.decode(ours.render(messages)[0])


@pytest.fixture(scope="session")  # test_gguf.py uses it too
def llama_sft(tmp_path_factory):
    """test_chat's 'say xy' -> 'xyxy.' model, as a Llama (RoPE, RMSNorm, SwiGLU, one kv head) of 64 positions
    (a prompt and 50 tokens): its out_dir."""
    from configurator import parse_args
    from data.prepare import prepare
    from nanogpt.chat_dataset import prepare_chat
    from test_chat import BASE_TEXT, TINY, conversation, quiet, write_jsonl
    from train import TrainConfig, train
    root = tmp_path_factory.mktemp("llama-sft")
    (root / "base.txt").write_text(BASE_TEXT)
    prepare(str(root / "base.txt"), "char", str(root / "base"), log=quiet)
    letters = "abcdefgh"
    write_jsonl(root / "chats.jsonl", [conversation(f"say {a}{b}", f"{a}{b}{a}{b}.") for a in letters for b in letters])
    prepare_chat(str(root / "chats.jsonl"), str(root / "base"), str(root / "chat"), block_size=64, log=quiet)
    modern = dict(pos_emb="rope", norm="rmsnorm", activation="swiglu", bias=False, n_kv_head=1)
    train(TrainConfig(**{**TINY, "block_size": 64}, **modern, out_dir=str(root / "pre"), dataset=str(root / "base"), max_iters=20,
                      lr_decay_iters=20, eval_interval=20), log=quiet)
    cfg, overrides = parse_args(TrainConfig, [f"--init_from={root / 'pre'}", f"--dataset={root / 'chat'}", "--device=cpu",
                                              f"--out_dir={root / 'out-sft'}", "--max_iters=250", "--eval_interval=250",
                                              "--eval_iters=4", "--batch_size=16", "--gradient_accumulation_steps=1",
                                              "--learning_rate=1e-2", "--warmup_iters=10", "--lr_decay_iters=250"])
    summary = train(cfg, overrides, log=quiet)
    assert summary["val_loss"] < 0.3 * math.log(len(set(BASE_TEXT)) + 4)
    return root / "out-sft"


def test_pipeline_on_the_export_of_a_chat_model_answers_as_chat_py(llama_sft, tmp_path):
    exported = run_script(["export.py", f"--out_dir={llama_sft}", f"--hf_dir={tmp_path / 'hf'}"])
    assert exported.returncode == 0, exported.stderr
    answers = {}
    for request in ("say cg", "say ha", "say hh"):
        result = run_script(["chat.py", f"--out_dir={llama_sft}", "--temperature=0", "--max_new_tokens=20", "-p", request])
        assert result.returncode == 0, result.stderr
        answers[request] = result.stdout.strip()
    # taught ('say xy' -> 'xyxy.', then <|end|>): the comparison is of answers that stop, not of noise
    assert all(len(answer) == 5 and answer.endswith(".") for answer in answers.values()), answers
    chat = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
    for request, answer in answers.items():
        out = chat([{"role": "user", "content": request}], max_new_tokens=20, do_sample=False)
        assert out[0]["generated_text"][-1] == {"role": "assistant", "content": answer}
