"""OpenWebText in GPT-2 BPE tokens, through Hugging Face datasets (pip install datasets).

    python data/openwebtext/prepare.py                       # downloads ~54 GB of text, writes ~17 GB
    python data/openwebtext/prepare.py --input my_corpus/    # local .jsonl/.json/.parquet/.txt files, or a save_to_disk dir

Each document is encoded on its own, followed by <|endoftext|>; a random 0.05%
of documents (seed 2357) is val, as in nanoGPT. Expect about 9.0B train and 4.4M
val tokens for OpenWebText. The default source is a Parquet copy (the datasets
library runs no dataset scripts).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from nanogpt import program  # noqa: E402

program.exit_quietly_on_ctrl_c()  # before the slow imports (numpy): Ctrl-C during them exits quietly
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from nanogpt.errors import UserError  # noqa: E402
from nanogpt.program import run_main  # noqa: E402
from nanogpt.tokenizer import BPE_ENCODING, write_meta  # noqa: E402
from nanogpt.values import how_many  # noqa: E402

_encoding = None


def encode(example):
    """ids and length of one document (runs in datasets' worker processes)."""
    global _encoding
    if _encoding is None:
        import tiktoken
        _encoding = tiktoken.get_encoding(BPE_ENCODING)
    ids = _encoding.encode_ordinary(example["text"]) + [_encoding.eot_token]
    return {"ids": ids, "len": len(ids)}


def load(source, num_proc):
    """A datasets.Dataset with a "text" column, from the Hub or from local files."""
    try:
        import datasets
    except ImportError:
        raise UserError("OpenWebText needs Hugging Face datasets: pip install datasets") from None
    if os.path.isdir(source) and os.path.exists(os.path.join(source, "dataset_info.json")):
        return datasets.load_from_disk(source)
    if os.path.exists(source):
        files = sorted(os.path.join(d, f) for d, _, names in os.walk(source) for f in names) \
            if os.path.isdir(source) else [source]
        kinds = {os.path.splitext(f)[1] for f in files} - {""}
        builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}.get(next(iter(kinds), ""))
        if len(kinds) != 1 or builder is None:
            raise UserError(f"{source}: give one kind of file (.jsonl, .json, .parquet or .txt), found {sorted(kinds)}")
        return datasets.load_dataset(builder, data_files=files, split="train")
    try:
        return datasets.load_dataset(source, split="train", num_proc=num_proc)
    except Exception as e:  # network, or a name the Hub does not know
        raise UserError(f"cannot load {source!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        f"offline, pass local files with --input") from None


def write_split(dset, path, desc, shards=64):
    """Concatenate every document's ids into one uint16 file, streaming shard by shard."""
    total = int(np.sum(dset["len"], dtype=np.uint64))
    arr = np.memmap(path + ".tmp", dtype=np.uint16, mode="w+", shape=(max(total, 1),))
    shards = max(1, min(shards, len(dset)))
    pos = 0
    for i in tqdm(range(shards), desc=f"writing {desc}", disable=None):
        batch = dset.shard(num_shards=shards, index=i, contiguous=True).with_format("numpy")
        ids = np.concatenate(list(batch["ids"])) if len(batch) else np.empty(0, dtype=np.uint16)
        arr[pos:pos + len(ids)] = ids
        pos += len(ids)
    arr.flush()
    del arr
    if total == 0:
        os.truncate(path + ".tmp", 0)
    os.replace(path + ".tmp", path)
    return total


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", default="Skylion007/openwebtext", help="Hub dataset name or local files")
    parser.add_argument("--out", default=HERE, help="output directory")
    parser.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="processes that load and tokenize the documents (default: half the cores)")
    parser.add_argument("--val_fraction", type=float, default=0.0005, help="the share of documents held out as val")
    args = parser.parse_args(argv)
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    dataset = load(args.input, args.num_proc)
    if "text" not in dataset.column_names:
        raise UserError(f"{args.input} has no 'text' column (columns: {dataset.column_names})")
    if len(dataset) < 2:
        raise UserError(f"{args.input} has {how_many(len(dataset), 'document')}; train and val need at least 2")
    split = dataset.train_test_split(test_size=args.val_fraction, seed=2357, shuffle=True)
    os.makedirs(args.out, exist_ok=True)
    for name, dset in (("train", split["train"]), ("val", split["test"])):
        tokenized = dset.map(encode, remove_columns=dset.column_names, num_proc=min(args.num_proc, len(dset)),
                             desc=f"tokenizing {name}")
        n = write_split(tokenized, os.path.join(args.out, f"{name}.bin"), name)
        print(f"{name} has {n:,} tokens ({len(dset):,} documents)")
    write_meta(args.out, {"tokenizer": "gpt2", "encoding": BPE_ENCODING, "vocab_size": 50257, "dtype": "uint16"})


if __name__ == "__main__":
    run_main(main)
