"""bench.py on a tiny config: every figure present and sane, the FLOP count worked by hand."""
import json
from dataclasses import replace

import pytest
import torch

from bench import BenchConfig, bench, decode_bytes_per_token, serve_figures
from model import GPT
from nanogpt.tokenizer import read_meta


def test_bench_reports_every_figure(tmp_path, char_dataset):
    out = tmp_path / "bench.json"
    cfg = BenchConfig(dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4,
                      gradient_accumulation_steps=1, device="cpu", bench_iters=4, bench_warmup=2, new_tokens=20,
                      gen_batch=4, json=str(out))
    lines = []
    result = bench(cfg, log=lines.append)
    assert json.loads(out.read_text()) == result
    for key in ("peak_flops", "read_bandwidth", "plain_ms", "train_ms", "uncached_tok_s", "cached_tok_s",
                "batched_tok_s", "matmuls_tok_s", "bandwidth_bound_tok_s"):
        assert result[key] > 0, key
    assert 0 < result["plain_mfu"] < 1
    assert any(line.startswith("train.py loop") for line in lines)
    # 6 FLOPs per parameter per token, plus attention's 12 * layers * heads * head_dim * block_size
    model = GPT(cfg.model_config(vocab_size=read_meta(str(char_dataset))["vocab_size"]))
    n = model.get_num_params()
    assert result["params"] == n
    assert result["flops_per_token"] == 6 * n + 12 * 2 * 2 * 16 * 16


def test_decode_bytes_count_each_weight_once_plus_the_cache(tiny_config):
    model = GPT(tiny_config)
    c = tiny_config  # tied head: wte's matrix is read whole by the head; wpe gives one row
    weights = (sum(p.numel() for p in model.parameters()) - c.block_size * c.n_embd + c.n_embd) * 4
    # block 16, 100 tokens from a 1-token prompt: contexts 1..16, then 8..16 (the window keeps its last half)
    # nine times over and 8, 9, 10: (136 + 9 * 108 + 27) / 100 = 11.35 positions on average
    cache = 2 * tiny_config.n_layer * tiny_config.n_head * tiny_config.head_dim * 11.35 * 4
    assert decode_bytes_per_token(model, 100) == pytest.approx(weights + cache)
    untied = GPT(replace(tiny_config, tie_weights=False))  # the embedding gives one row, the head reads all of its own
    rows = sum(p.numel() for p in untied.parameters()) - (c.block_size + c.vocab_size) * c.n_embd + 2 * c.n_embd
    assert decode_bytes_per_token(untied, 100) == pytest.approx(rows * 4 + cache)
    linears = [m for m in untied.modules() if isinstance(m, torch.nn.Linear)]
    saved = sum(m.weight.numel() * 3 - m.out_features * 2 for m in linears)  # int8 rows and their 2-byte scales
    assert decode_bytes_per_token(untied, 100, 1) == pytest.approx(rows * 4 + cache - saved)
    assert decode_bytes_per_token(untied, 100, 2) == pytest.approx(rows * 4 + cache - sum(m.weight.numel() * 2 for m in linears))


def test_bench_serve_reports_first_token_and_speed_per_client(char_dataset):
    pytest.importorskip("openai")
    pytest.importorskip("starlette")
    cfg = BenchConfig(dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32, block_size=32, device="cpu",
                      only="serve", new_tokens=20, gen_batch=3)
    lines = []
    result = bench(cfg, log=lines.append)
    figures = result["serve"]
    assert sorted(figures) == [1, 3]
    assert all(f["ttft_ms"] > 0 and f["tok_s_per_client"] > 0 and f["aggregate_tok_s"] > 0 for f in figures.values())
    assert any(line.startswith("serve.py, 3 clients") for line in lines)
    assert figures[1]["tok_s_per_client"] == pytest.approx(figures[1]["aggregate_tok_s"])  # one client: one rate
    # the dataset has a train split: 3 clients asking for copies (serve_client refuses an answer without them)
    assert sorted(result["serve_copies"]) == ["copies_tok_s", "plain_tok_s"]
    assert any(line.startswith("serve.py, 3 clients asking for copies") for line in lines)


def test_serve_figures_measure_per_client_and_in_all_over_spans_that_start_at_a_request():
    """Worked by hand: one client's rate is the same per client and in all; two overlapping clients."""
    one = serve_figures([(10.0, 10.5, 12.0, 100)])  # 100 tokens from the request at 10 s to the last at 12 s
    assert one == pytest.approx({"ttft_ms": 500.0, "tok_s_per_client": 50.0, "aggregate_tok_s": 50.0})
    two = serve_figures([(0.0, 0.1, 2.0, 100), (0.5, 0.7, 3.0, 150)])  # 50 and 60 tok/s; 250 tokens in 3 s
    assert two == pytest.approx({"ttft_ms": 150.0, "tok_s_per_client": 55.0, "aggregate_tok_s": 250 / 3})


STUB_NANOGPT = '''
import sys
from dataclasses import dataclass
sys.path.insert(0, {root!r})
import model as ours


@dataclass
class GPTConfig:  # nanoGPT's fields and defaults
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(ours.GPT):  # its generate(idx, max_new_tokens, temperature, top_k) is nanoGPT's call
    def __init__(self, config):
        print("number of parameters: printed, as nanoGPT does")
        super().__init__(ours.GPTConfig(**vars(config)))
        self.loaded = None

    def load_state_dict(self, state, strict=True):
        self.loaded = state
        return super().load_state_dict(state, strict=strict)
'''


def test_bench_times_nanogpts_generate_on_the_same_weights(tmp_path, char_dataset, monkeypatch):
    """--nanogpt=DIR loads DIR/model.py, gives its GPT our weights, and times both with nanoGPT's sampling."""
    import bench as bench_module
    from configurator import UserError
    from conftest import ROOT  # not tests.conftest: an installed package may own the name "tests"
    checkout = tmp_path / "nanoGPT"
    checkout.mkdir()
    (checkout / "model.py").write_text(STUB_NANOGPT.format(root=ROOT))
    cfg = BenchConfig(dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32, block_size=16, device="cpu",
                      only="generate", new_tokens=20, gen_batch=2, gen_repeats=2, nanogpt=str(checkout))
    theirs = []
    real = bench_module.nanogpt_model
    monkeypatch.setattr(bench_module, "nanogpt_model", lambda *a: theirs.append(real(*a)) or theirs[-1])
    lines = []
    result = bench(cfg, log=lines.append)
    assert result["nanogpt_tok_s"] > 0 and result["ours_sampled_tok_s"] > 0
    assert any(line.startswith("nanoGPT's generate") for line in lines)
    assert not any("number of parameters" in line for line in lines)
    (model,) = theirs
    torch.manual_seed(cfg.seed)  # bench's own model, built again: nanoGPT's holds exactly its weights
    ours = GPT(cfg.model_config(vocab_size=read_meta(str(char_dataset))["vocab_size"]))
    assert model.loaded is not None and model.config.n_embd == 32
    for name, tensor in ours.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, atol=0, rtol=0)
    with pytest.raises(UserError, match="no model.py there"):
        bench(replace(cfg, nanogpt=str(tmp_path)), log=lines.append)
    with pytest.raises(UserError, match="GPT-2-style models only"):
        bench(replace(cfg, pos_emb="rope"), log=lines.append)


@pytest.mark.parametrize("keys", [dict(), dict(packed_linear=False), dict(matmul_dtype="bfloat16")],
                         ids=["default", "packed_linear-False", "matmul_dtype-bfloat16"])
def test_the_plain_loop_runs_the_products_train_py_runs(tmp_path, char_dataset, monkeypatch, keys):
    """Per iteration bench's plain loop calls kernels.py's training products exactly as often as train.py's
    loop for the same config, so that the two figures differ by train.py's loop alone."""
    import bench as bench_module
    from nanogpt.cpu import kernels
    from train import TrainConfig, train
    if keys.get("matmul_dtype") == "bfloat16" and not kernels.bfloat16_products_supported():
        pytest.skip("this CPU has no native bfloat16")
    calls = []
    for function in (kernels.PackedLinear, kernels.BFloat16Linear):
        monkeypatch.setattr(function, "apply", lambda *a, f=function, apply=function.apply: calls.append(f.__name__)
                            or apply(*a))
    tiny = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=2, gradient_accumulation_steps=2,
                device="cpu", dataset=str(char_dataset), **keys)
    train(TrainConfig(**tiny, max_iters=1, eval_iters=1, out_dir=str(tmp_path / "out")), log=lambda *a: None)
    in_train, calls[:] = list(calls), []
    cfg = BenchConfig(**tiny, bench_iters=1, bench_warmup=0)
    model = GPT(cfg.model_config(vocab_size=read_meta(str(char_dataset))["vocab_size"]))
    bench_module.plain_loop_ms(cfg, model, torch.device("cpu"), torch.float32, log=lambda *a: None)
    assert calls == in_train
    assert len(in_train) == (0 if keys.get("packed_linear") is False else 2 * 9)  # 2 micro-batches x 9 linear layers


def test_bench_against_llama_cpp_says_plainly_when_it_is_missing(tmp_path, char_dataset, monkeypatch):
    import nanogpt.interop.llamacpp_run as run
    monkeypatch.setattr(run, "available", lambda: False)
    cfg = BenchConfig(dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32, block_size=16, device="cpu",
                      only="llama")
    lines = []
    result = bench(cfg, log=lines.append)
    assert result["llama_cpp"] is None
    assert any(line.startswith("llama.cpp") and "not installed, nothing compared" in line for line in lines)
    from nanogpt.cpu import native  # which of decode.c's loops ours ran, or why none
    assert result["decode_c"] == native.vector_loops()
    assert any(line.startswith("decode.c") and (native.vector_loops() or native.why()) in line for line in lines)


@pytest.mark.skipif(not __import__("importlib").util.find_spec("llama_cpp"), reason="needs llama-cpp-python")
def test_bench_against_llama_cpp_times_both_on_the_same_weights(tmp_path, char_dataset):
    """Every precision, 1 and gen_batch streams: both decode, and in float32 llama.cpp writes our greedy tokens
    (the export is exact)."""
    cfg = BenchConfig(dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32, block_size=32, device="cpu",
                      only="llama", new_tokens=20, gen_batch=2, llama_threads="1", llama_repeats=2)
    lines = []
    result = bench(cfg, log=lines.append)
    figures = result["llama_cpp"]
    assert {(f["precision"], f["streams"]) for f in figures} >= {("float32", 1), ("float32", 2), ("int8", 1)}
    assert all(f["ours_tok_s"] > 0 and f["llama_cpp_tok_s"] > 0 for f in figures)
    assert all(f["same_tokens"] == 20 for f in figures if f["precision"] == "float32")
    for f in figures:  # one stream: a bound timed in the same rounds, at or above its median
        if f["streams"] == 1:
            assert f["bandwidth_bound_best_tok_s"] >= f["bandwidth_bound_tok_s"] > 0 and f["read_bytes"] > 0
            assert f["ours_best_tok_s"] >= f["ours_tok_s"]
    assert sum(line.startswith(("float32", "bfloat16", "int8")) for line in lines) == len(figures)
