"""export.py --format=gguf: a file llama.cpp runs as ours does. The checks by llama.cpp itself need
llama-cpp-python (it builds llama.cpp from source: docs/export.md gives the time) and are skipped without it."""
import os

import numpy as np
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


def base_tokenizer(tmp_path, kind):
    from nanogpt.tokenizer import GPT2BPE, tokenizer_from_meta
    return GPT2BPE() if kind == "gpt2" else tokenizer_from_meta(dataset(tmp_path, kind))


@pytest.mark.parametrize("kind, chat", [("char", False), ("bpe", False), ("gpt2", False), ("char", True),
                                        ("bpe", True)],
                         ids=["char", "bpe", "gpt2", "chat-char", "chat-bpe"])
def test_gguf_role_and_special_tokens_are_control_tokens(tmp_path, kind, chat):
    """llama.cpp reads a CONTROL token's text as that one token only where told to (parse_special: the prompt a
    chat template renders) and never spells it out in what it decodes; a NORMAL token's text is split like any
    text (<|user|> into characters: a wrong prompt). USER_DEFINED would be read out of a user's message too (a
    forged turn, which ChatTokenizer forbids). So role tokens and <|endoftext|> are CONTROL, named as ours; every
    other token text encodes to is NORMAL (llama.cpp's byte-level BPE decodes no BYTE token); padding UNUSED."""
    from model import GPT, GPTConfig
    from nanogpt.gguf_file import write_gguf
    from nanogpt.tokenizer import ChatTokenizer
    base = base_tokenizer(tmp_path, kind)
    tokenizer = ChatTokenizer(base) if chat else base
    vocab_size = tokenizer.vocab_size + 3  # padding ids, as a vocabulary rounded up to a multiple of 64 has
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=vocab_size, **MODERN)).eval()
    write_gguf(model, tokenizer, "llama", str(tmp_path / "m.gguf"), "ckpt.pt")
    fields = gguf.GGUFReader(str(tmp_path / "m.gguf")).fields
    tokens, types = fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.token_type"].contents()
    special = {**({"<|endoftext|>": base.eot} if base.eot is not None else {}), **getattr(tokenizer, "ids", {})}
    assert len(types) == vocab_size
    expected = [gguf.TokenType.NORMAL] * base.vocab_size + [gguf.TokenType.UNUSED] * (vocab_size - base.vocab_size)
    for name, i in special.items():
        expected[i] = gguf.TokenType.CONTROL
        assert tokens[i] == name
    assert [gguf.TokenType(t) for t in types] == expected


@pytest.mark.parametrize("options, says", [(dict(activation="relu"), "llama.cpp's gpt2 computes GELU only"),
                                           (dict(MODERN, bias=True), "has biases (bias=True)")], ids=["gpt2-relu", "biases"])
def test_gguf_for_an_architecture_llama_cpp_lacks_is_refused(tmp_path, char_dataset, options, says):
    out, _ = trained_then_randomized(tmp_path, char_dataset, **options)
    result = run_script(["export.py", f"--out_dir={out}", "--format=gguf", f"--gguf_file={tmp_path / 'm.gguf'}"])
    assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not os.path.exists(tmp_path / "m.gguf")


def gpt2_logits_as_llama_cpp_reads_them(path, ids):
    """Logits (T, V) of ids from a GGUF file alone, in float64, as llama.cpp's gpt2 graph computes them
    (src/models/gpt2.cpp): token_embd + position_embd; per block, attn_norm, attn_qkv (q, k, v one after the
    other), causal attention, attn_output, ffn_norm, ffn_up, GELU (tanh form), ffn_down; output_norm, then
    output (or token_embd where there is none)."""
    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    w = {t.name: np.array(t.data, dtype=np.float64).reshape([int(d) for d in reversed(t.shape)])
         for t in reader.tensors}
    n_head, eps, n_layer = field("gpt2.attention.head_count"), field("gpt2.attention.layer_norm_epsilon"), field(
        "gpt2.block_count")

    def norm(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]
    T = len(ids)
    x = w["token_embd.weight"][ids] + w["position_embd.weight"][:T]
    for i in range(n_layer):
        q, k, v = np.split(linear(norm(x, f"blk.{i}.attn_norm"), f"blk.{i}.attn_qkv"), 3, axis=-1)
        hs = q.shape[-1] // n_head
        heads = []
        for h in range(n_head):
            qh, kh, vh = (m[:, h * hs:(h + 1) * hs] for m in (q, k, v))
            scores = qh @ kh.T / np.sqrt(hs) + np.triu(np.full((T, T), -np.inf), 1)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            heads.append((p / p.sum(-1, keepdims=True)) @ vh)
        x = x + linear(np.concatenate(heads, -1), f"blk.{i}.attn_output")
        h = linear(norm(x, f"blk.{i}.ffn_norm"), f"blk.{i}.ffn_up")
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        x = x + linear(h, f"blk.{i}.ffn_down")
    head = w.get("output.weight", w["token_embd.weight"])
    return norm(x, "output_norm") @ head.T


@pytest.mark.parametrize("options", [dict(activation="gelu_tanh"), dict(activation="gelu_tanh", bias=False,
                                                                          tie_weights=False)],
                         ids=["gpt2", "gpt2-no-bias-untied"])
def test_a_gpt2_style_model_as_gguf_computes_our_logits(tmp_path, options):
    """llama.cpp's gpt2 graph, transcribed in numpy over the file's tensors, gives our logits: every weight in its
    place, biases of zero where the model has none, the head tied or not."""
    from model import GPT, GPTConfig
    from nanogpt.gguf_file import write_gguf
    from nanogpt.tokenizer import tokenizer_from_meta
    tokenizer = tokenizer_from_meta(dataset(tmp_path, "char"))
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=tokenizer.vocab_size, **options)
    model = randomize(GPT(config), seed=3).eval()
    write_gguf(model, tokenizer, "gpt2", str(tmp_path / "m.gguf"), "ckpt.pt")
    ids = tokenizer.encode(CORPUS[:40])
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0][0].double().numpy()
    np.testing.assert_allclose(gpt2_logits_as_llama_cpp_reads_them(tmp_path / "m.gguf", ids), ours, atol=1e-4)


@needs_llama_cpp
@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_llama_cpp_writes_our_greedy_tokens_for_a_gpt2_style_model(tmp_path, activation):
    """The Tang and Shakespeare recipes' architecture (learned positions, LayerNorm, GELU, biases): llama.cpp's
    gpt2 computes GELU's tanh form through a float16 table, close enough to both of ours for the same tokens."""
    from nanogpt.gguf_file import write_gguf
    from nanogpt.tokenizer import tokenizer_from_meta
    tokenizer = tokenizer_from_meta(dataset(tmp_path, "char"))
    model = random_model(tokenizer.vocab_size, pos_emb="learned", norm="layernorm", activation=activation, bias=True)
    write_gguf(model, tokenizer, "gpt2", str(tmp_path / "m.gguf"), "ckpt.pt")
    check_against_llama_cpp(model, tokenizer, tmp_path / "m.gguf", tokenizer.encode("Speak, speak."), CORPUS[:300])
