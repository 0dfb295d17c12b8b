"""How much a base model's samples copy from its training text, against the held-out text's own share (docs/copies.md).

    python runs/copies_table.py --out_dir out-shakespeare-char-cpu
    python runs/copies_table.py --out_dir out-tangshi --samples 40 --chars 200 --quantize int8

From --samples places spread over the val split (text the model never trained on), each a prompt of --prompt
characters: the model continues it --chars characters, greedily and sampled (sample.py's defaults: temperature 0.8,
every token kept, seeds 0, 1, ...), and the val text's own next --chars characters are the human reference (the
chance a fresh text has of repeating the training text). Each text's share of characters inside spans found
verbatim in the train split (nanogpt/copies.py: 7 characters or more for Chinese, 25 otherwise), averaged;
the longest span over all. For the chat models of the Tang course, data/tangshi/evaluate.py gives the same
column for answers to held-out keys (runs/tangshi.sh runs it).
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    import numpy as np
    import torch

    from nanogpt.copies import dataset_dtype, training_of
    from nanogpt.generate import generate, sample_seed
    from nanogpt.source import Source, load_trained

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out_dir", required=True)
    p.add_argument("--ckpt", default="ckpt.pt")
    p.add_argument("--quantize", default="")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--prompt", type=int, default=32, help="prompt length in tokens")
    p.add_argument("--chars", type=int, default=300, help="generated tokens per sample")
    a = p.parse_args()
    source = Source(init_from=a.out_dir, ckpt=a.ckpt, quantize=a.quantize)
    model, tokenizer, dataset = load_trained(source)
    training = training_of(dataset, source.path)
    val = np.fromfile(os.path.join(dataset, "val.bin"), dtype=dataset_dtype(dataset)).astype(np.int64)
    starts = np.linspace(0, len(val) - a.prompt - a.chars - 1, a.samples).astype(int)
    rows = {}

    def score(texts, starts_at):
        found = [training.find(t, start=s) for t, s in zip(texts, starts_at)]
        return (float(np.mean([f.copied for f in found])), max(f.longest for f in found),
                float(np.mean([f.copied > 0 for f in found])))
    prompts = [tokenizer.decode(val[s:s + a.prompt].tolist()) for s in starts]
    human = [tokenizer.decode(val[s:s + a.prompt + a.chars].tolist()) for s in starts]
    rows["held-out text (the chance baseline)"] = score(human, [len(q) for q in prompts])
    x = torch.from_numpy(np.stack([val[s:s + a.prompt] for s in starts]))
    with torch.inference_mode():
        greedy = generate(model, x, a.chars, temperature=0)
        rows["greedy"] = score([tokenizer.decode(r.tolist()) for r in greedy], [len(q) for q in prompts])
        generators = [torch.Generator().manual_seed(sample_seed(1337, i)) for i in range(a.samples)]
        sampled = generate(model, x, a.chars, temperature=0.8, generator=generators)
        rows["sampled (t=0.8)"] = score([tokenizer.decode(r.tolist()) for r in sampled], [len(q) for q in prompts])
    print(f"{a.out_dir}{' (' + a.quantize + ')' if a.quantize else ''}: {a.samples} continuations of {a.chars} "
          f"tokens after {a.prompt}-token prompts from val")
    print("| text | copied | texts with a copy | longest span |\n|---|---|---|---|")
    for name, (copied, longest, any_copy) in rows.items():
        print(f"| {name} | {copied:.1%} | {any_copy:.0%} | {longest} |")


if __name__ == "__main__":
    main()
