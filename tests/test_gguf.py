"""export.py --format=gguf: a file llama.cpp runs as ours does. The checks by llama.cpp itself need
llama-cpp-python (it builds llama.cpp from source: docs/export.md gives the time) and are skipped without it."""
import os

import pytest
import torch

from conftest import CORPUS, run_script
from test_export import MODERN
from test_hf_tokenizer import llama_sft  # noqa: F401 (a fixture)
from test_interop import randomize, trained_then_randomized

gguf = pytest.importorskip("gguf")
needs_llama_cpp = pytest.mark.skipif(not __import__("importlib").util.find_spec("llama_cpp"),
                                     reason="needs llama-cpp-python (pip install llama-cpp-python builds llama.cpp)")


def dataset(tmp_path, kind):
    from data.prepare import prepare
    from nanogpt.tokenizer import read_meta
    (tmp_path / "in.txt").write_text(CORPUS)
    prepare(str(tmp_path / "in.txt"), kind, str(tmp_path / kind), log=lambda *a: None, vocab_size=300)
    return read_meta(str(tmp_path / kind))


def random_model(vocab_size, **options):
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=vocab_size, **{**MODERN, **options})
    return randomize(GPT(config), seed=1).eval()


def llama_cpp_greedy(path, prompt, n):
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=64, n_threads=2, verbose=False)
    tokens = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        tokens.append(token)
        if len(tokens) == n:
            return llm, tokens


def check_against_llama_cpp(model, tokenizer, path, prompt, text):
    """50 greedy tokens of llama.cpp equal to ours (model.generate, the reference sample.py is held to); its
    tokenizer encodes text as ours."""
    n = 50
    assert len(prompt) + n <= model.config.block_size  # ours never crops the context here: the same computation
    llm, theirs = llama_cpp_greedy(path, prompt, n)
    ours = model.generate(torch.tensor([prompt]), n, temperature=0)[0, len(prompt):].tolist()
    assert theirs == ours
    assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == tokenizer.encode(text)


@needs_llama_cpp
@pytest.mark.parametrize("kind, options", [("char", dict()), ("char", dict(qk_norm=True, n_kv_head=2)),
                                           ("bpe", dict(n_kv_head=1, tie_weights=False))],
                         ids=["char-llama", "char-qwen3", "bpe-llama-gqa-untied"])
def test_llama_cpp_writes_our_greedy_tokens(tmp_path, kind, options):
    from nanogpt.gguf_file import write_gguf
    from nanogpt.tokenizer import tokenizer_from_meta
    tokenizer = tokenizer_from_meta(dataset(tmp_path, kind))
    model = random_model(tokenizer.vocab_size, **options)
    write_gguf(model, tokenizer, "qwen3" if options.get("qk_norm") else "llama", str(tmp_path / "m.gguf"), "ckpt.pt")
    check_against_llama_cpp(model, tokenizer, tmp_path / "m.gguf", tokenizer.encode("Speak, speak."), CORPUS[:300])


@needs_llama_cpp
def test_llama_cpp_answers_as_chat_py_on_the_export_of_a_chat_model(llama_sft, tmp_path):  # noqa: F811
    from nanogpt.source import Source, load_model
    exported = run_script(["export.py", f"--out_dir={llama_sft}", "--format=gguf", f"--gguf_file={tmp_path / 'chat.gguf'}"])
    assert exported.returncode == 0, exported.stderr
    model, tokenizer = load_model(Source(out_dir=str(llama_sft)))
    prompt, _ = tokenizer.render([{"role": "user", "content": "say cg"}])
    check_against_llama_cpp(model, tokenizer, tmp_path / "chat.gguf", prompt, "say abcdefgh, then stop.")


def test_gguf_holds_the_tokenizer_and_chat_template(llama_sft, tmp_path):  # noqa: F811
    from nanogpt.hf_tokenizer import chat_template
    from nanogpt.source import Source, load_model
    result = run_script(["export.py", f"--out_dir={llama_sft}", "--format=gguf", f"--gguf_file={tmp_path / 'chat.gguf'}"])
    assert result.returncode == 0, result.stderr
    _, tokenizer = load_model(Source(out_dir=str(llama_sft)))
    reader = gguf.GGUFReader(str(tmp_path / "chat.gguf"))
    fields = reader.fields

    def value(key):
        return fields[key].contents()
    assert value("general.architecture") == "llama"
    tokens = value("tokenizer.ggml.tokens")
    assert [tokens[i] for i in tokenizer.ids.values()] == list(tokenizer.ids)
    assert value("tokenizer.chat_template") == chat_template()
    assert value("tokenizer.ggml.eos_token_id") == tokenizer.end
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


@pytest.mark.parametrize("options, says", [(dict(), "a GPT-2-style model: --format=gguf writes Llama and Qwen3"),
                                           (dict(MODERN, bias=True), "has biases (bias=True)")], ids=["gpt2", "biases"])
def test_gguf_for_an_architecture_llama_cpp_lacks_is_refused(tmp_path, char_dataset, options, says):
    out, _ = trained_then_randomized(tmp_path, char_dataset, **options)
    result = run_script(["export.py", f"--out_dir={out}", "--format=gguf", f"--gguf_file={tmp_path / 'm.gguf'}"])
    assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not os.path.exists(tmp_path / "m.gguf")
