"""Ours against llama.cpp on a loaded machine: one stream, the same threads asked of each, first on the idle machine,
then with another process holding one core (a Python loop), as a laptop's other programs do (docs/generation.md).

    python runs/llama_loaded.py                      # float32, 2 threads, the GPU recipe's shape, 250 tokens
    python runs/llama_loaded.py --precision int8 --threads 2

Needs llama-cpp-python (bench.py's llama.cpp rows say how to build it). Both decode the same exported weights,
alternated, medians of 5, with bench.py's own loops.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", choices=["float32", "bfloat16", "int8"], default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new_tokens", type=int, default=250)
    a = p.parse_args()
    import torch

    import bench
    from model import GPT, GPTConfig
    from nanogpt.interop.gguf_file import write_gguf
    from nanogpt.interop.hf import hf_architecture
    from nanogpt.interop.llamacpp_run import LlamaCpp, available
    from nanogpt.tokenizer import CharTokenizer
    if not available():
        sys.exit("llama-cpp-python is not installed: nothing to compare (docs/generation.md says how to build it)")
    torch.manual_seed(0)
    config = GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65, bias=False, dropout=0.0)
    model = GPT(config).eval()
    tokenizer = CharTokenizer([chr(32 + i) for i in range(65)])
    torch.set_num_threads(a.threads)
    n = min(a.new_tokens, config.block_size - 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.gguf")
        write_gguf(model, tokenizer, hf_architecture(config, "the model"), path, "the model",
                   bench.LLAMA_PRECISIONS[a.precision])
        for busy in (False, True):
            load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                time.sleep(1.0)  # the load seen by /proc/stat before decoding starts
                theirs = LlamaCpp(path, a.threads, config.block_size, 1)
                ours, ctx = bench.ours_for(model, a.precision)
                figure = bench.compare(ours, ctx, theirs, n, 1, 5)
                theirs.close()
            finally:
                if load is not None:
                    load.kill()
            print(f"{a.precision}, {a.threads} threads asked, {'one core busy' if busy else 'idle':13s}: "
                  f"ours {figure['ours_tok_s']:,.0f} tok/s, llama.cpp {figure['llama_cpp_tok_s']:,.0f} tok/s",
                  flush=True)


if __name__ == "__main__":
    main()
