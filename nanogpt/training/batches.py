"""Batches for training and evaluation: windows of a dataset's train.bin / val.bin.

A batch is x = data[i:i+T] and y = data[i+1:i+1+T] for random starts i that
depend only on (seed, key): a resumed run and every DDP rank draw exactly the
windows an uninterrupted single-process run would.
"""
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from nanogpt.errors import UserError

# the first element of a batch key: which stream of draws it belongs to, so that training's
# (TRAINING, iter, micro-step) and evaluation's (EVAL[split], k) never draw the same windows
TRAINING = 0
EVAL = {"train": 1, "val": 2}


class Batches:
    """Random (x, y) windows from train.bin / val.bin, where y is x shifted by one token.

    Stateless: the windows of a batch are a function of (seed, key) alone, so
    a resumed run and every DDP rank draw exactly what an uninterrupted
    single-process run would.
    """

    def __init__(self, data_dir, block_size, batch_size, device, seed, meta=None, vocab_size=None):
        dtype = np.dtype((meta or {}).get("dtype", "uint16"))
        self.data, self.paths, self.vocab_size = {}, {}, vocab_size
        for split in ("train", "val"):
            path = self.paths[split] = os.path.join(data_dir, f"{split}.bin")
            if not os.path.exists(path):
                name = os.path.basename(os.path.normpath(data_dir))
                raise UserError(f"{path} not found; run python data/{name}/prepare.py "
                                f"(or python data/prepare.py --input FILE --out {data_dir})")
            size = os.path.getsize(path)
            if size == 0 or size % dtype.itemsize:
                raise UserError(f"{path} has {size} bytes, not a whole number of {dtype} tokens: it is empty, "
                                f"truncated or not a token file; re-run the dataset's prepare.py")
            data = np.memmap(path, dtype=dtype, mode="r")
            if len(data) < block_size + 1:
                raise UserError(f"{path} has {len(data)} tokens, fewer than block_size + 1 ({block_size + 1}); "
                                f"use a smaller --block_size or more data")
            self.data[split] = data
        self.block_size, self.batch_size, self.device, self.seed = block_size, batch_size, device, seed
        self.offsets = np.arange(block_size + 1)

    def get(self, split, key):
        data = self.data[split]
        rng = np.random.default_rng([self.seed, *key])
        return self.batch(split, rng.integers(0, len(data) - self.block_size, self.batch_size))

    def distinct_windows(self, split):
        """How many distinct windows of block_size tokens (and their targets) the split holds."""
        return len(self.data[split]) - self.block_size

    def check_windows(self, split, n):
        """n fixed windows are at most the split's distinct ones: more would only repeat windows, and the
        starts of n windows take 16 n bytes."""
        distinct = self.distinct_windows(split)
        if n > distinct:
            raise UserError(f"eval_windows ({n:,}) is more than the {distinct:,} distinct windows of "
                            f"{self.block_size} tokens that {self.paths[split]} holds; use --eval_windows={distinct} "
                            f"or fewer")

    def windows(self, split, n):
        """Batches of n fixed windows whose starts are spread evenly over the split."""
        self.check_windows(split, n)
        data = self.data[split]
        starts = np.linspace(0, len(data) - self.block_size - 1, n).round().astype(np.int64)
        for i in range(0, n, self.batch_size):
            yield self.batch(split, starts[i:i + self.batch_size])

    def batch(self, split, ix):
        tokens = self.data[split][ix[:, None] + self.offsets].astype(np.int64)  # (B, T+1)
        if self.vocab_size is not None and tokens.max() >= self.vocab_size:  # checked per batch: no full scan
            row, col = np.unravel_index(tokens.argmax(), tokens.shape)
            raise UserError(f"{self.paths[split]} holds token id {tokens.max()} (at token {ix[row] + col}), beyond the "
                            f"model's vocabulary of {self.vocab_size}; the dataset and its meta disagree: re-run "
                            f"its prepare.py, or train on the dataset the model was made for")
        buf = torch.from_numpy(tokens)
        if self.device.type == "cuda":
            buf = buf.pin_memory().to(self.device, non_blocking=True)
        else:
            buf = buf.to(self.device)
        return buf[:, :-1], buf[:, 1:]


@torch.no_grad()
def estimate_loss(model, batches, cfg, ctx, rank=0, world=1, token_bytes=None, collective=False):
    """Mean loss of each split over the same batches every time, shared across ranks.

    eval_iters random batches per split; with eval_windows, val uses that many
    fixed windows spread evenly over the split instead (a low-noise measure).
    token_bytes (V,): the UTF-8 bytes of each token; then also val_bpb (split_loss).
    collective: every rank must run the model equally often (FSDP's all-gathers, DDP's buffer broadcasts): a
    rank with one batch fewer runs one more and ignores it.
    """
    out = {}
    model.eval()
    for split in ("train", "val"):
        if split == "val" and cfg.eval_windows:
            parts = batches.windows(split, cfg.eval_windows)
        else:
            parts = (batches.get(split, (EVAL[split], k)) for k in range(cfg.eval_iters))
        out[split], bpb = split_loss(model, parts, ctx, batches.device, rank, world,
                                     token_bytes if split == "val" else None, collective)
        if split == "val" and token_bytes is not None:
            out["val_bpb"] = bpb
    model.train()
    return out


@torch.no_grad()
def split_loss(model, parts, ctx, device, rank=0, world=1, token_bytes=None, collective=False):
    """(mean loss of the batches `parts` on device, their bits per byte): every rank's share of the batches, summed
    over the ranks. Bits per byte, with token_bytes (V,) the UTF-8 bytes of each token (else None): the summed loss
    of the targets in bits over their bytes, which compares across tokenizers (for one byte per token it is
    loss / ln 2). collective: as estimate_loss's."""
    # sum of batch losses x windows, windows; then the summed token loss in nats and the bytes it covers
    total = torch.zeros(4, dtype=torch.float64, device=device)
    seen, spare = 0, None
    for k, (x, y) in enumerate(parts):
        seen = k + 1
        spare = spare or (x, y)  # a batch for a rank whose share is one short (even none)
        if k % world != rank:
            continue
        with ctx:
            logits, loss = model(x, y)
        total[0] += loss.double() * x.size(0)
        total[1] += x.size(0)
        if token_bytes is not None:  # targets of -1 (a chat dataset's context) count nothing
            total[2] += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1), reduction="sum",
                                        ignore_index=-1)
            total[3] += token_bytes[y.clamp(min=0)][y >= 0].sum()
    if collective and len(range(rank, seen, world)) < math.ceil(seen / world):
        with ctx:
            model(*spare)
    if world > 1:
        dist.all_reduce(total)
    total = total.tolist()  # sync point: once per split per eval
    bpb = total[2] / (math.log(2) * total[3]) if token_bytes is not None and total[3] else None
    return total[0] / total[1], bpb


class ChatBatches:
    """Batches of whole conversations from a chat dataset (data/chat/prepare.py): row i of x is one
    conversation from its first token, padded to the batch's longest; y is x shifted by one, -1 (no
    loss) wherever the mask says the token is context, and on the padding.

    Stateless like Batches: the conversations of a batch are a function of (seed, key) alone.
    """

    def __init__(self, data_dir, block_size, batch_size, device, seed, meta=None, vocab_size=None, log=print):
        dtype = np.dtype((meta or {}).get("dtype", "uint16"))
        self.vocab_size, self.block_size, self.batch_size, self.device, self.seed = (vocab_size, block_size,
                                                                                     batch_size, device, seed)
        self.data, self.mask, self.starts, self.paths = {}, {}, {}, {}
        for split in ("train", "val"):
            path = self.paths[split] = os.path.join(data_dir, f"{split}.bin")
            files = [path, os.path.join(data_dir, f"{split}_mask.bin"), os.path.join(data_dir, f"{split}_index.bin")]
            missing = [f for f in files if not os.path.exists(f)]
            if missing:
                raise UserError(f"{missing[0]} not found; re-run python data/chat/prepare.py for {data_dir}")
            data, mask = np.memmap(files[0], dtype=dtype, mode="r"), np.memmap(files[1], dtype=np.uint8, mode="r")
            index = np.fromfile(files[2], dtype=np.int64)
            if (len(data) != len(mask) or len(index) < 2 or index[0] != 0 or index[-1] != len(data)
                    or np.any(np.diff(index) < 2)):
                raise UserError(f"{data_dir}: {split}.bin, {split}_mask.bin and {split}_index.bin disagree; re-run "
                                f"python data/chat/prepare.py")
            lengths = np.diff(index)
            fits = lengths <= block_size + 1
            if not fits.all():
                log(f"note: {(~fits).sum():,} of {len(lengths):,} {split} conversations are longer than block_size + 1 "
                    f"({block_size + 1} tokens) and are left out")
            if not fits.any():
                raise UserError(f"{path}: every conversation is longer than block_size + 1 ({block_size + 1}); use a "
                                f"larger --block_size")
            self.data[split], self.mask[split] = data, mask
            self.starts[split] = np.stack([index[:-1], lengths], axis=1)[fits]  # (n, 2): start, length

    def get(self, split, key):
        rng = np.random.default_rng([self.seed, *key])
        return self.batch(split, rng.integers(0, len(self.starts[split]), self.batch_size))

    def check_windows(self, split, n):
        """n fixed conversations are at most the split's."""
        if n > len(self.starts[split]):
            raise UserError(f"eval_windows ({n:,}) is more than the {len(self.starts[split]):,} conversations of "
                            f"{self.paths[split]}; use --eval_windows={len(self.starts[split])} or fewer")

    def windows(self, split, n):
        """Batches of n conversations spread evenly over the split (each at most once)."""
        count = len(self.starts[split])
        picks = np.unique(np.linspace(0, count - 1, min(n, count)).round().astype(np.int64))
        for i in range(0, len(picks), self.batch_size):
            yield self.batch(split, picks[i:i + self.batch_size])

    def batch(self, split, picks):
        rows = self.starts[split][picks]
        width = int(rows[:, 1].max())
        tokens = np.zeros((len(rows), width), dtype=np.int64)
        targets = np.full((len(rows), width), -1, dtype=np.int64)
        for r, (start, length) in enumerate(rows):
            ids = self.data[split][start:start + length].astype(np.int64)
            tokens[r, :length] = ids
            targets[r, :length] = np.where(self.mask[split][start:start + length] == 1, ids, -1)
        if self.vocab_size is not None and tokens.max() >= self.vocab_size:
            raise UserError(f"{self.paths[split]} holds token id {tokens.max()}, beyond the model's vocabulary of "
                            f"{self.vocab_size}; re-run python data/chat/prepare.py with the model's base dataset")
        x, y = torch.from_numpy(tokens[:, :-1]), torch.from_numpy(targets[:, 1:])
        return x.to(self.device), y.to(self.device)


def make_batches(data_dir, block_size, batch_size, device, seed, meta=None, log=print):
    """Batches of a dataset: windows of text, or whole conversations for a chat dataset."""
    if meta and meta.get("chat"):
        return ChatBatches(data_dir, block_size, batch_size, device, seed, meta, log=log)
    return Batches(data_dir, block_size, batch_size, device, seed, meta)
