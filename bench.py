"""Measure speed: the device's peaks, training ms/iter and MFU, generation tokens/s.

    python bench.py config/shakespeare_char_cpu.py
    python bench.py config/shakespeare_char.py --device=cpu --only=generate --json=bench.json
    python bench.py config/shakespeare_char.py --device=cpu --only=memory --processes=2
    python bench.py config/shakespeare_char_cpu.py --only=serve    # serve.py: needs pip install -r requirements-dev.txt
    python bench.py config/shakespeare_char.py --device=cpu --only=llama --json=llama.json  # against llama.cpp

Prints a table and, with --json, writes the same figures as JSON. Timings are
medians after warm-up; compare figures measured in one run, not across runs.
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import contextlib
import copy
import importlib.util
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields

import torch

from configurator import parse_args
from model import GPT
from nanogpt import cpu
from nanogpt.checkpoint import model_args, save_checkpoint
from nanogpt.cpu import native
from nanogpt.cpu.heap import keep_freed_memory
from nanogpt.cpu.kernels import bfloat16_products_supported, onednn_available, pack, packed_product
from nanogpt.dataset import dataset_dir
from nanogpt.device import autocast, resolve_device, resolve_dtype, should_compile, sync, training_kernels
from nanogpt.errors import UserError
from nanogpt.files import open_to_write
from nanogpt.generate import generate, window_start
from nanogpt.policy_gradient import sample_answers
from nanogpt.program import run_main
from nanogpt.quantize import int8_available, quantize
from nanogpt.tokenizer import read_meta, tokenizer_from_meta
from nanogpt.training.metrics import read_log
from nanogpt.training.optim import OptimizerSettings, configure_optimizers
from nanogpt.training.plan import step_times
from nanogpt.training.train_config import TrainConfig


@dataclass
class BenchConfig(TrainConfig):
    only: str = "all"  # all (peak, train and generate), peak, train, generate; serve; memory (DDP vs FSDP)
    processes: int = 2  # memory: the number of torchrun processes compared with one
    bench_iters: int = 20  # timed training iterations (after bench_warmup)
    bench_warmup: int = 5
    new_tokens: int = 500  # generated tokens per sequence, from a 1-token prompt
    gen_batch: int = 8  # sequences decoded together for the batched figure, and clients of the serve figures
    gen_repeats: int = 3  # timed runs of each cached generation figure (the median is reported)
    nanogpt: str | None = None  # a nanoGPT checkout: also time its GPT.generate on the same weights
    llama_threads: str = "1,2"  # --only=llama: the thread counts compared
    llama_repeats: int = 5  # --only=llama: timed runs of each figure, ours and llama.cpp's alternated (medians)
    json: str | None = None  # also write the results here

    def __post_init__(self):
        super().__post_init__()
        if self.only not in ("all", "peak", "train", "generate", "serve", "memory", "llama"):
            raise ValueError(f"only must be all, peak, train, generate, serve, memory or llama, got {self.only!r}")
        if self.processes < 1:
            raise ValueError(f"processes must be at least 1, got {self.processes}")
        if self.gen_repeats < 1:
            raise ValueError(f"gen_repeats must be at least 1, got {self.gen_repeats}")


def best_time(fn, device, repeats=5):
    """Fastest of `repeats` timed calls (after one warm-up call), in seconds."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_kernels(device, dtype):
    """{name: make(n)} for every matmul kernel PyTorch offers here; make(n) prepares two n x n operands and
    returns the product to time. The default kernel in dtype, and on CPUs oneDNN's on a packed weight
    (generate.py decodes with it) in float32 and, where the CPU has fast bfloat16 (AVX-512 BF16, AMX),
    the default and packed kernels in bfloat16 too."""
    def default(t):
        def make(n):
            a, b = (torch.randn(n, n, device=device, dtype=t) for _ in range(2))
            return lambda: a @ b
        return make

    def packed(t):
        def make(n):
            a, b = (torch.randn(n, n, dtype=t) for _ in range(2))
            weight = pack(b.t().contiguous(), n, t)  # packed once, not timed
            return lambda: packed_product(a, weight)
        return make

    kernels = {f"default {str(dtype)[6:]}": default(dtype)}
    if device.type == "cpu" and onednn_available():
        types = [torch.float32] + ([torch.bfloat16] if bfloat16_products_supported() else [])
        for t in types:
            kernels.setdefault(f"default {str(t)[6:]}", default(t))
            kernels[f"oneDNN packed {str(t)[6:]}"] = packed(t)
    return kernels


def peak_matmul_flops(device, dtype, sizes=(512, 1024, 2048)):
    """{kernel: measured FLOP/s of square matmuls, the best over a few sizes}: the device's peak is the
    best of them, whichever kernel reaches it."""
    return {name: max(2 * n ** 3 / best_time(make(n), device) for n in sizes)
            for name, make in matmul_kernels(device, dtype).items()}


def read_bandwidth(device, nbytes=1 << 28):
    """Measured memory read bandwidth in bytes/s: summing a buffer far larger than any cache."""
    x = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    return nbytes / best_time(lambda: x.sum(), device)


def plain_loop_ms(cfg, model, device, dtype, log=print):
    """ms per iteration of the bare minimum: forward, backward, clip, optimizer step on random batches.

    The same computation as train.py's iteration for cfg: compiled as train.py would compile it (cfg.compile;
    None means on CUDA), the same training products (device.training_kernels) and the same optimizer, so
    that train.py's figure against this one is the cost of its loop alone (batches, logging, checkpoints).
    """
    if device.type == "cpu":
        keep_freed_memory()  # as train.py's run does
    compile = should_compile(cfg.compile, device)
    step_model = torch.compile(model) if compile else model
    kernels = training_kernels(cfg, device, dtype, compile, log=log)
    optimizer = configure_optimizers(model, OptimizerSettings.of(cfg, kernels.ns_dtype))
    with kernels.applied(model):
        return timed_steps(cfg, model, step_model, optimizer, device, autocast(device, dtype))


def timed_steps(cfg, model, step_model, optimizer, device, ctx):
    """The median ms of cfg.bench_iters iterations after cfg.bench_warmup."""
    times = step_times(model, step_model, optimizer, cfg.batch_size, cfg.block_size, cfg.gradient_accumulation_steps,
                       cfg.grad_clip, device, ctx, cfg.bench_warmup, cfg.bench_iters)
    return 1000 * statistics.median(times)


def train_loop_ms(cfg):
    """ms per iteration of train.py itself (logging, progress bar, checkpoints), from its log; None without data."""
    if not os.path.exists(os.path.join(dataset_dir(cfg.dataset), "train.bin")):
        return None
    n = cfg.bench_warmup + cfg.bench_iters
    with tempfile.TemporaryDirectory() as out:
        records = run_train(cfg, out, "the training loop", f"--max_iters={n}", f"--eval_interval={n}",
                            "--eval_iters=1", "--log_interval=1", "--init_from=scratch", "--wandb_log=False")
    return statistics.median(r["ms"] for r in records if r.get("kind") == "train" and r["iter"] > cfg.bench_warmup)


def run_train(cfg, out, what, *items, world=1):
    """Run python train.py (under torchrun for world > 1) into out with cfg's training keys that differ from
    TrainConfig's defaults, then items; its log.jsonl records. A failure is a UserError naming what."""
    default = TrainConfig()
    args = [f"--{f.name}={getattr(cfg, f.name)}" for f in fields(TrainConfig)
            if getattr(cfg, f.name) != getattr(default, f.name) and f.name != "out_dir"]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"] if world > 1 else []
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")  # paths in cfg as given here
    done = subprocess.run([sys.executable, *launcher, script, *args, *items, f"--out_dir={out}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"train.py failed while measuring {what}: {done.stderr.strip()[-500:]}")
    return read_log(os.path.join(out, "log.jsonl"))


def decode_tok_s(model, device, batch, new_tokens, use_cache=True, repeats=1, **sampling):
    """Generated tokens per second (all sequences together) from a 1-token prompt: the median of `repeats`
    timed runs after a warm-up. sampling: generate's temperature (default 0, greedy) and top_k."""
    idx = torch.zeros(batch, 1, dtype=torch.long, device=device)
    sampling = {"temperature": 0, **sampling}
    generate(model, idx, 8, use_cache=use_cache, **sampling)  # warm-up
    rates = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        generate(model, idx, new_tokens, use_cache=use_cache, **sampling)
        sync(device)
        rates.append(batch * new_tokens / (time.perf_counter() - t0))
    return statistics.median(rates)


NANOGPT_SAMPLING = dict(temperature=0.8, top_k=200)  # nanoGPT's sample.py defaults


def nanogpt_model(path, model):
    """nanoGPT's own GPT, from model.py in the checkout at path, holding model's weights."""
    file = os.path.join(path, "model.py")
    if not os.path.isfile(file):
        raise UserError(f"--nanogpt={path}: no model.py there; give the directory of a nanoGPT checkout "
                        f"(git clone https://github.com/karpathy/nanoGPT)")
    c = model.config
    gpt2_style = dict(pos_emb="learned", norm="layernorm", norm_eps=1e-5, activation="gelu", mlp_hidden=None,
                      n_kv_head=None, tie_weights=True, qk_norm=False, logit_softcap=None, value_embeds=0)
    if any(getattr(c, k) != v for k, v in gpt2_style.items()):
        raise UserError("--nanogpt compares GPT-2-style models only (learned positions, LayerNorm with eps 1e-5, "
                        "GELU, tied head, no GQA, QK-norm, soft-cap or value embeddings): nanoGPT's model has "
                        "nothing else")
    spec = importlib.util.spec_from_file_location("nanogpt_model", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        theirs = module.GPT(module.GPTConfig(block_size=c.block_size, vocab_size=c.vocab_size, n_layer=c.n_layer,
                                             n_head=c.n_head, n_embd=c.n_embd, dropout=0.0, bias=c.bias))
    missing, unexpected = theirs.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not k.endswith(".attn.bias") for k in missing):  # its causal-mask buffer, if any
        raise UserError(f"--nanogpt={path}: its model does not hold ours (missing {missing}, unexpected {unexpected})")
    return theirs.to(next(model.parameters()).device).eval()


def against_nanogpt(cfg, model, device):
    """(nanoGPT's tokens/s, ours) with nanoGPT's sampling defaults, timed alternately: medians of gen_repeats."""
    theirs = nanogpt_model(cfg.nanogpt, model)
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)
    rates = {"nanogpt": [], "ours": []}
    with torch.no_grad():
        for _ in range(cfg.gen_repeats):
            for name, run in (("nanogpt", theirs.generate), ("ours", lambda *a, **k: generate(model, *a, **k))):
                sync(device)
                t0 = time.perf_counter()
                run(idx, cfg.new_tokens, **NANOGPT_SAMPLING)
                sync(device)
                rates[name].append(cfg.new_tokens / (time.perf_counter() - t0))
    return statistics.median(rates["nanogpt"]), statistics.median(rates["ours"])


def decode_matmuls_tok_s(model, device, batch=1):
    """Tokens/s of decoding if a step were its linear layers alone, on the weights generation uses.

    The gap between this and the bandwidth bound is the matmul kernels'; the gap
    between this and the cached figure is everything else a step does.
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = [torch.randn(batch, 1, m.in_features, device=device) for m in linears]
    with cpu.decoding(model, batch), torch.inference_mode():
        seconds = best_time(lambda: [m(x) for m, x in zip(linears, xs)], device, repeats=20)
    return batch / seconds


def decode_bytes_per_token(model, new_tokens, linear_bytes=None):
    """Bytes one cached decode step reads for one sequence: every weight once, plus the cache so far (mean).
    linear_bytes: the bytes of a linear layer's weight as decoding reads it, 2 (bfloat16) or 1 (int8 rows, plus a
    2-byte scale a row), instead of its own (float32)."""
    c = model.config
    read = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    for name in ("wte", "wpe"):  # an embedding reads one row per token...
        if name in model.transformer:
            w = model.transformer[name].weight
            read[id(w)] = w.size(1) * w.element_size()
    head = model.lm_head.weight  # ...but the head, tied to wte or not, reads its whole matrix
    read[id(head)] = head.numel() * head.element_size()
    if linear_bytes is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                scales = m.out_features * 2 if linear_bytes == 1 else 0
                read[id(m.weight)] = m.weight.numel() * linear_bytes + scales
    weights = sum(read.values())
    start, context = 0, 0
    for n in range(1, 1 + new_tokens):  # from a 1-token prompt, as generate's cached path moves its window
        start = window_start(n, start, c.block_size)
        context += n - start
    mean_context = context / new_tokens
    cache = 2 * c.n_layer * c.kv_heads * c.head_dim * mean_context * 4
    return weights + cache


def held_per_process(cfg):
    """Bytes of parameters, gradients and optimizer state per process after one iteration of train.py:
    one process, then cfg.processes under torchrun with DDP and with FSDP (log.jsonl's memory record)."""
    n = cfg.processes
    args = ["--max_iters=1", "--eval_interval=1000", "--eval_iters=1", "--compile=False",
            f"--gradient_accumulation_steps={n * max(1, cfg.gradient_accumulation_steps // n)}"]
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, world, parallel in (("one process", 1, "ddp"), (f"{n} x DDP", n, "ddp"), (f"{n} x FSDP", n, "fsdp")):
            records = run_train(cfg, os.path.join(tmp, f"{parallel}{world}"), f"memory ({name})", *args,
                                f"--parallel={parallel}", world=world)
            held = next(r for r in records if r["kind"] == "memory")
            results[name] = {k: held[k] for k in ("params", "grads", "optimizer")}
            total = sum(results[name].values())
            rows.append((f"memory, {name}", f"{total / 2**20:,.1f} MiB per process (parameters "
                         f"{held['params'] / 2**20:,.1f}, gradients {held['grads'] / 2**20:,.1f}, optimizer "
                         f"{held['optimizer'] / 2**20:,.1f})"))
    return results, rows


# runs without and with "copies", in this order: the first run of a pair is measured slower than the second (by
# 20% on 2 busy cores, either way round), so each is once first and once second
PAIRED = (False, True, True, False)


def serve_client(url, prompt, max_tokens, seed, copies=False):
    """(request sent, first token, last token, tokens) of one streamed completion from serve.py's server:
    perf_counter times, taken after the client is built. copies: the request asks for the copied spans."""
    import openai
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    start, first, tokens, found = time.perf_counter(), None, 0, None
    for chunk in client.completions.create(model="bench", prompt=prompt, max_tokens=max_tokens, seed=seed, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"copies": True} if copies else None):
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter()
        found = found or (chunk.choices and getattr(chunk.choices[0], "copies", None))
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    if copies and found is None:
        raise UserError("serve.py sent no copies for a request that asked for them")
    return start, first, time.perf_counter(), tokens


def serve_figures(runs):
    """The median time to first token (ms); tokens/s per client, each client's tokens over its own time from
    request to last token (median); and in all, every client's tokens over the time from the first request to
    the last token. Both spans start at a request: with one client the two rates are equal."""
    return {"ttft_ms": 1000 * statistics.median(first - start for start, first, _, _ in runs),
            "tok_s_per_client": statistics.median(tokens / (end - start) for start, _, end, tokens in runs),
            "aggregate_tok_s": sum(r[3] for r in runs) / (max(r[2] for r in runs) - min(r[0] for r in runs))}


def bench_serve(model, tokenizer, meta, cfg):
    """python serve.py on model's weights (a checkpoint written for it, naming cfg.dataset): serve_figures for 1
    and for cfg.gen_batch concurrent openai clients, each streaming cfg.new_tokens from a 1-token prompt; and,
    where the dataset has a train split, cfg.gen_batch clients' tokens/s in all without and with "copies"
    (the median of gen_repeats, each the mean of two runs, placed without-with-with-without), or None."""
    from concurrent.futures import ThreadPoolExecutor
    clients, prompt = cfg.gen_batch, tokenizer.decode([0])
    max_tokens = min(cfg.new_tokens, model.config.block_size - len(tokenizer.encode(prompt)))
    figures, data_dir = {}, dataset_dir(cfg.dataset)
    indexed, copies = os.path.exists(os.path.join(data_dir, "train.bin")), None  # a text to look for copies in

    def run(n, ask=False):
        with ThreadPoolExecutor(n) as pool:
            return serve_figures(list(pool.map(lambda i: serve_client(url, prompt, max_tokens, i, ask), range(n))))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench")  # serve.py names the model after its out_dir
        save_checkpoint({"model": model.state_dict(), "model_args": model_args(model.config), "tokenizer": meta,
                         "config": {"dataset": os.path.abspath(data_dir)} if indexed else {}},
                        os.path.join(out, "ckpt.pt"))
        with serving(out, cfg, clients) as url:
            serve_client(url, prompt, 8, 0, indexed)  # warm-up (and the index opened)
            for n in sorted({1, clients}):
                figures[n] = run(n)
            if indexed:
                rates = {False: [], True: []}
                for _ in range(cfg.gen_repeats):
                    runs = [(ask, run(clients, ask)["aggregate_tok_s"]) for ask in PAIRED]
                    for ask in rates:
                        rates[ask].append(statistics.mean(rate for a, rate in runs if a == ask))
                copies = {"plain_tok_s": statistics.median(rates[False]),
                          "copies_tok_s": statistics.median(rates[True])}
    return figures, copies


@contextlib.contextmanager
def serving(out_dir, cfg, clients):
    """Within: python serve.py on out_dir's checkpoint, on a free port, as a process of its own; yields its URL."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")
    with open_to_write(os.path.join(out_dir, "serve.log"), "w+") as log:
        server = subprocess.Popen([sys.executable, script, f"--out_dir={out_dir}", "--port=0", f"--device={cfg.device}",
                                   f"--dtype={cfg.dtype}", f"--max_batch={clients}", f"--max_queue={clients}"],
                                  stdout=subprocess.DEVNULL, stderr=log, text=True)
        try:
            yield server_url(server, log)
        finally:
            server.terminate()
            server.wait()


def server_url(server, log, timeout=120):
    """The base URL serve.py prints once it listens; a UserError with its last words where it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log.seek(0)
        found = re.search(r"serving \S+ on (http://\S+?)/ ", log.read())
        if found:
            return found.group(1)
        if server.poll() is not None:
            log.seek(0)
            raise UserError(f"serve.py failed while measuring serving: {log.read().strip()[-500:]}")
        time.sleep(0.05)
    raise UserError(f"serve.py did not start listening within {timeout} s")


def generation_rows(cfg, model, device, ctx, result):
    """Decoding tokens/s, uncached, cached and batched, against the bandwidth bound (into result)."""
    model.eval()
    result["read_bandwidth"] = result.get("read_bandwidth") or read_bandwidth(device)
    with ctx:
        uncached = decode_tok_s(model, device, 1, cfg.new_tokens, use_cache=False)
        cached = decode_tok_s(model, device, 1, cfg.new_tokens, repeats=cfg.gen_repeats)
        batched = decode_tok_s(model, device, cfg.gen_batch, cfg.new_tokens, repeats=cfg.gen_repeats)
        matmuls = decode_matmuls_tok_s(model, device)
        theirs = against_nanogpt(cfg, model, device) if cfg.nanogpt else None
    bound = result["read_bandwidth"] / decode_bytes_per_token(model, cfg.new_tokens)
    result.update(uncached_tok_s=uncached, cached_tok_s=cached, batched_tok_s=batched, gen_batch=cfg.gen_batch,
                  matmuls_tok_s=matmuls, bandwidth_bound_tok_s=bound, new_tokens=cfg.new_tokens)
    rows = []
    if theirs is not None:
        result.update(nanogpt_tok_s=theirs[0], ours_sampled_tok_s=theirs[1])
        rows = [("nanoGPT's generate (t=0.8, top_k=200)", f"{theirs[0]:,.1f} tok/s"),
                ("ours, the same sampling", f"{theirs[1]:,.1f} tok/s ({theirs[1] / theirs[0]:.1f}x nanoGPT)")]
    return rows + [("generate, uncached", f"{uncached:,.1f} tok/s"),
            ("generate, KV cache", f"{cached:,.1f} tok/s ({cached / uncached:.1f}x uncached, "
                                   f"{bound / cached:.2f}x from the bandwidth bound)"),
            (f"generate, KV cache, batch {cfg.gen_batch}", f"{batched:,.1f} tok/s ({batched / cached:.1f}x batch 1)"),
            ("linear layers alone, batch 1", f"{matmuls:,.1f} tok/s ({bound / matmuls:.2f}x from the bound)"),
            ("bandwidth bound, batch 1", f"{bound:,.1f} tok/s")]


def serve_rows(cfg, model, meta, result):
    """serve.py's time to first token and tokens/s with 1 and gen_batch clients (into result)."""
    figures, copies = bench_serve(model, tokenizer_from_meta(meta), meta, cfg)
    result["serve"], result["serve_copies"] = figures, copies
    one = figures[1]["aggregate_tok_s"]
    rows = [(f"serve.py, {n} client{'s' * (n > 1)}", f"first token {f['ttft_ms']:,.0f} ms, {f['tok_s_per_client']:,.1f} "
             f"tok/s per client, {f['aggregate_tok_s']:,.1f} tok/s in all ({f['aggregate_tok_s'] / one:.1f}x one client)")
            for n, f in figures.items()]
    if copies:
        rows.append((f"serve.py, {cfg.gen_batch} clients asking for copies",
                     f"{copies['copies_tok_s']:,.1f} tok/s in all against {copies['plain_tok_s']:,.1f} without "
                     f"({copies['copies_tok_s'] / copies['plain_tok_s'] - 1:+.1%}; medians of {cfg.gen_repeats})"))
    return rows


LLAMA_PRECISIONS = {"float32": None, "bfloat16": "bfloat16", "int8": "int8"}  # ours -> the GGUF's weights
LINEAR_BYTES = {"float32": None, "bfloat16": 2, "int8": 1}  # a linear weight's bytes, as decoding reads it


def ours_for(model, precision):
    """(the model, the context to decode it in) for a precision: float32 as it is, bfloat16 under bfloat16
    autocast (packed bfloat16 weights), int8 a quantized copy."""
    if precision == "int8":
        return quantize(copy.deepcopy(model), "int8"), contextlib.nullcontext()
    return model, autocast(torch.device("cpu"), torch.bfloat16 if precision == "bfloat16" else torch.float32)


def ours_greedy(model, n, streams):
    """Our greedy tokens after token 0, n of them, in `streams` sequences: one through generate (sample.py's
    path), several through the serving engine (serve.py's: each its own slot, continuous batching)."""
    if streams == 1:
        return [generate(model, torch.zeros(1, 1, dtype=torch.long), n, temperature=0)[0, 1:].tolist()]
    return sample_answers(model, [[0]], streams, [None] * streams, n, temperature=0.0)


def llama_rows(cfg, model, meta, result):
    """Ours against llama.cpp on the same weights (exported GGUFs), back to back in this process: one stream and
    gen_batch streams, greedy from one token, per precision and thread count; medians of llama_repeats."""
    from nanogpt.interop.gguf_file import write_gguf
    from nanogpt.interop.hf import hf_architecture
    from nanogpt.interop.llamacpp_run import LlamaCpp, available
    if not available():
        result["llama_cpp"] = None
        return [("llama.cpp", "not installed, nothing compared: pip install llama-cpp-python builds it from "
                              "source (40-75 min on 2 cores; docs/generation.md)")]
    c = model.config
    n = min(cfg.new_tokens, c.block_size - 1)  # llama.cpp's context is block_size: no context shift either side
    precisions = ["float32"] + ["bfloat16"] * bfloat16_products_supported() + ["int8"] * int8_available()
    kind = hf_architecture(c, "the benchmark's model")
    tokenizer = tokenizer_from_meta(meta)
    result["llama_cpp"] = []
    rows, given = [], torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for precision in precisions:
            files[precision] = os.path.join(tmp, f"{precision}.gguf")
            write_gguf(model, tokenizer, kind, files[precision], "the benchmark's model", LLAMA_PRECISIONS[precision])
        try:
            for threads in [int(t) for t in cfg.llama_threads.split(",")]:
                torch.set_num_threads(threads)
                for precision in precisions:
                    ours, ctx = ours_for(model, precision)
                    for streams in (1, cfg.gen_batch):
                        # llama.cpp's extra buffers (AMX) crash its batched Q8_0 here: batched int8 runs without them
                        theirs = LlamaCpp(files[precision], threads, c.block_size, streams,
                                          extra_buffers=not (precision == "int8" and streams > 1))
                        read = decode_bytes_per_token(model, n, LINEAR_BYTES[precision])
                        figure = compare(ours, ctx, theirs, n, streams, cfg.llama_repeats,
                                         read if streams == 1 else None)
                        theirs.close()
                        figure.update(precision=precision, threads=threads, streams=streams)
                        result["llama_cpp"].append(figure)
                        rows.append(llama_row(figure))
        finally:
            torch.set_num_threads(given)
    return rows


def compare(ours, ctx, theirs, n, streams, repeats, read=None):
    """Tokens/s (all streams together) of ours and llama.cpp, alternated, medians; and how many of the first
    stream's greedy tokens they share before they part. read: the bytes one token reads (decode_bytes_per_token),
    where the bandwidth bound is wanted (one stream): n sums over as many bytes, with these threads, timed in the same rounds
    (the machine's speed moves between minutes: a bound measured apart from the tokens it bounds moved the ratio
    by 0.1x between runs), its median tokens/s and its fastest (against ours_best_tok_s). Where the weights fit in a cache, so does the
    buffer, and the bound is the cache's."""
    rates = {"ours": [], "llama_cpp": [], "bound": []}
    tokens = {}
    runs = {"ours": lambda: ours_greedy(ours, n, streams), "llama_cpp": lambda: theirs.greedy(0, n)}
    if read is not None:
        buffer = torch.ones(int(read) // 4)
        runs["bound"] = lambda: [buffer.sum() for _ in range(n)]
    with torch.no_grad(), ctx:
        for name, run in runs.items():  # warm-up
            run()
        for _ in range(repeats):
            for name, run in runs.items():
                t0 = time.perf_counter()
                tokens[name] = run()
                rates[name].append(streams * n / (time.perf_counter() - t0))  # the bound: one stream's
    a, b = tokens["ours"][0], tokens["llama_cpp"][0]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n)
    figure = {"ours_tok_s": statistics.median(rates["ours"]), "llama_cpp_tok_s": statistics.median(rates["llama_cpp"]),
              "ours_best_tok_s": max(rates["ours"]), "new_tokens": n, "same_tokens": same}
    if read is not None:
        figure.update(read_bytes=read, bandwidth_bound_tok_s=statistics.median(rates["bound"]),
                      bandwidth_bound_best_tok_s=max(rates["bound"]))
    return figure


def llama_row(f):
    label = (f"{f['precision']}, {f['streams']} stream{'s' * (f['streams'] > 1)}, "
             f"{f['threads']} thread{'s' * (f['threads'] > 1)}")
    text = (f"ours {f['ours_tok_s']:,.0f} tok/s, llama.cpp {f['llama_cpp_tok_s']:,.0f} "
            f"({f['ours_tok_s'] / f['llama_cpp_tok_s']:.2f}x)")
    if f["streams"] == 1:
        text += (f"; ours {f['bandwidth_bound_tok_s'] / f['ours_tok_s']:.2f}x from the bandwidth bound "
                 f"(fastest pass against fastest pass: {f['bandwidth_bound_best_tok_s'] / f['ours_best_tok_s']:.2f}x)")
    return label, text + f"; greedy tokens alike: {f['same_tokens']} of {f['new_tokens']}"


def bench(cfg, log=print):
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    ctx = autocast(device, dtype)
    data_dir = dataset_dir(cfg.dataset)
    meta = read_meta(data_dir)
    if meta is None:
        log(f"note: {data_dir} has no meta.json or meta.pkl; measuring with GPT-2's vocabulary "
            f"(50304); prepare the dataset for its own")
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(vocab_size=(meta or {}).get("vocab_size", 50304))).to(device)
    result = {"device": str(device), "dtype": str(dtype)[6:], "threads": torch.get_num_threads(),
              "params": model.get_num_params(), "flops_per_token": model.flops_per_token()}
    rows = [("device", f"{device} ({result['dtype']}, {result['threads']} threads)"),
            ("parameters", f"{result['params'] / 1e6:.2f}M")]
    if cfg.only in ("all", "peak", "train"):
        kernels = peak_matmul_flops(device, dtype)
        best = max(kernels, key=kernels.get)
        result.update(peak_flops=kernels[best], peak_kernel=best, kernel_flops=kernels)
        result["read_bandwidth"] = read_bandwidth(device)
        rows += [(f"matmul, {name}", f"{flops / 1e9:,.1f} GFLOP/s") for name, flops in kernels.items()]
        rows += [("peak matmul (MFU's base)", f"{result['peak_flops'] / 1e9:,.1f} GFLOP/s ({best})"),
                 ("read bandwidth", f"{result['read_bandwidth'] / 1e9:,.1f} GB/s")]
    if cfg.only in ("all", "train"):
        tokens = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
        plain = plain_loop_ms(cfg, model, device, dtype, log)
        result.update(plain_ms=plain, tokens_per_iter=tokens, plain_tok_s=tokens / plain * 1000,
                      plain_mfu=result["flops_per_token"] * tokens / (plain / 1000) / result["peak_flops"])
        rows += [("plain loop", f"{plain:.1f} ms/iter, {tokens / plain * 1000:,.0f} tok/s, "
                                f"MFU {result['plain_mfu'] * 100:.1f}%")]
        loop = train_loop_ms(cfg)
        if loop is not None:
            result.update(train_ms=loop, train_overhead=loop / plain - 1)
            rows += [("train.py loop", f"{loop:.1f} ms/iter ({(loop / plain - 1) * 100:+.1f}% vs plain)")]
    if cfg.only in ("all", "generate"):
        rows += generation_rows(cfg, model, device, ctx, result)
    if cfg.only == "memory":
        result["memory"], more = held_per_process(cfg)
        rows += more
    if cfg.only == "serve":
        rows += serve_rows(cfg, model, meta, result)
    if cfg.only == "llama":
        if device.type != "cpu":
            raise UserError("--only=llama compares with llama.cpp on the CPU; add --device=cpu")
        cpu.FLOAT32_KERNEL = None  # measured, as sample.py and serve.py measure it
        result["decode_c"] = native.vector_loops()
        rows.append(("decode.c", f"its {result['decode_c']} loops" if result["decode_c"] else
                     f"not used: {native.why()}"))
        rows += llama_rows(cfg, model.eval(), meta, result)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        log(f"{key:<{width}}  {value}")
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def main(argv):
    cfg, _ = parse_args(BenchConfig, argv)
    if cfg.init_from != "scratch":
        raise UserError("bench.py measures a freshly initialized model; drop --init_from")
    bench(cfg)


if __name__ == "__main__":
    run_main(main)
