"""export.py --format=gguf: a file llama.cpp runs as ours does. Without llama.cpp, CI reads the file back with
gguf.GGUFReader and runs numpy transcriptions of llama.cpp's gpt2, llama and qwen3 graphs on its tensors, and checks
its token types. The checks by llama.cpp itself need llama-cpp-python (it builds llama.cpp from source:
docs/export.md gives the time) and are skipped without it."""
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


def llama_cpp_model(path, monkeypatch=None, **options):
    """llama.cpp's Llama for the file. With monkeypatch: without its extra buffer types (weights repacked for
    AMX and the like), whose Q8_0 products crash on a batch of several tokens on some CPUs (llama-cpp-python
    0.3.36 on an Intel Xeon with AMX: a segmentation fault in the prompt's decode)."""
    import llama_cpp
    from llama_cpp import Llama
    if monkeypatch is not None:
        default = llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p
        monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", params)
    return Llama(model_path=str(path), n_ctx=64, n_threads=2, verbose=False, **options)


def llama_cpp_greedy(path, prompt, n):
    llm = llama_cpp_model(path)
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
    from nanogpt.interop.gguf_file import write_gguf
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
    assert value("tokenizer.chat_template") == tokenizer.chat_template()
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
    from nanogpt.interop.gguf_file import write_gguf
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


def test_gguf_of_two_tokens_spelled_alike_is_refused():
    """A BPE whose ranks hold <|end|> (a damaged or crafted ranks file: the split patterns keep punctuation from
    letters) under a chat's <|end|>: llama.cpp would abort loading the file, so export refuses it in one line."""
    from nanogpt.errors import UserError
    from nanogpt.interop.gguf_file import GPT4_PATTERN, vocabulary
    from nanogpt.tokenizer import ChatTokenizer, TrainedBPE
    ranks = {bytes([b]): b for b in range(256)}
    for n in range(2, len(b"<|end|>") + 1):
        ranks[b"<|end|>"[:n]] = len(ranks)
    tokenizer = ChatTokenizer(TrainedBPE(GPT4_PATTERN, ranks, {"<|endoftext|>": len(ranks)}))
    with pytest.raises(UserError, match=rf"tokens {len(ranks) - 1} and {tokenizer.end} are both '<\|end\|>'"):
        vocabulary(tokenizer, tokenizer.vocab_size)


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
    from nanogpt.interop.gguf_file import write_gguf
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


# llama.cpp's rope type of each architecture (llama_model_rope_type): NORM turns channel pairs (2i, 2i+1) of a
# head, NEOX pairs (i, i + head_dim/2)
NEOX_ROPE = {"llama": False, "qwen3": True}


def rope_as_ggml(x, base, neox):
    """ggml_rope_ext (no scaling) of x (T, heads, hs) at positions 0..T-1: pair i turns by pos * base^(-2i/hs)."""
    T, _, hs = x.shape
    theta = np.arange(T)[:, None, None] * base ** (-np.arange(0, hs, 2) / hs)  # (T, 1, hs/2)
    x0, x1 = (x[..., :hs // 2], x[..., hs // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
    y0, y1 = x0 * np.cos(theta) - x1 * np.sin(theta), x0 * np.sin(theta) + x1 * np.cos(theta)
    return np.concatenate([y0, y1], -1) if neox else np.stack([y0, y1], -1).reshape(x.shape)


class LlamaCppFile:
    """A llama or qwen3 GGUF file read as llama.cpp's loader reads it: hyperparameters from {arch}.* keys (the
    optional ones with llama.cpp's defaults), each tensor by name with the dims (ne order, fastest first) that
    load_arch_tensors demands, as an array of the reversed dims; llama.cpp refuses a file with other dims or
    with tensors it does not read."""

    def __init__(self, path):
        reader = gguf.GGUFReader(str(path))
        self.fields, self.tensors, self.used = reader.fields, {t.name: t for t in reader.tensors}, set()
        self.arch = self.fields["general.architecture"].contents()
        self.n_embd, self.n_layer = self.hparam("embedding_length"), self.hparam("block_count")
        self.n_ff, self.n_head = self.hparam("feed_forward_length"), self.hparam("attention.head_count")
        self.n_head_kv = self.hparam("attention.head_count_kv", self.n_head)
        self.hs = self.hparam("attention.key_length", self.n_embd // self.n_head)
        assert self.hparam("attention.value_length", self.hs) == self.hs == self.hparam("rope.dimension_count", self.hs)
        self.rope_base = self.hparam("rope.freq_base", 10000.0)
        self.eps = self.hparam("attention.layer_norm_rms_epsilon")
        self.n_ctx_train = self.hparam("context_length")
        self.n_vocab = len(self.fields["tokenizer.ggml.tokens"].contents())
        assert self.hparam("vocab_size", self.n_vocab) == self.n_vocab

    def hparam(self, key, default=None):
        field = self.fields.get(f"{self.arch}.{key}")
        assert field is not None or default is not None, f"{self.arch}.{key} missing: llama.cpp refuses the file"
        return default if field is None else field.contents()

    def __call__(self, name, *ne):
        t = self.tensors[name]
        assert [int(d) for d in t.shape] == list(ne), f"{name}: dims {list(t.shape)}, llama.cpp reads {list(ne)}"
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, f"{name}: {t.tensor_type.name}"
        self.used.add(name)
        return np.array(t.data, dtype=np.float64).reshape(list(reversed(ne)))


def llama_logits_as_llama_cpp_reads_them(path, ids):
    """Logits (T, V) of ids from a GGUF file alone, in float64, as llama.cpp's llama and qwen3 graphs compute them
    (src/models/llama.cpp, qwen3.cpp): token_embd; per block, attn_norm (RMS), attn_q/k/v (qwen3: each head's q and
    k RMS-normed with attn_q_norm/attn_k_norm), RoPE of the architecture's type, causal attention with q head h
    reading kv head h // (n_head / n_head_kv) (ggml_mul_mat's broadcast), attn_output; ffn_norm, ffn_down of
    silu(ffn_gate) * ffn_up; output_norm, then output (or token_embd where there is none)."""
    f, T = LlamaCppFile(path), len(ids)
    assert T <= f.n_ctx_train, f"{T} tokens, a context of {f.n_ctx_train}"
    E, hs, n_head, n_kv = f.n_embd, f.hs, f.n_head, f.n_head_kv

    def rms(x, name, n):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + f.eps) * f(name, n)

    def rotated(m, name, heads):  # (T, heads, hs)
        m = m.reshape(T, heads, hs)
        return rope_as_ggml(rms(m, name, hs) if f.arch == "qwen3" else m, f.rope_base, NEOX_ROPE[f.arch])
    x, mask = f("token_embd.weight", E, f.n_vocab)[ids], np.triu(np.full((T, T), -np.inf), 1)
    for i in range(f.n_layer):
        blk = f"blk.{i}."
        h = rms(x, blk + "attn_norm.weight", E)
        q = rotated(h @ f(blk + "attn_q.weight", E, hs * n_head).T, blk + "attn_q_norm.weight", n_head)
        k = rotated(h @ f(blk + "attn_k.weight", E, hs * n_kv).T, blk + "attn_k_norm.weight", n_kv)
        v = (h @ f(blk + "attn_v.weight", E, hs * n_kv).T).reshape(T, n_kv, hs)
        heads = []
        for j in range(n_head):
            kv = j // (n_head // n_kv)
            scores = q[:, j] @ k[:, kv].T / np.sqrt(hs) + mask
            p = np.exp(scores - scores.max(-1, keepdims=True))
            heads.append(p / p.sum(-1, keepdims=True) @ v[:, kv])
        x = x + np.concatenate(heads, -1) @ f(blk + "attn_output.weight", hs * n_head, E).T
        h = rms(x, blk + "ffn_norm.weight", E)
        gate, up = h @ f(blk + "ffn_gate.weight", E, f.n_ff).T, h @ f(blk + "ffn_up.weight", E, f.n_ff).T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ f(blk + "ffn_down.weight", f.n_ff, E).T
    head = f("output.weight", E, f.n_vocab) if "output.weight" in f.tensors else f("token_embd.weight", E, f.n_vocab)
    logits = rms(x, "output_norm.weight", E) @ head.T
    assert f.used == set(f.tensors), f"tensors llama.cpp does not read: {sorted(set(f.tensors) - f.used)}"
    return logits


@pytest.mark.parametrize("options", [dict(), dict(tie_weights=False), dict(qk_norm=True),
                                     dict(qk_norm=True, tie_weights=False)],
                         ids=["llama", "llama-untied", "qwen3", "qwen3-untied"])
def test_a_llama_style_model_as_gguf_computes_our_logits(tmp_path, options):
    """llama.cpp's llama and qwen3 graphs, transcribed in numpy over the file's tensors, give our logits: every
    weight in its place and orientation, q and k in the order the architecture's RoPE pairs them, the rope base
    (not llama.cpp's default) and the RMS epsilon written, kv heads shared as ours share them, the head tied or
    not. Two kv heads for four: one would hide which q heads share it."""
    from nanogpt.interop.gguf_file import write_gguf
    from nanogpt.interop.hf import hf_architecture
    from nanogpt.tokenizer import tokenizer_from_meta
    tokenizer = tokenizer_from_meta(dataset(tmp_path, "char"))
    model = random_model(tokenizer.vocab_size, n_kv_head=2, rope_base=5000.0, **options)
    kind = hf_architecture(model.config, "ckpt.pt")  # as export.py chooses it: qwen3 for qk_norm
    write_gguf(model, tokenizer, kind, str(tmp_path / "m.gguf"), "ckpt.pt")
    ids = tokenizer.encode(CORPUS[:60])
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0][0].double().numpy()
    np.testing.assert_allclose(llama_logits_as_llama_cpp_reads_them(tmp_path / "m.gguf", ids), ours, atol=1e-4)


@needs_llama_cpp
@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_llama_cpp_writes_our_greedy_tokens_for_a_gpt2_style_model(tmp_path, activation):
    """The Tang and Shakespeare recipes' architecture (learned positions, LayerNorm, GELU, biases): llama.cpp's
    gpt2 computes GELU's tanh form through a float16 table, close enough to both of ours for the same tokens."""
    from nanogpt.interop.gguf_file import write_gguf
    from nanogpt.tokenizer import tokenizer_from_meta
    tokenizer = tokenizer_from_meta(dataset(tmp_path, "char"))
    model = random_model(tokenizer.vocab_size, pos_emb="learned", norm="layernorm", activation=activation, bias=True)
    write_gguf(model, tokenizer, "gpt2", str(tmp_path / "m.gguf"), "ckpt.pt")
    check_against_llama_cpp(model, tokenizer, tmp_path / "m.gguf", tokenizer.encode("Speak, speak."), CORPUS[:300])


@needs_llama_cpp
@pytest.mark.parametrize("kind, options", [("char", dict()), ("bpe", dict(n_kv_head=1, tie_weights=False))],
                         ids=["char-llama", "bpe-llama-gqa-untied"])
def test_llama_cpp_runs_the_q8_0_export_as_our_int8_model(tmp_path, monkeypatch, kind, options):
    """export's Q8_0 holds our int8 rows exactly (test_quantize.py); llama.cpp multiplies them by activations it
    rounds to 8 bits in blocks of 32 (ours: to bfloat16), so its logits over a prompt stay within a few percent of
    the logits' spread from our int8 model's (measured: 2.5%, as far as ours are from float32's), where a wrong
    scale or block layout would leave them as far apart as the spread itself."""
    import copy

    from nanogpt.interop.gguf_file import write_gguf
    from nanogpt.quantize import quantize
    from nanogpt.tokenizer import tokenizer_from_meta
    tokenizer = tokenizer_from_meta(dataset(tmp_path, kind))
    model = random_model(tokenizer.vocab_size, **options)
    write_gguf(model, tokenizer, "llama", str(tmp_path / "q.gguf"), "ckpt.pt", quantize="int8")
    prompt = tokenizer.encode(CORPUS[:120])[:60]
    llm = llama_cpp_model(tmp_path / "q.gguf", monkeypatch, logits_all=True)
    llm.eval(prompt)
    theirs = np.array(llm.scores[:len(prompt)])
    with torch.no_grad():
        ours = quantize(copy.deepcopy(model), "int8")(torch.tensor([prompt]))[0][0].numpy()
        float32 = model(torch.tensor([prompt]))[0][0].numpy()
    spread = (float32.max(1) - float32.min(1)).mean()
    assert np.abs(theirs - ours).max() < 0.08 * spread
