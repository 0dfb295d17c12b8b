"""quantize.py's int8 rows, the fused step's int8 and bfloat16 products, and export.py's Q8_0, each against an
independent reference: numpy's arithmetic, the model's own uncached forward, gguf's own dequantizer."""
import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
import nanogpt.cpu
from nanogpt.cpu import fused_step, native
from nanogpt.cpu.fused_step import FusedStep
from nanogpt.cpu.kernels import bfloat16_products_supported, onednn_available
from nanogpt.generate import KVCache, generate
from nanogpt.quantize import Int8Linear, int8_available, int8_rows, quantize
from test_fused_step import packed_weights, sharp32
from test_generate import greedy_by_hand
from test_model_options import OPTIONS

NATIVE = pytest.mark.skipif(not native.available(), reason=f"no native products here: {native.why()}")

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no _weight_int8pack_mm")


def test_int8_rows_are_numpys_rounding_with_scales_float16_and_bfloat16_hold():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g) * torch.logspace(-6, 1, 48)[:, None]  # rows from tiny to large
    w[5] = 0  # a row of zeros
    q, scale = int8_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    s = scale.numpy().astype(np.float64)
    assert np.array_equal(s, s.astype(np.float16)) and torch.equal(scale, scale.bfloat16().float())
    x = w.double().numpy()
    want = np.clip(np.rint(x / s[:, None]), -127, 127)
    assert np.array_equal(q.numpy(), want)
    amax = np.abs(x).max(1)
    big = amax > 1e-3  # above float16's subnormals the scale is max / 127 or at most two bfloat16 steps above
    assert np.all(s[big] >= amax[big] / 127) and np.allclose(s[big], amax[big] / 127, rtol=2 ** -6)
    assert np.all(np.abs(x - s[:, None] * q.numpy()) <= s[:, None] * 0.5 * (1 + 1e-6))  # rounded, none clipped
    assert q[5].abs().max() == 0 and scale[5] == 1
    with pytest.raises(ValueError, match="not finite"):
        int8_rows(torch.tensor([[1.0, float("nan")]]))


@pytest.mark.parametrize("width", [64, 40, 7])
def test_an_int8_linear_is_the_bfloat16_product_of_its_dequantized_weight(width):
    """Any input width: PyTorch's int8 product takes rows of a multiple of 16 (another width crashes the process),
    so the layer pads its rows and its input with zeros."""
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(width, 40)
    with torch.no_grad():
        linear.weight.normal_(0, 0.3, generator=g)
        linear.bias.normal_(0, 1, generator=g)
    layer = Int8Linear(linear)
    x = torch.randn(3, 5, width, generator=g)
    y = layer(x)
    assert y.shape == (3, 5, 40) and y.dtype == torch.float32
    want = x.bfloat16().double() @ layer.dequantized().double().T  # bfloat16 inputs, exact sums
    want = want.bfloat16().double() + linear.bias.double()  # the product's output rounded to bfloat16
    torch.testing.assert_close(y.double(), want, atol=0.02, rtol=0.01)
    assert (y.double() - (x.double() @ linear.weight.double().T + linear.bias.double())).abs().max() < 0.5
    assert not torch.equal(layer.dequantized(), linear.weight)  # it did round


def test_quantize_replaces_every_linear_layer_and_keeps_a_tied_embedding(tiny_config):
    model = GPT(tiny_config)
    wte = model.transformer.wte.weight
    quantize(model, "int8")
    assert not [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 4 * tiny_config.n_layer + 1
    assert model.transformer.wte.weight is wte and wte.dtype == torch.float32
    torch.testing.assert_close(model.lm_head.dequantized(), wte.detach(), atol=wte.abs().max().item() / 127, rtol=0)


def int16_rows(x):
    """x rounded as the native int8 product rounds its input: each row to 16-bit integers times max |row| / 32767."""
    scale = x.abs().amax(-1, keepdim=True) / 32767
    scale = torch.where(scale > 0, scale, 1.0)
    return torch.round(x / scale) * scale


def rounding_inputs(model, rounding):
    """model with each linear layer's input rounded by rounding(x) first (a forward pre-hook)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(lambda module, args: (rounding(args[0]),))
    return model


def as_float(model, quantized):
    """model (float32) with each linear weight replaced by the weight quantized's int8 rows stand for and its input
    rounded as the native int8 product rounds it (int16_rows): the float32 model whose products the native int8
    kernel computes (sums of integers, exact, times the two scales)."""
    model = copy.deepcopy(model)
    layers = dict(quantized.named_modules())
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(layers[name].dequantized())
    return rounding_inputs(model, int16_rows)


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")
@pytest.mark.parametrize("kernel", ["int8", pytest.param("native", marks=NATIVE)])
@pytest.mark.parametrize("option", ["gpt2", "gelu_tanh", "relu2", "swiglu", "modern", "softcap"])
def test_int8_fused_steps_match_the_int8_models_own_forward(tiny_config, option, kernel):
    """The fused step's int8 products (bias, activation and residual after them) against the quantized model's
    own uncached forward: the same int8 layers, computed by model.py, its inputs rounded to bfloat16 (1% of the
    logits' spread). decode.c's products (kernel native) round the inputs to 16-bit integers instead: from the
    first position they are the float32 model on the weights the int8 rows stand for and inputs so rounded, to
    float32's rounding."""
    floats = sharp32(replace(tiny_config, **OPTIONS[option]))
    model = quantize(copy.deepcopy(floats), "int8")
    reference = as_float(floats, model)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, 2, "cpu", torch.float32)
    with torch.inference_mode(), packed_weights(model, 2) as packed:
        step = FusedStep.build(model, packed, int8_kernel=kernel)
        assert step is not None and not packed  # nothing left to pack
        assert {p.kind for b in step.blocks for p in b[1:6] if isinstance(p, fused_step.Product)} == {kernel}
        full, _ = model(idx)
        exact, _ = reference(idx)
        if kernel == "native":  # every position by the fused step: the cache holds its keys, not the forward's
            for t in range(16):  # an input a hair from a rounding boundary may round the other way: 1e-4
                scale = exact[:, t].abs().max().item()
                torch.testing.assert_close(step(idx[:, t], cache)[:, 0], exact[:, t], atol=1e-4 * scale, rtol=1e-5)
            return
        model(idx[:, :5], kv_cache=cache)
        for t in range(5, 16):
            logits = step(idx[:, t], cache)[:, 0]
            scale = full[:, t].abs().max().item()
            torch.testing.assert_close(logits, full[:, t], atol=0.01 * scale, rtol=0)


@pytest.mark.parametrize("kernel", ["int8", pytest.param("native", marks=NATIVE)])
@pytest.mark.parametrize("width", [32, 40])
def test_int8_generation_runs_fused_and_gives_the_int8_models_greedy_tokens(monkeypatch, tiny_config, width, kernel):
    """n_embd 40: rows padded to 48 in every layer, the fused step's products included. The native kernel's
    tokens are the float32 model's on the weights the int8 rows stand for."""
    monkeypatch.setattr(nanogpt.cpu, "INT8_KERNEL", kernel)
    floats = sharp32(replace(tiny_config, n_embd=width, **OPTIONS["modern"]))
    model = quantize(copy.deepcopy(floats), "int8")
    calls = []
    real, real_run = FusedStep.__call__, FusedStep.run
    monkeypatch.setattr(FusedStep, "__call__", lambda self, *a: calls.append(self.blocks[0][1].kind) or real(self, *a))

    def run(self, *a):  # decode.c's runs: each step counted, the one handed back included
        result = real_run(self, *a)
        if result is not None:
            calls.extend([self.blocks[0][1].kind] * (result[0].size(0) + (result[1] is not None)))
        return result
    monkeypatch.setattr(FusedStep, "run", run)
    idx = torch.randint(0, 64, (3, 4), generator=torch.Generator().manual_seed(2))
    out = generate(model, idx, 12, temperature=0)
    assert calls == [kernel] * 11
    with torch.inference_mode():
        assert torch.equal(out, greedy_by_hand(as_float(floats, model) if kernel == "native" else model, idx, 12))


@pytest.mark.skipif(not bfloat16_products_supported(), reason="this CPU has no native bfloat16 products")
@pytest.mark.parametrize("kernel", ["bfloat16", pytest.param("native", marks=NATIVE)])
@pytest.mark.parametrize("option", ["gpt2", "swiglu", "modern"])
def test_bfloat16_fused_steps_run_on_bfloat16_weights_near_the_float32_forward(monkeypatch, tiny_config, option,
                                                                              kernel):
    """Under bfloat16 autocast generation copies the weights in bfloat16 and runs the fused step (not the model's
    autocast forward); its logits stay within bfloat16's rounding of the float32 model's. decode.c's products
    (kernel native) are the float32 model on weights and inputs rounded to bfloat16, to float32's rounding."""
    monkeypatch.setattr(nanogpt.cpu, "BFLOAT16_KERNEL", kernel)
    model = sharp32(replace(tiny_config, **OPTIONS[option]))
    rounded = copy.deepcopy(model)
    for m in rounded.modules():
        if isinstance(m, torch.nn.Linear):  # a new parameter: a tied embedding keeps its float32 table
            m.weight = torch.nn.Parameter(m.weight.detach().bfloat16().float())
    rounding_inputs(rounded, lambda x: x.bfloat16().float())
    calls, packs = [], []
    real, real_pack = FusedStep.__call__, fused_step.Product.__init__
    monkeypatch.setattr(FusedStep, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    monkeypatch.setattr(fused_step.Product, "__init__", lambda self, *a: real_pack(self, *a) or packs.append(self.kind))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full, _ = model(idx)
        exact, _ = rounded(idx)
        with torch.autocast("cpu", torch.bfloat16):
            logits = []
            generate(model, idx[:, :5], 11, temperature=0,
                     on_step=lambda report: logits.append(report["logits"].float()))
    assert len(calls) == 10 and set(packs) == {kernel}
    # teacher-forced comparison is the greedy one's first step; each later step continues its own tokens
    scale = full[:, 4].abs().max().item()
    torch.testing.assert_close(logits[0], full[:, 4], atol=0.03 * scale, rtol=0)
    if kernel == "native":  # every position by the fused step: the cache holds its keys, not the forward's
        cache = KVCache(model.config, 2, "cpu", torch.float32)
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16), nanogpt.cpu.decoding(model, 2) as step:
            for t in range(16):
                scale = exact[:, t].abs().max().item()
                torch.testing.assert_close(step(idx[:, t], cache)[:, 0], exact[:, t], atol=2e-5 * scale, rtol=1e-5)
        assert len(calls) == 26


def test_the_fused_step_steps_aside_when_autocast_changes(tiny_config):
    model = sharp32(tiny_config)
    with torch.inference_mode(), packed_weights(model, 1) as packed:
        step = FusedStep.build(model, packed)
        assert step.valid()
        with torch.autocast("cpu", torch.bfloat16):
            assert not step.valid()  # its weights are float32: the model's autocast forward runs


@pytest.mark.parametrize("kind,option", [("gpt2", "gpt2"), ("llama", "modern_swiglu"), ("qwen3", "qwen3")])
def test_q8_0_gguf_holds_exactly_the_int8_rows(tmp_path, kind, option):
    """Every linear layer in the file, read back by gguf's own Q8_0 dequantizer, equals quantize.py's int8 weights
    (llama and qwen3 split q, k, v and gate, up, and qwen3 reorders q and k: rows moved, not requantized)."""
    gguf = pytest.importorskip("gguf")
    from nanogpt.interop.gguf_file import write_gguf
    from nanogpt.interop.llama import to_halves
    from nanogpt.tokenizer import CharTokenizer
    options = {"gpt2": dict(bias=True),
               "modern_swiglu": dict(pos_emb="rope", norm="rmsnorm", activation="swiglu", bias=False, n_kv_head=1),
               "qwen3": dict(pos_emb="rope", norm="rmsnorm", activation="swiglu", bias=False, qk_norm=True,
                             tie_weights=False)}[option]
    base = sharp32(GPTConfig(block_size=16, vocab_size=40, n_layer=2, n_head=2, n_embd=64, dropout=0.0, **options))
    tok = CharTokenizer([chr(97 + i) for i in range(26)] + [chr(0x4E00 + i) for i in range(14)])
    path = str(tmp_path / "m.gguf")
    write_gguf(base, tok, kind, path, "test", "int8")
    q = quantize(copy.deepcopy(base), "int8")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def read(name):
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, name
        return torch.from_numpy(gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q8_0).copy())
    c = base.config
    assert torch.equal(read("output.weight"), q.lm_head.dequantized())
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    for i, block in enumerate(q.transformer.h):
        qkv, fc = block.attn.c_attn.dequantized(), block.mlp.c_fc.dequantized()
        assert torch.equal(read(f"blk.{i}.attn_output.weight"), block.attn.c_proj.dequantized())
        assert torch.equal(read(f"blk.{i}.ffn_down.weight"), block.mlp.c_proj.dequantized())
        if kind == "gpt2":
            assert torch.equal(read(f"blk.{i}.attn_qkv.weight"), qkv)
            assert torch.equal(read(f"blk.{i}.ffn_up.weight"), fc)
            continue
        wq, wk, wv = qkv.split([c.n_head * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim])
        reorder = (lambda t, n: to_halves(t, n)) if kind == "qwen3" else (lambda t, n: t)
        assert torch.equal(read(f"blk.{i}.attn_q.weight"), reorder(wq, c.n_head))
        assert torch.equal(read(f"blk.{i}.attn_k.weight"), reorder(wk, c.kv_heads))
        assert torch.equal(read(f"blk.{i}.attn_v.weight"), wv)
        gate, up = fc.chunk(2)
        assert torch.equal(read(f"blk.{i}.ffn_gate.weight"), gate)
        assert torch.equal(read(f"blk.{i}.ffn_up.weight"), up)


def test_sample_py_quantize_int8_writes_the_int8_models_greedy_text(char_dataset, tmp_path):
    """--quantize=int8 through the real program: its greedy text is the quantized model's (held to the uncached
    forward), the prompt included; export.py writes the same weights as Q8_0."""
    from conftest import run_script
    from nanogpt.source import Source, load_model
    from train import TrainConfig, train
    out = tmp_path / "out"
    train(TrainConfig(out_dir=str(out), dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32, block_size=32,
                      batch_size=4, gradient_accumulation_steps=1, max_iters=30, eval_interval=30, eval_iters=2,
                      learning_rate=1e-2, device="cpu"), log=lambda *a: None)
    r = run_script(["sample.py", f"--out_dir={out}", "--quantize=int8", "--start=All:", "--temperature=0",
                    "--max_new_tokens=20", "--device=cpu"])
    assert r.returncode == 0, r.stderr
    model, tokenizer = load_model(Source(out_dir=str(out), quantize="int8"))
    assert isinstance(model.lm_head, Int8Linear)
    ids = torch.tensor([tokenizer.encode("All:")])
    with torch.inference_mode():
        want = tokenizer.decode(greedy_by_hand(model, ids, 20)[0].tolist())
    assert r.stdout.split("\n---------------")[0] == want
    gguf = pytest.importorskip("gguf")
    r = run_script(["export.py", f"--out_dir={out}", "--format=gguf", "--quantize=int8", f"--gguf_file={tmp_path}/q.gguf"])
    assert r.returncode == 0, r.stderr
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors}
    assert types["output.weight"] == types["blk.1.ffn_down.weight"] == "Q8_0" and types["token_embd.weight"] == "F32"
