"""nanogpt/cpu/native.py and decode.c: the few-row products against float64, and how the library is built and
found. (The whole block step is held to the model's uncached forward for every option in test_fused_step.py.)"""
import os
import re
import stat
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nanogpt.cpu import native
from test_quantize import int16_rows

NATIVE = pytest.mark.skipif(not native.available(), reason=f"no native products here: {native.why()}")
ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "relu2": lambda y: F.relu(y) ** 2, "gelu": F.gelu,
               "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


def reference(x, weight, scale, bias, residual, act, width):
    """The product in float64 from the numbers the kernel reads: x rounded as the kind rounds it, the weight's
    first width columns times their scale."""
    w = weight[:, :width].double()
    if weight.dtype == torch.int8:
        x, w = int16_rows(x), w * scale.double()[:, None]
    elif weight.dtype == torch.bfloat16:
        x = x.bfloat16()
    y = x.double() @ w.t()
    if bias is not None:
        y = y + bias.double()
    y = ACTIVATIONS[act](y)
    return y if residual is None else y + residual.double()


@NATIVE
@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("rows", [1, 3, 5, 9])
@pytest.mark.parametrize("out_features,in_features", [(7, 40), (65, 384), (130, 1536), (33, 100), (300, 48)])
@pytest.mark.parametrize("threads", [1, 2])
def test_products_match_float64(kind, rows, out_features, in_features, threads):
    """Every kind, rows past each block of 4, widths off every vector's multiple (40, 100), outputs off the 4 rows
    summed together (7, 65, 33), more sums than a thread keeps on its stack (9 x 300), split over two threads:
    within float32's rounding of the float64 product."""
    g = torch.Generator().manual_seed(rows * 1000 + in_features)
    x = torch.randn(rows, in_features, generator=g) * 3
    w = torch.randn(out_features, in_features, generator=g)
    scale = None
    if kind == torch.int8:
        w, scale = torch.randint(-127, 128, w.shape, generator=g, dtype=torch.int8), torch.rand(out_features, generator=g)
    else:
        w = w.to(kind)
    bias, residual = torch.randn(out_features, generator=g), torch.randn(rows, out_features, generator=g)
    given = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for act in ACTIVATIONS:
            y = native.Weight(w, scale, bias)(x, act, residual)
            expected = reference(x, w, scale, bias, residual, act, in_features)
            assert y.dtype == torch.float32 and y.shape == (rows, out_features)
            torch.testing.assert_close(y.double(), expected, atol=2e-6 * expected.abs().max().item(), rtol=1e-5)
        plain = native.Weight(w, scale)(x)  # no bias, activation or residual
        torch.testing.assert_close(plain.double(), reference(x, w, scale, None, None, None, in_features),
                                   atol=2e-6 * plain.abs().max().item(), rtol=1e-5)
    finally:
        torch.set_num_threads(given)


@NATIVE
def test_int8_rows_padded_past_the_width_read_only_the_width():
    """Int8Linear pads its rows to 16 values: a product reads the first `width` of each (the rest is not zero here)."""
    g = torch.Generator().manual_seed(0)
    w, scale = torch.randint(-127, 128, (10, 48), generator=g, dtype=torch.int8), torch.rand(10, generator=g)
    x = torch.randn(2, 40, generator=g)
    y = native.Weight(w, scale, width=40)(x)
    torch.testing.assert_close(y.double(), reference(x, w, scale, None, None, None, 40), atol=1e-4, rtol=1e-5)


@NATIVE
def test_int8_sums_past_32_bits_stay_exact():
    """The largest products, 9,000 columns of them, rows of -128 and 127 alternating: a block of four rows (each
    row's 16 lanes summed in 32 bits, the four in one set of shuffles, in order) and a fifth alone. 32-bit sums of a
    row would overflow past 512 columns (decode.c's INT_BLOCK)."""
    x = torch.full((1, 9000), 5.0)
    top = torch.tensor([-128, 127, -128, 127, -128])
    w = top[:, None].expand(5, 9000).to(torch.int8).contiguous()
    y = native.Weight(w, torch.ones(5))(x)
    torch.testing.assert_close(y, 5.0 * 9000 * top[None].float(), rtol=1e-6, atol=0)


@NATIVE
def test_inputs_in_another_dtype_or_layout_are_read_as_float32_rows():
    w = torch.randn(8, 32)
    x = torch.randn(32, 2).t()  # not contiguous
    torch.testing.assert_close(native.Weight(w)(x), x @ w.t(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(native.Weight(w)(x.bfloat16()), x.bfloat16().float() @ w.t(), atol=1e-5, rtol=1e-5)


def test_no_compiler_means_pytorchs_products_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_library", {})
    monkeypatch.setenv("NANOGPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert not native.available() and "did not compile" in native.why()
    monkeypatch.setattr(native, "_library", {})
    monkeypatch.setenv("NANOGPT_NATIVE", "0")
    assert not native.available() and native.why() == "NANOGPT_NATIVE=0"


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler")
def test_a_function_the_compiler_does_not_declare_fails_the_build_not_the_load(monkeypatch, tmp_path):
    """A call the headers do not declare (GCC 10's immintrin.h has no __rdtsc) is only a warning by default: the
    library would build with the name unresolved, fail as it loads, and leave decoding on PyTorch's products with
    a misleading reason. Every set of flags makes it an error, so the build says so."""
    source = tmp_path / "decode.c"
    source.write_text("int matvec_vector(void) { return not_declared_anywhere(); }\n")
    monkeypatch.setattr(native, "SOURCE", str(source))
    with pytest.raises(OSError, match="not_declared_anywhere"):  # the compiler's error, not its summary line
        native.build(native.compiler(), str(tmp_path))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".so")]


@NATIVE
def test_nanogpt_native_avx2_builds_the_avx2_loops(monkeypatch, tmp_path):
    """NANOGPT_NATIVE=avx2 builds decode.c without AVX-512, so that a CPU which has it runs (and tests) the loops
    most laptops run; the library it builds is its own, beside the other."""
    monkeypatch.setenv("NANOGPT_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_library", {})
    monkeypatch.setenv("NANOGPT_NATIVE", "avx2")
    assert native.vector_loops() == "AVX2"
    monkeypatch.setattr(native, "_library", {})
    monkeypatch.delenv("NANOGPT_NATIVE")
    assert native.vector_loops() in ("AVX2", "AVX-512") and len(os.listdir(tmp_path)) == 2


@pytest.mark.skipif(native.vector_loops() != "AVX-512", reason="this CPU runs the AVX2 loops: the file tests them")
def test_the_avx2_loops_pass_this_files_tests_and_the_fused_steps_on_a_cpu_with_avx512(tmp_path):
    """On a CPU with AVX-512 the rest of this suite tests decode.c's AVX-512 loops only. The AVX2 ones (a CPU
    without AVX-512) are held to the same references here: these tests again, in a process built with
    NANOGPT_NATIVE=avx2."""
    env = {**os.environ, "NANOGPT_NATIVE": "avx2", "NANOGPT_CACHE": str(tmp_path)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-x", "tests/test_native.py",
                          "tests/test_fused_step.py", "-k", "not avx2_loops and not built_once"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    passed = re.search(r"(\d+) passed", run.stdout)
    assert run.returncode == 0 and passed and int(passed.group(1)) >= 200, run.stdout[-3000:] + run.stderr[-2000:]


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler")
def test_the_library_is_built_once_and_only_loaded_from_a_directory_only_this_user_may_write(monkeypatch, tmp_path):
    """Built into the cache directory and reused from there; a directory others may write to (where another
    user's file would run as this one) is not read: the library is built in a private temporary one instead."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("NANOGPT_CACHE", str(cache))
    monkeypatch.delenv("NANOGPT_NATIVE", raising=False)
    monkeypatch.setattr(native, "_library", {})
    assert native.library() is not None
    built = sorted(os.listdir(cache))
    assert len(built) == 1 and built[0].startswith("decode-") and stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    with monkeypatch.context() as m:
        m.setattr(native.subprocess, "run", lambda *a, **k: pytest.fail("compiled again"))
        m.setattr(native, "_library", {})
        assert native.library() is not None  # reused
    os.chmod(cache, 0o777)
    (cache / built[0]).write_bytes(b"not a library")  # what another user could have put there
    monkeypatch.setattr(native, "_library", {})
    assert native.library() is not None  # compiled elsewhere: the planted file was not loaded
    assert (cache / built[0]).read_bytes() == b"not a library"


@NATIVE
@pytest.mark.parametrize("option", ["gpt2", "rope", "gqa", "modern"])
def test_sequences_at_their_own_positions_decode_on_native_blocks_as_if_alone(monkeypatch, tiny_config, option):
    """The serving engine's rows, each at its own position in its own slot, through decode.c's block step: 6
    sequences through 3 slots joining at different steps, greedy, each as the uncached model writes it alone."""
    from dataclasses import replace

    import nanogpt.cpu
    from nanogpt.engine import Sequence
    from test_engine import LENGTHS, PROMPTS, Tokens, alone, drive, engine_for
    from test_fused_step import sharp32
    from test_model_options import OPTIONS
    monkeypatch.setattr(nanogpt.cpu, "FLOAT32_KERNEL", "native")
    calls, real = [], native.model_step
    monkeypatch.setattr(native, "model_step", lambda *a: calls.append(a[1].size(0)) or real(*a))
    model = sharp32(replace(tiny_config, **OPTIONS[option]))
    sinks, joins = [], [[] for _ in range(8)]
    for i, (ids, n) in enumerate(zip(PROMPTS, LENGTHS)):
        sinks.append((Tokens(), ids, n))
        joins[i if i < 3 else i + 2].append(Sequence(ids, n, sinks[-1][0], temperature=0.0))
    engine = engine_for(model)
    with nanogpt.cpu.decoding(model, 3) as engine.decode:  # as Engine.run() holds it
        drive(engine, joins)
    assert max(calls) == 3  # batched steps ran on decode.c's whole step
    for sink, ids, n in sinks:
        assert sink.reason == "length" and sink.tokens == alone(model, ids, n)


@NATIVE
def test_a_token_outside_the_vocabulary_is_refused_before_any_read(tiny_config):
    """decode.c reads the embedding table by address: a token id past it would read other memory. It raises as the
    model's own embedding lookup does, and the cache is not advanced."""
    from model import GPT
    from nanogpt.cpu.fused_step import FusedStep
    from nanogpt.generate import KVCache
    model = GPT(tiny_config).eval()
    step = FusedStep.build(model, {}, torch.float32, "native", "native")
    assert step.layers is not None
    cache = KVCache(model.config, 2, "cpu", torch.float32)
    for bad in (tiny_config.vocab_size, -1):
        with pytest.raises(IndexError, match="vocabulary"):
            step(torch.tensor([1, bad]), cache)
        with pytest.raises(IndexError):
            model(torch.tensor([[1], [bad]]))
    assert cache.pos == 0
    assert step(torch.tensor([1, 2]), cache).shape == (2, 1, tiny_config.vocab_size) and cache.pos == 1


@NATIVE
@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, torch.int8])
def test_a_nan_input_gives_nan_outputs(kind):
    """As a float product would: not a finite number made of a NaN (int8's scale, an activation's max)."""
    w = torch.randn(8, 32)
    scale = None
    if kind == torch.int8:
        w, scale = torch.ones(8, 32, dtype=torch.int8), torch.ones(8)
    x = torch.randn(2, 32)
    x[0, 5] = float("nan")
    for act in ACTIVATIONS:
        y = native.Weight(w.to(kind) if kind != torch.int8 else w, scale)(x, act)
        assert y[0].isnan().all() and not y[1].isnan().any(), act
    x[0, 5] = float("inf")  # no finite number either: int8's scale had made it -32768, outputs of the wrong sign
    y = native.Weight(w.to(kind) if kind != torch.int8 else w, scale)(x)
    assert not y[0].isfinite().any() and y[1].isfinite().all()
    if kind == torch.int8:  # its weights all 1: a float product is +inf
        assert not (y[0] == -torch.inf).any()


@NATIVE
def test_a_long_context_over_two_threads_matches_the_uncached_forward(monkeypatch):
    """Past 1,024 positions (the scores leave the stack) and with the step's team of two threads (each a share of
    every product, and of the heads): each step's logits as the uncached forward's."""
    import nanogpt.cpu
    from model import GPT, GPTConfig
    from nanogpt.generate import KVCache
    from test_fused_step import sharp32
    monkeypatch.setattr(nanogpt.cpu, "FLOAT32_KERNEL", "native")
    model = sharp32(GPTConfig(block_size=1100, vocab_size=64, n_layer=1, n_head=2, n_embd=64, dropout=0.0,
                              bias=True, pos_emb="rope"))
    idx = torch.randint(0, 64, (2, 1100), generator=torch.Generator().manual_seed(0))
    given = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            full, _ = model(idx)
            cache = KVCache(model.config, 2, "cpu", torch.float32)
            with nanogpt.cpu.decoding(model, 2) as step:
                for t in range(1100):
                    logits = step(idx[:, t], cache)[:, 0]
                    if t in (0, 511, 1023, 1024, 1099):
                        torch.testing.assert_close(logits, full[:, t], atol=2e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(given)


@NATIVE
def test_a_cache_that_does_not_fit_the_step_is_refused(tiny_config):
    """More tokens than the cache has rows: decode.c would read and write past them."""
    from model import GPT
    from nanogpt.cpu.fused_step import FusedStep
    from nanogpt.generate import KVCache
    model = GPT(tiny_config).eval()
    step = FusedStep.build(model, {}, torch.float32, "native", "native")
    with pytest.raises(ValueError, match="does not fit"):
        step(torch.tensor([1, 2]), KVCache(model.config, 1, "cpu", torch.float32))


@NATIVE
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("n_kv_head,rows", [(None, 3), (2, 2), (1, 1)])
def test_two_threads_give_one_threads_step_bit_for_bit(quantized, n_kv_head, rows):
    """decode.c's step splits each product's rows and the heads between its threads, each thread's share of the
    rows in proportion to the rate it read its last share at: where a split falls must change nothing. Twenty steps
    on two threads, their shares moving, give one thread's logits and cache bit for bit (a row no thread summed, or
    read before the product it comes from was whole, would not): heads by their groups (MHA, GQA) and, with fewer
    groups than threads, every head placed before any attends (MQA, one row)."""
    from model import GPTConfig
    from nanogpt.cpu.fused_step import FusedStep
    from nanogpt.generate import KVCache
    from nanogpt.quantize import quantize
    from test_fused_step import sharp32
    model = sharp32(GPTConfig(block_size=32, vocab_size=96, n_layer=2, n_head=4, n_kv_head=n_kv_head, n_embd=64,
                              dropout=0.0, bias=True, pos_emb="rope"))
    if quantized:
        quantize(model, "int8")
    tokens = torch.randint(0, 96, (20, rows), generator=torch.Generator().manual_seed(0))
    given, seen = torch.get_num_threads(), {}
    try:
        with torch.inference_mode():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                step = FusedStep.build(model, {}, torch.float32, "native", "native")
                assert step.layers is not None  # decode.c's whole step
                cache = KVCache(model.config, rows, "cpu", torch.float32)
                logits = torch.stack([step(t, cache)[:, 0] for t in tokens])
                seen[threads] = logits, cache.k[..., :len(tokens), :].clone(), cache.v[..., :len(tokens), :].clone()
    finally:
        torch.set_num_threads(given)
    for one, two in zip(seen[1], seen[2]):
        assert torch.equal(one, two)
