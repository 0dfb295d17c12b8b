"""train.py --minutes=N: the recipe for this corpus on this machine in N minutes (docs/minutes.md).

The shapes the plan chooses among (LADDER), the keys every planned run shares (RECIPE: the speedrun's
architecture and optimizer, docs/speedrun.md), and the schedule fitted to the iterations a budget allows.
"""
import lzma
import math
import os
import shlex
import time
from dataclasses import MISSING, dataclass, field, fields, replace

import numpy as np
import torch

from nanogpt.dataset import DEFAULT_BPE_VOCAB, context_that_fits
from nanogpt.device import sync
from nanogpt.errors import UserError
from nanogpt.memory import fmt_bytes, settle_heap, training_bytes
from nanogpt.source import checkpoint_file, init_from_kind
from nanogpt.tokenizer import token_byte_strings, tokenizer_from_meta, tokenizer_kind
from nanogpt.training.distributed import from_rank0
from nanogpt.training.metrics import read_log
from nanogpt.training.train_config import TrainConfig
from nanogpt.values import how_many


# What every planned run shares: the CPU speedrun's model and optimizer (config/shakespeare_char_speedrun.py),
# which learns most per second here. Muon's rate holds across widths (it normalizes each update); AdamW's part
# (the head and the gains) follows 1/sqrt(width) from the speedrun's 3e-3 at 128.
RECIPE = dict(bias=False, pos_emb="rope", norm="layernorm", activation="gelu", tie_weights=False, qk_norm=True,
              zero_init_proj=True, logit_softcap=15.0, optimizer="muon", muon_lr=0.04, embedding_lr=0.1, beta2=0.99,
              lr_schedule="cosine", gradient_accumulation_steps=1, block_size=128, batch_size=12)

# The model shapes, smallest first: (layers, width, heads). Heads of 32 channels up to width 192, of 64 above.
SHAPES = {"S0": (2, 64, 2), "S1": (3, 96, 3), "S2": (4, 128, 4), "S3": (4, 192, 6), "S4": (6, 256, 4),
          "S5": (6, 384, 6), "S6": (8, 512, 8)}


def shape_keys(n_layer, n_embd, n_head):
    """The config keys of a shape: its size, its AdamW rate, its value embeddings."""
    return {**RECIPE, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
            "value_embeds": min(2, n_layer // 2), "learning_rate": round(3e-3 * (128 / n_embd) ** 0.5, 6)}


LADDER = {name: shape_keys(*SHAPES[name]) for name in SHAPES}


def size_of(name):
    """A ladder shape as a user reads it, layers x width ('S3': '4 x 192'); another name as it is."""
    return f"{SHAPES[name][0]} x {SHAPES[name][1]}" if name in SHAPES else name


def rung_keys(name, given):
    """A rung of the ladder with the keys the user set laid over it: the rate and value embeddings follow the
    layers and width the run will have (a width of yours gets its own rate, not the rung's)."""
    shape = {**LADDER[name], **given}
    return {**shape_keys(shape["n_layer"], shape["n_embd"], shape["n_head"]), **given}

# The share of a budget spent on training iterations: the rest is start-up, the probe, evaluations and saves.
TRAIN_SHARE = 0.9


def schedule_keys(keys, tokens):
    """The schedule for a run of `tokens` training tokens in the shape `keys`: as many iterations, a warm-up of
    2% of them (10 to 100), cosine decay to a tenth of each peak, about 10 evaluations."""
    iters = max(1, tokens // (keys["batch_size"] * keys["block_size"] * keys["gradient_accumulation_steps"]))
    # (a run shorter than 50 iterations, only where you set max_iters: a fifth of it, so the rate still peaks)
    warmup = min(100, max(10, iters // 50), max(1, iters // 5))
    return {"max_iters": iters, "lr_decay_iters": iters, "warmup_iters": warmup,
            "min_lr": keys["learning_rate"] / 10, "eval_interval": max(1, iters // 10)}


# The fitted law (runs/study_fit.py over the study's points, docs/minutes.md): val bpb of the best checkpoint as
#   E + A * (N / 1e6) ** -alpha + B * (S / 1e6) ** -beta
# N: the blocks' parameters (12 * layers * width^2), at most N_100k * (U / 100 KB) ** N_exponent * (1 + N_dropout *
# dropout) for a corpus of U bytes (a larger model only memorizes sooner); S: the corpus bytes the run could learn from, the bytes it sees
# (tokens x bytes per token, less dropout_cost * dropout of them) with repeats counting less:
# S = U + U * R * (1 - exp(-(epochs - 1) / R)) past one epoch of U unique bytes (Muennighoff et al., 2023), R
# growing with dropout; E: the corpus's own floor, e0 + e1 * hardness (how well character n-grams of 80 KB of its
# train text, spread over it, predict up to 400 KB of its val text, in bits per byte). N_100k and N_dropout are read
# off the study's 100 KB points, N_exponent off its 100 KB and 700 KB points, rel_sigma is the fit's
# leave-one-corpus-out error; the rest runs/study_fit.py fits (tests/test_plan.py holds them to its fit of
# docs/minutes_points.jsonl).
LAW = dict(e0=-1.316, e1=0.944, A=0.1177, alpha=0.34, B=0.7667, beta=0.28, R=1.318, R_dropout=11.32,
           dropout_cost=3.368, N_100k=2e6, N_exponent=0.5, N_dropout=25.0, rel_sigma=0.0421)
# Dropout's 10 epochs of a small text paid on English and Spanish (2.5% to 6.3% below 4 epochs without it, three texts
# of 100 KB) and not on classical Chinese (論語, 孟子, 古文觀止: 0.7% to 1.6% worse), where each character is a
# word: a text mostly of Chinese characters is planned without dropout. Other scripts are planned as English is.
IDEOGRAPHS = 0.5  # the share of a text's characters (spaces aside) that are CJK ideographs, from which it counts


# Dropout paid where it let a model as large as the text fills without it, or larger, learn (6 x 256 and 6 x 384 on
# 100 KB, 2.5 to 5 times that cap), and not on a much smaller one: 4 x 192 on tiny Shakespeare (0.3 of it) was 8.5%
# worse at 3 minutes and tied at 10. So a shape is weighed with dropout only from this share of the cap up (the
# cap, 2M at 100 KB, is read off the study's points, not fitted: 4 x 192, 1.8M, counts as at it).
DROPOUT_FILL = 0.8
# Dropout 0.1 paid on a model about the size the text fills without dropout (6 x 256 on 700 KB, 0.9 of it: 1.814 for
# 5.4 epochs against 1.867 for 4 without) and not on one far above it (6 x 384 on 100 KB, 5.6 times it: 2.305 for 7
# epochs, its best at 5.6, against 2.313 for 4 epochs of 4 x 192), where 0.2 did (2.255). So 0.1 is weighed up to
# twice the cap, a round number between the two measured (6 x 384 crosses it at 705 KB, where 0.1 is unmeasured).
LIGHT_DROPOUT_FILL = 2.0
# The dropouts the plan chooses among, those the study measured in the plans' regime: 0 for every shape, and each
# other as {dropout: (least, most)}, the shares of what a text fills without dropout (fills(corpus, 0)) a shape's
# blocks may hold for the plan to weigh it. 0.1 is for a text of a few hundred KB whose minutes buy more than 4
# epochs but not the 10 that 0.2 needs: War and Peace's first 700 KB, 6 x 256 for 5.4 epochs at 0.1, reached 1.814
# where 4 epochs without it peaked at 1.867.
DROPOUT_FILLS = {0.1: (DROPOUT_FILL, LIGHT_DROPOUT_FILL), 0.2: (DROPOUT_FILL, math.inf)}
DROPOUTS = (0.0, *DROPOUT_FILLS)
# Dropout pays only past the epochs where it stops slowing a run down, and the law, which puts 0.1 level with none at
# 4 epochs and ahead from there on, has no term for that. 4 x 192 at 0.1 for 4.3 epochs of 100 KB measured 0.8% to
# 1.8% above 4 epochs without it (Pride and Prejudice, War and Peace, Shakespeare; an AMD EPYC), where the law said
# 0.8% below; for 5 epochs 0.9% and 1.0% below and 0.3% above (the law: 1.9% to 2.2% below); for 7, 3.3% below; 6 x
# 256 on 700 KB for 5.4 epochs, 2.8% below (the law: 1.8%). So a plan weighs a dropout only for this many epochs or
# more.
DROPOUT_FROM_EPOCHS = 5.0


def planned_dropouts(corpus, keys=None, taught=False):
    """The dropouts a plan weighs for corpus (and a shape's keys): none for a text of Chinese characters or a run that
    learns from teachers (taught: DISTILLED_DROPOUT); for a shape, 0 and those whose DROPOUT_FILLS range holds its
    share of what the text fills without dropout."""
    if taught or corpus.ideographs >= IDEOGRAPHS:
        return (0.0,)
    if keys is None:
        return DROPOUTS
    fill = blocks_params(keys) / fills(corpus, 0.0)
    return tuple(p for p in DROPOUTS if not p or DROPOUT_FILLS[p][0] <= fill <= DROPOUT_FILLS[p][1])


@dataclass
class Corpus:
    """What the plan knows of a dataset: its size in tokens and bytes, and how hard its text is to predict."""
    path: str
    train_tokens: int
    val_tokens: int
    vocab_size: int
    bytes_per_token: float  # mean UTF-8 bytes of a train token
    hardness: float  # bits per byte on val of character n-gram models of train (80 KB of train, 20 of val, spread)
    ideographs: float = 0.0  # the share of its characters (spaces aside) that are CJK ideographs: 0 for English
    repeats: float | None = None  # bits per byte lzma spends on the same val sample after the train sample (None:
    # a plan recorded before it was read, which the law reads by its n-grams alone)
    tokenizer: str | None = None  # "char", "bpe" or "gpt2" (nanogpt.tokenizer.tokenizer_kind); None: not recorded
    two_byte_share: float = 0.0  # the share of its characters (spaces aside) of two UTF-8 bytes: 0.94 for Russian

    @property
    def train_bytes(self):
        return self.train_tokens * self.bytes_per_token


def split_paths(data_dir):
    """{split: path} of a prepared dataset's train.bin and val.bin, or the error that says how to prepare it."""
    paths = {split: os.path.join(data_dir, f"{split}.bin") for split in ("train", "val")}
    if not os.path.isdir(data_dir):
        raise UserError(f"--minutes: there is no dataset folder {data_dir}; prepare one (python data/prepare.py "
                        f"--input YOUR_TEXT --out {data_dir})")
    for path in paths.values():
        if not os.path.isfile(path):
            raise UserError(f"--minutes: {path} is missing; prepare the dataset first (python data/prepare.py "
                            f"--input YOUR_TEXT --out {data_dir})")
    return paths


HARDNESS_SAMPLE = 80_000  # bytes of train the n-grams learn from (and a quarter as many of val that lzma reads)
# bytes of val the n-grams are scored on, in runs spread over it: all of most texts' val. A quarter of the sample, in 8
# runs, read a text's val only at its runs' places: a folder of two books of 鲁迅 read 2.68 there, 2.73 to 3.01 at
# other places and 2.91 over all of its val, and its law was 10% low (0.1% now); the law refitted on the longer
# reading leaves 4.21% out, where it left 4.51% (docs/results.md, "The hardness scored on all of val")
HARDNESS_SCORED, SCORED_PIECES = 400_000, 128
SMALL_TEXT_SIGMA = 0.17  # the relative uncertainty of a text smaller than that: the study's 65 KB 論語 was 17% off


def read_corpus(data_dir, meta, token_bytes, sample=HARDNESS_SAMPLE, pieces=8):
    """The Corpus of a prepared dataset. token_bytes: (vocab_size,) the UTF-8 bytes of each token. Its hardness is
    character n-grams of about `sample` bytes of train, taken in `pieces` runs spread from the split's start to its
    end, scored on up to HARDNESS_SCORED bytes of val spread the same way (a few tenths of a second): the same amount
    of every corpus, so that it measures the text and not how much of it there is (the law's N and S terms hold the
    size), and all of it, not the end of train beside the start of val, which read alike (the same play or chapter:
    tiny Shakespeare's end of train predicted its start of val 0.3 bits a byte better than its whole train does its
    whole val). lzma's repeats read a quarter of `sample` of val, in `pieces` runs. The same text scores the same
    under any tokenizer."""
    dtype = np.dtype((meta or {}).get("dtype", "uint16"))
    data = {}
    for split, path in split_paths(data_dir).items():
        data[split] = np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path) else np.zeros(0, dtype)
    lengths = np.array([len(b) for b in token_bytes], dtype=np.float64)
    train, val = data["train"], data["val"]
    if len(train) < 2:
        raise UserError(f"--minutes: {data_dir}/train.bin has {len(train)} tokens; give prepare more text")
    known = lambda ids: np.asarray(ids)[np.asarray(ids) < len(lengths)]  # noqa: E731  (ids past the vocabulary)
    some = known(spread(train, 10_000, pieces))
    if not len(some):
        raise UserError(f"--minutes: {data_dir}/train.bin holds no token id below its vocabulary of {len(lengths):,}: "
                        f"is meta's dtype ({dtype}) the one prepare wrote? Prepare the dataset again")
    per_token = max(1.0, float(lengths[some].mean()))
    some_train = known(spread(train, int(sample / per_token), pieces))
    some_val = known(spread(val, int(sample / 4 / per_token), pieces))
    scored_val = known(spread(val, int(HARDNESS_SCORED / per_token), SCORED_PIECES))
    train_text, val_text, scored_text = (b"".join(token_bytes[i] for i in ids.tolist())
                                         for ids in (some_train, some_val, scored_val))
    # (at least 0: a text of one character repeated scored -0.00)
    hardness = max(0.0, ngram_bits_per_byte(train_text, scored_text)) if val_text else 8.0
    repeats = lzma_bits_per_byte(train_text, val_text) if val_text else 8.0
    return Corpus(data_dir, len(train), len(val), len(lengths), float(lengths[some_train].mean()), hardness,
                  ideograph_share(train_text), repeats, tokenizer_kind(meta), two_byte_share(train_text))


def lzma_bits_per_byte(train, val):
    """The bits a byte lzma spends on val (UTF-8 bytes) after train: what long exact repeats, which character
    n-grams of five cannot see, make of a text (a twentieth of a second for the hardness sample)."""
    return 8 * (len(lzma.compress(train + val)) - len(lzma.compress(train))) / max(1, len(val))


def spread(ids, count, pieces):
    """`count` of ids in `pieces` equal runs spread evenly from its start to its end; all of ids where it is shorter."""
    if len(ids) <= count:
        return np.asarray(ids)
    pieces = max(1, min(pieces, count))
    run = count // pieces
    return np.concatenate([np.asarray(ids[i:i + run]) for i in np.linspace(0, len(ids) - run, pieces).astype(np.int64)])


def code_points(text):
    """The characters of text (UTF-8 bytes) as code points, spaces, tabs, line ends and the ideographic space aside."""
    c = np.frombuffer(text.decode("utf-8", "ignore").encode("utf-32-le"), np.uint32)
    return c[~np.isin(c, (0x20, 0x0A, 0x0D, 0x09, 0x3000))]


def ideograph_share(text):
    """The share of the characters of text (UTF-8 bytes), spaces aside, that are CJK ideographs (the unified blocks,
    their extensions and the compatibility ones): 1 for classical Chinese, about 0.9 for modern Chinese with its
    digits and Latin words, 0 for English, Korean or Thai."""
    c = code_points(text)
    cjk = (((c >= 0x3400) & (c <= 0x4DBF)) | ((c >= 0x4E00) & (c <= 0x9FFF)) | ((c >= 0xF900) & (c <= 0xFAFF))
           | ((c >= 0x20000) & (c <= 0x2FFFF)))
    return float(cjk.mean()) if len(c) else 0.0


def two_byte_share(text):
    """The share of the characters of text (UTF-8 bytes), spaces aside, that take two bytes (U+0080 to U+07FF: the
    letters of Cyrillic, Greek, Armenian, Hebrew and Arabic, and Latin's accented ones): about 0.94 for Russian prose,
    under 0.05 for Spanish or French, 0 for English, Chinese, Japanese or Korean."""
    c = code_points(text)
    return float(((c >= 0x80) & (c <= 0x7FF)).mean()) if len(c) else 0.0


def ngram_bits_per_byte(train, val, longest=5, discount=0.75):
    """How hard a text is to predict: the bits per byte on `val` of character n-gram models fitted on `train` (both
    UTF-8 bytes), the best of contexts of 1 to `longest` characters. Each order's probability is interpolated with the
    order below it (absolute discounting: each seen count less `discount`, the mass freed spread by the lower order),
    so an unseen context falls back to a shorter one, and a character never seen costs 8 bits a byte. Characters, not
    tokens: the same text scores the same under any tokenizer; not bytes: a context of five bytes is less than two
    characters of Chinese."""
    a, b = (np.frombuffer(t.decode("utf-8", "ignore").encode("utf-32-le"), np.uint32) for t in (train, val))
    if len(a) <= longest or len(b) <= longest:
        return 8.0
    nbytes = np.select([b < 0x80, b < 0x800, b < 0x10000], [1, 2, 3], 4)  # each val character's UTF-8 bytes
    ids = np.unique(np.concatenate([a, b]), return_inverse=True)[1].astype(np.int64) + 1  # 0: before the text
    kinds_of = int(ids.max()) + 1
    def lookup(keys, table, values):  # values[i] where table[i] == key, else 0 (table sorted)
        i = np.minimum(np.searchsorted(table, keys), len(table) - 1)
        return np.where(table[i] == keys, values[i], 0)
    prob = 256.0 ** -nbytes  # below order 0: a character never seen, spelled out in bytes
    context = np.zeros(len(ids), np.int64)  # a number for the k characters before each one, the same in both texts
    best = 8.0
    n = len(a)
    for k in range(longest + 1):  # the context: the k characters before (none: how often each character is)
        if k:
            before = np.concatenate([np.zeros(k, np.int64), ids[:-k]])
            context = np.unique(context * kinds_of + before, return_inverse=True)[1].astype(np.int64)
        pair = context * kinds_of + ids
        pairs, pair_count = np.unique(pair[k:n], return_counts=True)  # train's characters with k before them
        seen, seen_count = np.unique(context[k:n], return_counts=True)
        _, followers = np.unique(pairs // kinds_of, return_counts=True)  # distinct next characters of each context
        count, total = lookup(pair[n:], pairs, pair_count), lookup(context[n:], seen, seen_count)
        kinds = lookup(context[n:], seen, followers)
        here = (np.maximum(count - discount, 0) + discount * kinds * prob) / np.maximum(total, 1)
        prob = np.where(total > 0, here, prob)
        if k:  # the same characters scored at every order
            best = min(best, float(-np.log2(prob[longest:]).sum() / nbytes[longest:].sum()))
    return best


def blocks_params(keys):
    """Parameters of the blocks' matrices (attention 4 d^2, MLP 8 d^2 a layer): the N of the law."""
    return 12 * keys["n_layer"] * keys["n_embd"] ** 2


def flops_per_iter(keys, vocab_size):
    """Training FLOPs of one iteration: 6 per parameter per token for the blocks and the head, and attention's."""
    d, L, T = keys["n_embd"], keys["n_layer"], keys["block_size"]
    per_token = 6 * (blocks_params(keys) + d * vocab_size) + 12 * L * d * T
    return per_token * T * keys["batch_size"] * keys["gradient_accumulation_steps"]


def learnable_bytes(seen, unique, dropout, law=LAW):
    """S of the law: the bytes seen, repeats beyond the first epoch counting less and less. Dropout p makes each
    byte teach less (1 - dropout_cost * p of it) and repeats last longer (R + R_dropout * p)."""
    seen = seen * max(0.05, 1 - law["dropout_cost"] * dropout)
    if seen <= unique:
        return seen
    r = law["R"] + law["R_dropout"] * dropout
    return unique + unique * r * (1 - math.exp(-(seen / unique - 1) / r))


# Texts unlike the study's prose and poems (docs/results.md, "Code, markup and records"): on the Python standard
# library, C headers and man pages (1.1 to 1.4 MB each, 1.5 minutes) the law ran 16%, 46% and 8% high, where lzma
# read them 0.9 to 1.4 bits a byte below their n-grams: the n-grams see five characters, and these texts repeat
# whole identifiers, lines and tags, which a model learns. Read REPEATS of the way from the n-grams to lzma, they were
# 1% low, 12% high and 11% low, and three more texts held out (HTML, dpkg's package records, PyTorch's Python) 2%
# high, 0.2% low and 10% low, where the n-grams alone (scaled as below) had them 55%, 10% and 2% high. On every
# prose and poetry text read here (tiny Shakespeare, its first 100 KB and eleven Chinese texts) lzma reads above the
# n-grams, and nothing changes.
REPEATS = 0.4
# The study's texts read from 2.320 (Alice in Wonderland) to 3.550 (宋詩) bits a byte (its points' hardness). Past the
# easiest the law's line has no support, and it runs to a floor below zero (HTML of the Rust book read at 0.40, and
# its prediction was -0.10): an easier text is predicted as the easiest, scaled by how much easier it reads.
STUDIED_HARDNESS = (2.320, 3.550)
REPEATS_NOTED = 0.05  # bits a byte lzma's repeats move a reading by, from which the plan says so
UNSTUDIED_SIGMA = 0.12  # the relative uncertainty of a text read past the study's: the six above were up to 12.4% off
# A text that reads easier than the study's easiest is predicted by a scaling no run measured, and seven such texts
# ended from 0.12 to 1.12 times it: JSON schemas of long repeated lists measured 0.094 where it said 0.79, apt and
# dpkg logs 0.54 times it, the HTML, C headers, man pages, dpkg's records and PyTorch's Python within 12% of it.
# Its uncertainty is the prediction itself, and the run's halfway revision says more.
EASIER_SIGMA = 1.0
# Prose in letters of two bytes (Cyrillic, Greek, Hebrew, Arabic) reads easier than the study's texts per byte, and
# eight Russian novels, 1.55 to 2.18 bits a byte (read 0.67 to 0.93 of the easiest), ended 1.02 to 1.11 times the
# scaled prediction, 1.058 on average (their whole val split, characters as tokens); so such a text is predicted that
# much higher, +-6% (the eight, so: -4.3% to +3.5%; 2.2% rms). Three more, held out from that, were 1.0% low to 4.0%
# high (docs/results.md, "Russian: eleven novels", and "The hardness scored on all of val"). Read per letter instead
# (bits a letter, as the study's one-byte letters are), five of the eight, held out from that rule, were 3-13% high.
# Text with lzma's long repeats (records, logs), far easier text, and a BPE's tokens keep the guess: none of them was
# measured so.
TWO_BYTE_LETTERS = 0.5  # the share of a text's characters (spaces aside) of two bytes, from which it counts
EASIER_LETTERS = 1.058
EASIER_LETTERS_FROM = 0.65  # of the easiest text's reading, at the least (the eight read 0.67 to 0.93 of it)
EASIER_LETTERS_SIGMA = 0.06
LETTERS_HALFWAY_SIGMA = 0.06  # the revision halfway on such text ran +0.7% to +5.6% (17 runs of the eleven)


def two_byte_letters(corpus):
    """Whether a corpus is written in two-byte letters (TWO_BYTE_LETTERS of its characters), not Chinese."""
    return corpus.two_byte_share >= TWO_BYTE_LETTERS and corpus.ideographs < IDEOGRAPHS


def unlike_the_novels(corpus):
    """What sets a corpus apart from the Russian novels EASIER_LETTERS was measured on, as the plan says it, or
    None: they were in characters as tokens, without lzma's long repeats, easier than the study's easiest by as much
    as they were."""
    if corpus.tokenizer != "char":
        return "a BPE's tokens"
    if corpus.hardness - reading(corpus) > REPEATS_NOTED:
        return "long repeats (records, logs)"
    if easier(corpus) < EASIER_LETTERS_FROM:
        return "easier still than those novels"
    if easier(corpus) >= 1:
        return "no easier than the study's texts"
    return None


def letters_prose(corpus):
    """Whether a corpus is read as the Russian novels were: prose in two-byte letters, like them otherwise."""
    return two_byte_letters(corpus) and unlike_the_novels(corpus) is None


def predicted_text(value, sigma):
    """A prediction and its uncertainty as the plan prints them: "2.430 +- 0.110", or where the uncertainty is as
    large as the prediction (a text easier than the study's), "0.762 (a guess)": a band down to 0 says nothing more."""
    return f"{value:.3f} (a guess)" if sigma >= value else f"{value:.3f} +- {sigma:.3f}"


def reading(corpus):
    """The hardness the law reads a corpus at: its n-gram hardness, or where lzma reads its val sample better (a
    text of long repeats: code, markup, records), REPEATS of the way from the n-grams to lzma."""
    if corpus.repeats is None or corpus.repeats >= corpus.hardness:
        return corpus.hardness
    return corpus.hardness - REPEATS * (corpus.hardness - corpus.repeats)


def floor(corpus, law=LAW):
    """E of the law: the corpus's own floor, from its reading, at least the study's easiest text's."""
    return law["e0"] + law["e1"] * max(reading(corpus), STUDIED_HARDNESS[0])


def unstudied(corpus):
    """Whether a corpus reads past the study's texts: easier or harder than all of them, or by lzma's repeats."""
    r = reading(corpus)
    return not STUDIED_HARDNESS[0] <= r <= STUDIED_HARDNESS[1] or corpus.hardness - r > REPEATS_NOTED


def reading_note(corpus):
    """The plan's words on how the law reads a corpus, where that is more than its n-grams."""
    r, (easiest, hardest) = reading(corpus), STUDIED_HARDNESS
    note = ""
    if corpus.hardness - r > REPEATS_NOTED:
        note += (f"; lzma, which finds long repeats, at {corpus.repeats:.2f}: a text that repeats itself (code, "
                 f"markup, records) is read {REPEATS:.0%} of the way to it, at {r:.2f}")
    if r < easiest:
        note += (f"; easier than every text of the study ({easiest:.2f} to {hardest:.2f}), so the prediction is the "
                 f"easiest's times {easier(corpus):.2g}")
    elif r > hardest:
        note += (f"; harder than every text of the study ({easiest:.2f} to {hardest:.2f}): the law's line goes on "
                 f"past it")
    return note


def easier(corpus):
    """What the law's prediction is scaled by: 1, or for a text that reads easier than the study's easiest, its
    reading over that one's (never 0: a text of one character repeated reads 0)."""
    return min(1.0, max(reading(corpus), 0.01) / STUDIED_HARDNESS[0])


def fills(corpus, dropout, law=LAW):
    """The blocks' parameters a corpus fills at most: more under dropout (it keeps a larger model from memorizing)."""
    return law["N_100k"] * (corpus.train_bytes / 1e5) ** law["N_exponent"] * (1 + law["N_dropout"] * dropout)


def predict_bpb(keys, tokens, corpus, law=LAW):
    """The law's val bpb for a run of keys on corpus that trains on `tokens` tokens."""
    n = min(blocks_params(keys), fills(corpus, keys.get("dropout", 0.0), law)) / 1e6
    s = learnable_bytes(tokens * corpus.bytes_per_token, corpus.train_bytes, keys.get("dropout", 0.0), law) / 1e6
    scale = easier(corpus) * (EASIER_LETTERS if letters_prose(corpus) else 1.0)
    return (floor(corpus, law) + law["A"] * n ** -law["alpha"] + law["B"] * max(s, 1e-6) ** -law["beta"]) * scale


# ---------------------------------------------------------------------------------------------------------------
# Probing this machine: seconds per iteration of two shapes, measured; the others follow their FLOPs.
# ---------------------------------------------------------------------------------------------------------------

def step_times(model, step_model, optimizer, batch_size, block_size, accum, grad_clip, device, ctx, warmup, iters,
               teachers=None):
    """Seconds of each of `iters` training iterations (forward, backward, clip, optimizer step on a random
    batch) after `warmup` more: train.py's iteration without its data and logging. teachers: a distill.Teachers
    whose loss the iteration learns from, as a --teacher run's does."""
    x = torch.randint(0, model.config.vocab_size, (batch_size, block_size), device=device)
    times = []
    for i in range(warmup + iters):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(accum):
            with ctx:
                logits, loss = step_model(x, x)
                if teachers is not None:
                    loss = teachers.loss(x, x, logits, loss)
            (loss / accum).backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


PROBE_ITERS = 4  # iterations a probe of one shape runs: one to warm up, three timed
PROBE_SHARE = 0.02  # of the budget, at most, for timing the larger shape
TIMED_CHOICES = 2  # shapes timed after being chosen, at most (each a probe of one shape)
DROPOUT_FACTOR = 1.8  # dropout's time where the probe cannot afford to time it: the most measured (1.13-1.82)


def trainable(cfg, vocab_size, device, dtype):
    """(model, kernels, optimizer) of cfg, new, as the run will build them (its matmul kernels and optimizer)."""
    from model import GPT
    from nanogpt.device import training_kernels
    from nanogpt.training.optim import OptimizerSettings, configure_optimizers
    model = GPT(cfg.model_config(vocab_size)).to(device)
    kernels = training_kernels(cfg, device, dtype, log=lambda *a, **k: None)
    return model, kernels, configure_optimizers(model, OptimizerSettings.of(cfg, kernels.ns_dtype))


def iteration_seconds(cfg, vocab_size, device, dtype, warmup=1, iters=PROBE_ITERS - 1):
    """This machine's seconds per training iteration of cfg (a TrainConfig): the fastest of `iters`, as the run
    will compute it (its matmul kernels and optimizer)."""
    from nanogpt.device import autocast
    model, kernels, optimizer = trainable(cfg, vocab_size, device, dtype)
    with kernels.applied(model):
        times = step_times(model, model, optimizer, cfg.batch_size, cfg.block_size, cfg.gradient_accumulation_steps,
                           cfg.grad_clip, device, autocast(device, dtype), warmup, iters)
    return min(times)


def teaching_seconds(cfg, teachers, vocab_size, device, dtype, rounds=PROBE_ITERS):
    """The seconds the teachers (their GPTConfigs) add to an iteration of cfg on this machine: their forward
    passes over its tokens and the loss against their predictions, timed as the difference between the quickest
    of `rounds` iterations with them and without, taken in turn (a drift of the machine falls on both). Planned from
    FLOPs instead, as a third of their training step's, 2 x 128 teachers took 102 ms of a 4 x 192 iteration on 300
    KB of Chinese text and the run measured 300-500 ms: it ran 144 of the 181 iterations it planned."""
    from model import GPT
    from nanogpt.device import autocast
    from nanogpt.training.distill import Teachers, teacher_context
    model, kernels, optimizer = trainable(cfg, vocab_size, device, dtype)
    models = [GPT(config).to(device).eval().requires_grad_(False) for config in teachers]
    ctx = autocast(device, dtype)
    taught = Teachers(models, cfg.distill, teacher_context(device, dtype, kernels))
    alone, both = [], []
    with kernels.applied(model):
        for i in range(rounds):  # the first of each warms up
            for times, with_them in ((alone, None), (both, taught)):
                times += step_times(model, model, optimizer, cfg.batch_size, cfg.block_size,
                                    cfg.gradient_accumulation_steps, cfg.grad_clip, device, ctx, 0, 1, with_them)
    return max(0.0, min(both[1:]) - min(alone[1:]))


def within_measured(speed, cfg, vocab_size):
    """Whether a shape's FLOPs an iteration lie between the least and the most of the shapes a Speed measured."""
    flops = flops_per_iter(vars(cfg), vocab_size)
    return bool(speed.flops) and min(speed.flops.values()) <= flops <= max(speed.flops.values())


@dataclass
class Speed:
    """Seconds per iteration as a + b * FLOPs per iteration, from two probed shapes, times dropout_factor for a
    run with dropout (its masks, and attention without the fused kernel, which has no dropout on a CPU)."""
    a: float
    b: float
    probed: dict  # shape name -> measured seconds per iteration
    dropout_factor: float = 1.0
    teaching: float = 0.0  # seconds a --teacher run's teachers add to each iteration (teaching_seconds)
    timed: dict = field(default_factory=dict)  # shapes timed after a plan chose them: their seconds, not the line's
    flops: dict = field(default_factory=dict)  # shape name -> FLOPs an iteration, of the shapes measured

    def seconds(self, flops, dropout=0.0, name=None):
        base = self.timed[name] if name in self.timed else self.estimate(flops)
        return base * (self.dropout_factor if dropout else 1.0)

    def estimate(self, flops):
        """The line's seconds, until a shape chosen has been timed off it: then a shape between two measured ones
        takes the line between those two, and one past the largest measured is no faster a FLOP than it. Two small
        shapes probed on a short budget put the line far below the large ones: on 300 KB of Chinese text in 1.5
        minutes, after 2 x 64 and 3 x 96 were probed, 6 x 256 was chosen and timed at 970 ms, and then 6 x 384,
        larger, was chosen at the line's 474 ms and ran 33 of its 150 iterations."""
        line = self.a + self.b * flops
        if not self.timed:
            return line
        known = sorted((self.flops[n], s) for n, s in {**self.probed, **self.timed}.items() if n in self.flops)
        below = [(f, s) for f, s in known if f <= flops]
        above = [(f, s) for f, s in known if f > flops]
        if not below:
            return line
        (f0, s0) = below[-1]
        if not above:
            return max(line, s0 * flops / f0)
        (f1, s1) = above[0]
        return s0 + (s1 - s0) * (flops - f0) / (f1 - f0)


def probe(candidates, vocab_size, device, dtype, budget, dropout=0.0, left=math.inf):
    """Speed of this machine: the smallest candidate timed, then the largest whose timing costs at most
    PROBE_SHARE of the budget (by the first one's speed), and a line through the two in FLOPs. With a dropout,
    the largest timed is timed again with it, for the factor a run with dropout takes. left: the seconds the
    budget has for training; when the smallest cannot run MIN_ITERS in them, nothing more is timed."""
    names = list(candidates)
    small = names[0]
    probed = {small: iteration_seconds(candidates[small], vocab_size, device, dtype)}
    f_small = flops_per_iter(vars(candidates[small]), vocab_size)
    if MIN_ITERS * probed[small] > left - PROBE_ITERS * probed[small]:  # too short for anything: said now
        return Speed(0.0, probed[small] / f_small, probed, flops={small: f_small})
    affordable = [n for n in names[1:] if PROBE_ITERS * probed[small] * flops_per_iter(vars(candidates[n]), vocab_size)
                  / f_small <= PROBE_SHARE * budget]
    large = affordable[-1] if affordable else small
    if large != small:
        probed[large] = iteration_seconds(candidates[large], vocab_size, device, dtype)
    factor = 1.0
    if dropout and PROBE_ITERS * probed[large] > PROBE_SHARE * budget:
        factor = DROPOUT_FACTOR  # timing it would cost more than its share: the slowest factor measured
    elif dropout:
        factor = max(1.0, iteration_seconds(replace(candidates[large], dropout=dropout), vocab_size, device, dtype)
                     / probed[large])
    f_large = flops_per_iter(vars(candidates[large]), vocab_size)
    flops = {small: f_small, large: f_large}
    if large == small or f_large <= f_small or probed[large] <= probed[small]:
        return Speed(0.0, probed[large] / f_large, probed, factor, flops=flops)  # proportional to FLOPs
    b = (probed[large] - probed[small]) / (f_large - f_small)
    return Speed(max(0.0, probed[small] - b * f_small), b, probed, factor, flops=flops)


# ---------------------------------------------------------------------------------------------------------------
# Choosing: every shape of the ladder with the user's keys over it, at every dropout; the lowest prediction wins.
# ---------------------------------------------------------------------------------------------------------------
MIN_ITERS = 50  # fewer iterations than this train nothing worth keeping
MIN_WINDOWS = 24  # val windows an evaluation reads at the least (two batches), however short the budget
# The most epochs a plan schedules, by dropout. In the study every run without dropout had its best val loss at 2.4
# to 4.3 epochs, and a schedule that ran on past that was worse at its best than one that ended there (its rate was
# still high at the best point). So a plan ends there, and ends early if the budget buys more; the plan says so.
MAX_EPOCHS = 4.0
# Chinese text is used up sooner: on the first 300 KB of two vernacular novels (水浒传, 三国演义; 4 x 192 without
# dropout), schedules of 3 epochs ended 0.4% and 0.6% below schedules of 4, 水浒传's 4 peaking at 3.1; 宋詩's first
# 1 MB peaked at 2.4 of 4 and 西游记's first 300 KB at about 3. A text of Chinese characters plans at most 3.
CHINESE_EPOCHS = 3.0
DROPOUT_EPOCHS = 30.0  # more a unit of dropout: 10 at 0.2, where War and Peace's first 100 KB peaked with it; 7 at
# 0.1 lies between, not measured as a peak: the study's two runs at 0.1 the law holds still improved at 5.4 and 7
EXIT_SECONDS = 2.0  # the final save, the summary and the interpreter's exit
# Where the budget sees the text as often as a model learns from it, the budget buys more as three runs (parts.py):
# plans of 0.3 and 0.3 of it into out_dir/teacher-a and out_dir/teacher-b (the second with the next seed), then one
# of 0.4 into out_dir that distils both (train.py --teacher), each part to the end of its share from process start.
# Against one run of 10 minutes the plan's three ended 3.3% lower on Pride and Prejudice's first 100 KB, 3.4% on
# 100 KB of Don Quijote and 2.5% on the study's Shakespeare (1 MB, which one run sees 3.8 times; docs/minutes.md):
# the prediction is one run's less their mean. Split shorter on a 2-core AMD EPYC (Zen 3): 4.55 minutes of 300 KB of
# a vernacular Chinese novel, 1.3% below one run of 3 epochs (by hand, 3.4% below one of 4), and 5 minutes of Pride
# and Prejudice's 100 KB, 3.0% below one run. On a faster one (Zen 4, bfloat16 products), which uses that novel's
# 300 KB up in 1.5 minutes: 2.9 and 2 minutes 2.5% and 2.4% below one run, 1.5 minutes 1.2% (and tiny Shakespeare's
# first 100 KB 1.7%). What the text is worth, not the clock, says when to split; the clock says only whether parts of
# a few tens of seconds each pay for their start-up, probe and evaluations: from 2 minutes, a margin above the
# shortest measured for a slower machine's fixed costs (docs/results.md, "Three runs from 2 minutes")
DISTILL_SHARES = (0.3, 0.3, 0.4)
DISTILL_MINUTES = 2.0  # the shortest budget split
DISTILL_GAINS = (0.033, 0.034, 0.025, 0.030, 0.013, 0.025, 0.024)  # 10 minutes: two texts of 100 KB, then the 1 MB;
# then 5 minutes of Pride and Prejudice's 100 KB and 4.55 of 300 KB of 西游记 (Zen 3), and 2.9 and 2 minutes of the
# same 300 KB (Zen 4), each against one run of the same budget
DISTILL_GAIN = f"{DISTILL_GAINS[0]:.1%} and {DISTILL_GAINS[1]:.1%}"
DISTILL_GAIN_1MB = f"{DISTILL_GAINS[2]:.1%}"
DISTILL_GAIN_SHORT = f"{DISTILL_GAINS[3]:.1%} and {DISTILL_GAINS[4]:.1%}"
DISTILL_GAIN_FAST = f"{DISTILL_GAINS[5]:.1%} and {DISTILL_GAINS[6]:.1%}"
DISTILL_MEAN_GAIN = sum(DISTILL_GAINS) / len(DISTILL_GAINS)  # what a plan in parts predicts below one run
HAND_GAIN = "0.7% and 2.1%"  # the same three by hand, 3, 3 and 4 minutes each from its own start (torchrun's line)
USED_UP = 0.9  # of the epochs a model learns from (max_epochs): a budget that buys this many is split
# ... where a teacher can learn nearly what one run does: the third gains what its teachers know together, and they
# know less than one run where the text is large for the budget. By the law, the first teacher (the best shape in
# DISTILL_SHARES[0] of the budget) against one run, and what three runs measured against one: 0.8% and 1.1% above,
# 2.5% and 2.4% lower (西游记's first 300 KB at 2.5-2.9 and 2 minutes, Zen 4); about 2% above, 2.5% lower (tiny
# Shakespeare at 10 minutes, Intel Xeon); 3.1% above, level (宋詩's first 1 MB at 3 minutes, Zen 4: teachers at 1.4
# epochs); 4.8% above, 1.5% higher (三国演义, 1.6 MB, at 4 minutes, Zen 4: teachers at about 1 epoch); 7.4% above,
# 3.3% higher (红楼梦's 2.26 MB at 3 minutes, Zen 4: teachers at 1.1 epochs); 3.002% above (over the 3% this limit
# was, so one run), 1.4% lower (鲁迅's fiction, 739 KB, at 3.2 minutes, Zen 3, held out). Three runs against one
# rise with the gap and cross level between 3.1% and 4.8% (3.8% on a line through the seven). docs/results.md
TEACHER_GAP = 0.035
TEACHER_DIRS = ("teacher-a", "teacher-b")  # in out_dir: the two runs the third learns from
EVAL_SHARE = 0.04  # of the training time, for evaluations (and the saves beside them)


def max_epochs(dropout, corpus=None, taught=False):
    """The most epochs a plan schedules at this dropout, of corpus where given (fewer of Chinese text); taught: for a
    run that learns from teachers (more)."""
    chinese = corpus is not None and corpus.ideographs >= IDEOGRAPHS
    if taught:
        return TAUGHT_CHINESE_EPOCHS if chinese else TAUGHT_EPOCHS
    return (CHINESE_EPOCHS if chinese else MAX_EPOCHS) + DROPOUT_EPOCHS * dropout


def useful_iters(dropout, corpus, tokens_per_iter, taught=False):
    """The iterations a run learns from: the epochs of corpus it is worth at this dropout, at least MIN_ITERS."""
    return max(MIN_ITERS, math.ceil(max_epochs(dropout, corpus, taught) * corpus.train_tokens / tokens_per_iter))


def more_minutes(dataset):
    """What a planned run that is over, or resumed with another budget, tells a user who wants more: its plan is
    kept (its schedule has decayed, and its budget counts the time already spent), so more minutes are a new plan."""
    return (f"for more minutes, plan a new run, which chooses the model they buy: python train.py "
            f"--dataset={shlex.quote(str(dataset))} --minutes=M --out_dir=NEW_DIR")


def minutes_text(minutes):
    return f"{minutes:g} minute{'' if minutes == 1 else 's'}"


def largest_block(corpus, wanted=128):
    """The context: `wanted`, or the largest power of 2 whose windows fit in each split (dataset's rule)."""
    return context_that_fits(corpus.path, corpus.train_tokens, corpus.val_tokens, wanted)


def early_end_lines(ends_early, iters, epochs, dropout, finish, minutes, capped, corpus, parts=False, taught=False):
    """The plan's line on a run that ends well before its budget: the epochs a corpus is worth, the fewest
    iterations a plan runs on a text too small for them, or the user's max_iters (parts: the one run that three
    replace)."""
    end = f"{'one run would end' if parts else 'the run ends'} after about {finish / 60:.1f} of the {minutes_text(minutes)}"
    if capped:
        return [f"your max_iters={iters:,} is the run's length: {end}"]
    most = max_epochs(dropout, corpus, taught)
    if epochs > 1.05 * most and iters == MIN_ITERS:  # MIN_ITERS set the length: said whether or not it ends early
        return [f"{iters} iterations, the fewest a plan runs, are already {epochs:.0f} epochs of a text this small "
                f"(the study's smallest corpus had 35,000 tokens){': ' + end if ends_early else ''}, and the model "
                f"will largely memorize it; give more text for a model that writes its own"]
    if not ends_early:
        return []
    if taught and most == TAUGHT_EPOCHS:
        return [f"{most:g} epochs is as many as a run that learns from teachers was measured over (4 x 192 on 100 KB "
                f"of English: 9 epochs 3.1% below 4, still falling), so {end}"]
    if taught:
        return [f"{most:g} epochs of Chinese text is as many as a run that learns from teachers was measured over "
                f"(6 x 256 on a novel's first 300 KB: 5 epochs 0.7% to 1.0% below 3), so {end}"]
    if most < max_epochs(dropout):
        return [f"a model learns from at most {most:g} epochs of Chinese text (on two novels' first 300 KB, runs of "
                f"3 epochs ended lower than runs of 4), so {end}: more would only memorize this text"]
    return [f"{most:g} epochs is as many as a model learns from "
            + ("without dropout" if not dropout else f"at dropout {dropout:g}") + " (the study's runs "
            f"had their best at 2.4 to 4.3 epochs without it and at 10 with 0.2; 7 at 0.1 lies between), so {end}: "
            f"more would only memorize this text"]


def parts_lines(parts, minutes, out_dir, seed, world):
    """The plan's line on a budget that buys more as three runs than as one (its text used up): where they go
    (parts), or under torchrun (world > 1), where the plan does not split, the three commands."""
    out_dir = os.path.normpath(out_dir)  # "out/" names out-a beside it, not a folder in it
    first, second, third = plan_parts(seed)
    a, b, c = (f"{part['share'] * minutes:.3g}" for part in (first, second, third))
    if parts:
        measured = (f"{DISTILL_GAIN} below one run of 10 minutes on two texts of 100 KB, {DISTILL_GAIN_1MB} on 1 MB, "
                    f"{DISTILL_GAIN_SHORT} below one run of 5 and 4.55 minutes on 100 KB and 300 KB, and "
                    f"{DISTILL_GAIN_FAST} at 2.9 and 2 minutes on the 300 KB with a faster CPU")
        return [f"the {minutes_text(minutes)} go to three runs instead: a text used up gives more to three shorter "
                f"runs than to one (they ended {measured}; docs/minutes.md, \"More minutes than a text is worth\")",
                f"plans of {a} and {b} minutes into {out_dir}/{first['dir']} and {out_dir}/{second['dir']} (seeds "
                f"{first['seed']} and {second['seed']}), then one of {c} into {out_dir} that learns from the text and "
                f"from both (--teacher), starting from the better one's weights if it is planned fewer than "
                f"{WARM_EPOCHS:g} epochs; --plan_teachers=False keeps one run"]
    if world > 1:
        return [f"on a text used up three shorter runs do better than one: --minutes={a} --out_dir={out_dir}-a "
                f"--plan_teachers=False, --minutes={b} --out_dir={out_dir}-b --seed={second['seed']} "
                f"--plan_teachers=False, then --minutes={c} --teacher={out_dir}-a,{out_dir}-b, which "
                f"learns from both (so run by hand on two texts of 100 KB: {HAND_GAIN} below one run of 10 minutes; "
                f"docs/minutes.md, \"More minutes than a text is worth\")"]
    return []


def plan_parts(seed):
    """The three runs of a budget in parts, in order: each one's folder in out_dir ("" for out_dir itself), its
    share of the budget, its seed, and whether it learns from the two before it. The third starts from the first's
    seed (its weights and batches), as the three measured did."""
    return [dict(dir=TEACHER_DIRS[0], share=DISTILL_SHARES[0], seed=seed, distils=False),
            dict(dir=TEACHER_DIRS[1], share=DISTILL_SHARES[1], seed=seed + 1, distils=False),
            dict(dir="", share=DISTILL_SHARES[2], seed=seed, distils=True)]


# A run that learns from teachers is planned without dropout: their probabilities hold it back from memorizing the
# text already. On Pride and Prejudice's first 100 KB, 4 x 192 learning from two teachers (the plan's 7 minutes) for
# 5.1 epochs at 0.1 ended 1.8% above 4 epochs without it, over the same 400 windows.
DISTILLED_DROPOUT = ": no dropout (it learns from teachers, whose probabilities keep it from memorizing the text)"
# and for more epochs than a run alone: the same run without dropout for 4, 6 and 9 epochs reached 1.9771, 1.9360
# and 1.9167, each at its last evaluation (7 at 0.1: 1.9696); on War and Peace's first 100 KB, 4 and 9 epochs 2.2126
# and 2.1432. Past 9 it is unmeasured.
TAUGHT_EPOCHS = 9.0
# Chinese text, which a run alone uses up in 3 epochs, a taught run in more: 6 x 256 learning from the two teachers of
# a 10-minute plan on 西游记's first 300 KB (a Zen 4 AMD EPYC) ended 0.7% below 3 epochs (from a teacher's weights)
# after 5 from the same weights and 1.0% below after 5 from new ones (2.3039 and 2.2966 against 2.3202, whole val split
# in 64-token windows), once each. Past 5 it is unmeasured.
TAUGHT_CHINESE_EPOCHS = 5.0
# and from the weights of the better teacher, whose shape it takes, where it is planned a few epochs: a model that
# starts where a teacher ended passes the teachers' mean sooner than a new one, which catches up over more epochs.
# 4 x 192 learning from two teachers, iterations fixed: on 西游记's first 300 KB (the plan's teachers of 5.97
# minutes), from scratch 2.3490 in 150 iterations (2.5 epochs), from a teacher's weights 2.3496 in 75 and 2.3314 in
# 150; on Pride and Prejudice's first 100 KB (the plan's of 7 minutes), from scratch and from a teacher 1.9771 and
# 1.9551 for 4 epochs, about 1.929 (between 6 and 9) and 1.9324 for 7, 1.9167 and 1.9303 for 9. So from a teacher
# up to 5 epochs, from scratch past them (with the shape the budget chooses).
WARM_EPOCHS = 5.0
WARM_START = " (a model that starts where a teacher ended passes its teachers sooner than a new one)"


def dropout_reason(dropout, corpus, keys, epochs, taught=False):
    """The plan line's word on the dropout of a run of keys over `epochs` of corpus (taught: it learns from
    teachers)."""
    if dropout:
        return f": dropout {dropout} (it lets a model learn from more epochs of a small corpus)"
    if taught:
        return DISTILLED_DROPOUT
    if corpus.ideographs >= IDEOGRAPHS:
        return ": no dropout (on Chinese text it did not pay in the study, even over 10 epochs)"
    if len(planned_dropouts(corpus, keys)) == 1 and epochs > 3.5:
        return ": no dropout (it paid in the study only on a model larger than the text fills without it)"
    return ": no dropout (over so few epochs it slows learning more than it saves)"


def head_share(keys, vocab_size):
    """The output layer's share of an iteration's training FLOPs (flops_per_iter): 96% for 2 x 64 over GPT-2's 50,257
    tokens, 24% for 4 x 192 over the 3,261 characters of 西游记's first 300 KB."""
    head = 6 * keys["n_embd"] * vocab_size * keys["block_size"] * keys["batch_size"] * keys["gradient_accumulation_steps"]
    return head / flops_per_iter(keys, vocab_size)


# A vocabulary larger than this is more than a text of these minutes needs (data/prepare.py's BPE has 4,096 tokens,
# the characters of 30 MB of Song poems 10,919): GPT-2's 50,257, a BPE trained larger, or the characters of a text
# in many scripts. A plan whose output layer is most of its work on one says what to prepare instead.
BORROWED_VOCAB = 16_384


def why_slow(cfg, seconds, vocab_size, device):
    """What the too-short error says of the smallest shape: its time, its threads, and a large vocabulary."""
    keys = vars(cfg)
    text = f"{keys['n_layer']} x {keys['n_embd']}, the smallest shape, takes {seconds * 1000:,.0f} ms an iteration"
    if device.type == "cpu":
        text += f" on {how_many(torch.get_num_threads(), 'thread')}"
    if head_share(keys, vocab_size) > 0.5:
        text += f", most of it the output layer over a vocabulary of {vocab_size:,}"
    return text


def vocabulary_line(keys, vocab_size, tokenizer=None):
    """The plan's line where the output layer is most of an iteration's work, and what to prepare instead where the
    vocabulary is larger than BORROWED_VOCAB (tokenizer: the dataset's, whose own remedy is not offered); None where
    it is not most of it."""
    share = head_share(keys, vocab_size)
    if share <= 0.5:
        return None
    line = f"the output layer over a vocabulary of {vocab_size:,} is {share:.0%} of an iteration's work"
    if vocab_size > BORROWED_VOCAB:
        bpe = f"--tokenizer bpe --vocab_size {DEFAULT_BPE_VOCAB:,}"
        line += (f": a BPE of {DEFAULT_BPE_VOCAB:,} tokens trains on more of its {vocab_size:,} characters in these "
                 f"minutes (data/prepare.py --input YOUR_TEXT {bpe})" if tokenizer == "char" else
                 ": a vocabulary made for this text trains on more of it in these minutes (data/prepare.py --input "
                 f"YOUR_TEXT --tokenizer char, or {bpe})")
    return line


def in_memory(candidates, corpus, device, teachers=()):
    """The candidates whose training fits in the memory the device has free (the probe would build them), or a
    UserError naming the smallest's need; teachers: the GPTConfigs of the models a --teacher run learns from, whose
    predictions each step holds too. Counted as the heap holds them where it keeps freed blocks; where none fits so,
    the heap stops keeping them first (memory.settle_heap), so that the probe times what the run will do."""
    def needs(kept):
        return {name: training_bytes(c.model_config(vocab_size=corpus.vocab_size), c.batch_size, kept, teachers,
                                     on_cpu=device.type == "cpu") for name, c in candidates.items()}
    kept_needs = needs(True)
    free, kept, _ = settle_heap(device, min(kept_needs.values()))
    need = kept_needs if kept else needs(False)
    fits = {name: c for name, c in candidates.items() if free is None or need[name] <= free}
    if not fits:
        name = min(need, key=need.get)
        c = candidates[name]
        raise UserError(f"--minutes: the smallest planned model, {c.n_layer} x {c.n_embd} on micro-batches of "
                        f"{c.batch_size} x {c.block_size} tokens over a vocabulary of {corpus.vocab_size:,}, needs about "
                        f"{fmt_bytes(need[name])} to train, more than the {fmt_bytes(free)} free on {device.type}; "
                        f"close other programs, or set a smaller --batch_size or --block_size (over a large vocabulary "
                        f"the logits take most of it: prepare the text with a smaller one)")
    return fits


def make_plan(cfg, given, corpus, device, dtype, elapsed, log=print, world=1, teachers=(), start=None, teaching=None):
    """(keys, plan): the config keys of the best run of cfg.minutes for corpus on this machine, and the plan's
    record (what it chose, why, and its prediction). given: the keys the user set, which stay as they are;
    elapsed: the seconds already spent since the process started (they count in the budget); world: the processes
    under torchrun, each taking a share of every iteration's micro-batches; teachers: the GPTConfigs of the
    checkpoints a --teacher run learns from (distill.read_teachers, checked against their weights), whose forward
    passes each iteration also runs; start: the GPTConfig of the one of them whose weights the run starts from
    (WARM_START), whose shape it takes; teaching: the seconds the
    teachers add to an iteration, where a plan made again from scratch has timed them already."""
    budget = cfg.minutes * 60
    pinned = {k: v for k, v in (vars(start) if start else {}).items() if k in PLANNED and k != "dropout"}  # its shape
    block = pinned.get("block_size") or given.get("block_size") or largest_block(corpus)
    split = {"gradient_accumulation_steps": world, "batch_size": -(-RECIPE["batch_size"] // world)} if world > 1 else {}
    candidates = {}
    for name in LADDER:
        keys = {**rung_keys(name, {**given, **pinned}), **split, "block_size": block, "matmul_dtype": "auto", **given,
                **pinned}  # as it runs
        try:
            c = TrainConfig(**{**vars(cfg), **keys, "minutes": None, "init_from": "scratch"})
        except ValueError:
            continue  # the user's keys do not fit this shape (heads that do not divide its width, ...)
        if c not in candidates.values():  # keys of yours that set the whole shape make the rungs one: timed once
            candidates[name] = c
    if not candidates:
        raise UserError("--minutes: the keys you set fit none of the planned shapes; set n_layer, n_embd and n_head "
                        "together, or leave them to the plan")
    candidates = in_memory(candidates, corpus, device, teachers)
    t0 = time.time()
    taught = bool(cfg.teacher)  # a run that learns from teachers: no dropout, and more epochs
    # a dropout of yours is in the candidates, so their timing holds it (and the factor stays 1)
    dropouts = (given["dropout"],) if "dropout" in given else planned_dropouts(corpus, taught=taught)

    def train_seconds():  # what the budget leaves for training, less what probing has spent
        return (budget - elapsed - EXIT_SECONDS) * (1 - EVAL_SHARE)
    speed = probe(candidates, corpus.vocab_size, device, dtype, budget, 0.0 if "dropout" in given else max(dropouts),
                  left=train_seconds())
    if teachers:  # every candidate runs the same batches, so the teachers add the same time to each
        first = next(iter(candidates.values()))
        speed.teaching = (teaching_seconds(first, teachers, corpus.vocab_size, device, dtype) if teaching is None
                          else teaching)
    elapsed += time.time() - t0

    uniform = math.log2(max(2, corpus.vocab_size)) / corpus.bytes_per_token  # bits per byte of no training at all

    def weighed(seconds):  # every shape and dropout in `seconds` of training: (prediction, ..., fits) each
        choices = []
        for name, c in candidates.items():
            keys = vars(c)
            per_iter_tokens = c.batch_size * c.block_size * c.gradient_accumulation_steps
            for p in dropouts if "dropout" in given else planned_dropouts(corpus, keys, taught):
                per_iter = speed.seconds(flops_per_iter(keys, corpus.vocab_size), p, name)  # yours was probed
                per_iter += speed.teaching
                fits = int(seconds / per_iter)  # the iterations the time buys
                useful = useful_iters(p, corpus, per_iter_tokens, taught)
                iters = min(fits, useful, given.get("max_iters", math.inf))  # a max_iters of yours is a ceiling
                if p and "dropout" not in given and iters * per_iter_tokens < DROPOUT_FROM_EPOCHS * corpus.train_tokens:
                    continue  # too few epochs for dropout to pay (a dropout of yours is weighed as it is)
                # far below the study's sizes the law runs past what a uniform guess over the vocabulary scores
                prediction = min(predict_bpb({**keys, "dropout": p}, iters * per_iter_tokens, corpus), uniform)
                choices.append((prediction, iters * per_iter, name, p, iters, per_iter, fits))
        return choices

    def choose():
        choices = weighed(train_seconds())
        smallest = min(choices, key=lambda ch: ch[5])
        if smallest[6] < MIN_ITERS:
            # at that budget the probe times its larger shapes too (PROBE_SHARE each, dropout's a second time),
            # and the smallest's own time varies from probe to probe (4% between two here): a tenth to spare
            need = (elapsed + EXIT_SECONDS + MIN_ITERS * smallest[5] / (1 - EVAL_SHARE)) / (1 - 3 * PROBE_SHARE)
            need *= 1.1 / 60
            raise UserError(f"--minutes={cfg.minutes:g} is too short to train on {corpus.path} here: the shortest "
                            f"budget this machine allows for it is --minutes={math.ceil(need * 10) / 10:g} "
                            f"({why_slow(candidates[smallest[2]], smallest[5], corpus.vocab_size, device)})")
        able = [c for c in choices if c[6] >= MIN_ITERS]
        # the lowest prediction, even where a quicker run is within the law's error of it: on Pride and Prejudice's
        # first 100 KB at 3 minutes, 6 x 256 with dropout 0.2 for 10 epochs (predicted 1.985) measured 2.044, and
        # 4 x 192 with 0.1 for 7 (1.988, a minute's run) 2.090
        return min(able, key=lambda c: (c[0], c[1]))

    # the budget sees the text as often as a model learns from it: three runs (parts.py) where the parts can run, in
    # one process, of a plan's own text (not one that learns from teachers already, nor one whose length you set)
    # (and each part's share buys twice the fewest iterations a plan runs of the quickest shape: its own plan would
    # refuse less, after the parts before had trained)
    def teacher_gap(name, dropout, iters, prediction):
        """How far above one run's prediction the law puts the first teacher's (the best shape in its share of the
        budget), where the budget could go to three runs; None where it could not."""
        run = candidates[name]
        epochs = iters * run.batch_size * run.block_size * run.gradient_accumulation_steps / corpus.train_tokens
        quickest = min(speed.seconds(flops_per_iter(vars(c), corpus.vocab_size), 0.0, n) for n, c in candidates.items())
        share = (min(DISTILL_SHARES) * budget - EXIT_SECONDS) * (1 - EVAL_SHARE)  # a teacher's training seconds
        if not (epochs >= USED_UP * max_epochs(dropout, corpus) and cfg.minutes >= DISTILL_MINUTES and not taught
                and "max_iters" not in given and cfg.plan_teachers and share >= 2 * MIN_ITERS * quickest):
            return None
        return min(c[0] for c in weighed(share) if c[6] >= MIN_ITERS) / prediction - 1

    def splits(gap):  # the budget goes to three runs
        return gap is not None and gap <= TEACHER_GAP

    # the line through the probed shapes is optimistic between them (a shape in the middle ran 10-25% slower here),
    # so a chosen shape not probed is timed itself and the choice made again with its time, TIMED_CHOICES at most,
    # each where its timing costs at most PROBE_SHARE of the budget (past that the line is all there is), and not
    # where the budget goes to three parts, which plan their own shapes (timing one of the whole's spends their time:
    # 6 x 256, 4.4 s of 273 on 300 KB of Chinese text)
    for _ in range(TIMED_CHOICES):
        prediction, _, pick, pick_dropout, iters, per_iter, _ = choose()
        if (pick in speed.probed or pick in speed.timed or PROBE_ITERS * per_iter > PROBE_SHARE * budget
                or (world == 1 and splits(teacher_gap(pick, pick_dropout, iters, prediction)))):
            break
        t0 = time.time()
        speed.timed[pick] = iteration_seconds(candidates[pick], corpus.vocab_size, device, dtype)
        speed.flops[pick] = flops_per_iter(vars(candidates[pick]), corpus.vocab_size)
        elapsed += time.time() - t0
    predicted, _, name, dropout, iters, per_iter, fits = choose()
    ends_early = iters < fits and iters < given.get("max_iters", math.inf)
    chosen = candidates[name]
    keys = {k: v for k, v in {**rung_keys(name, {**given, **pinned}), **split, **pinned}.items()
            if k not in given or k in pinned}
    keys.update(block_size=block, dropout=dropout)
    tokens_per_iter = chosen.batch_size * chosen.block_size * chosen.gradient_accumulation_steps
    # a new model catches up from WARM_EPOCHS on, the 5 of a taught Chinese run's cap among them (its iterations,
    # rounded up, are a hair past it): there 5 epochs from new weights ended 0.3% below 5 from a teacher's
    if pinned and iters * tokens_per_iter >= 0.99 * WARM_EPOCHS * corpus.train_tokens:
        keys, plan = make_plan(cfg, given, corpus, device, dtype, elapsed, log, world, teachers,
                               teaching=speed.teaching)
        plan["why"].insert(3, f"from scratch, not from the better teacher's weights: from {WARM_EPOCHS:g} epochs on a "
                              f"new model catches up with one that starts from a teacher")
        return {**keys, "init_from": "scratch"}, plan
    keys.update(schedule_keys({**vars(chosen), **keys}, iters * tokens_per_iter))
    # evaluations: fixed windows over val and eval_iters batches of train each, within EVAL_SHARE of the training
    # time all together; a batch forward costs up to half an iteration (GPT-2's vocabulary: 0.64 of one measured),
    # without the teachers' passes (evaluations score the model alone)
    batch_forward = (per_iter - speed.teaching) / 2

    def eval_seconds(windows, train_batches):
        return (windows * chosen.block_size / tokens_per_iter + train_batches) * batch_forward
    share = EVAL_SHARE * train_seconds()
    windows = given.get("eval_windows") or max(1, min(400, corpus.val_tokens // chosen.block_size))
    eval_iters = given.get("eval_iters", 5)
    if "eval_windows" not in given and 4 * eval_seconds(windows, eval_iters) > share:  # 3, and iteration 0's
        eval_iters = given.get("eval_iters", world)  # fewer windows, and train's loss from a batch a process
        fit = (share / 4 / batch_forward - eval_iters) * tokens_per_iter / chosen.block_size
        windows = max(min(windows, MIN_WINDOWS), min(windows, int(fit)))
    # about 10 evaluations, or one an epoch where the corpus is seen more often than that (a small corpus peaks
    # within a few epochs: the best checkpoint must not fall between two evaluations), as many as the share allows
    epochs = iters * tokens_per_iter / corpus.train_tokens
    affordable = share / max(eval_seconds(windows, eval_iters), 1e-9)
    evals = int(max(3, min(affordable, max(10, min(200, epochs)))))
    keys.update(eval_windows=windows, eval_iters=eval_iters, eval_interval=max(1, iters // evals),
                log_interval=max(1, iters // 100), always_save_checkpoint=False, keep_best=True, matmul_dtype="auto")
    keys = {k: v for k, v in keys.items() if k not in given or k in pinned}
    # a max_iters of yours is a ceiling: the run starts at the iterations the budget has time for (the deadline
    # may take it up to yours), and a decay that ends where your max_iters does (a config file's lr_decay_iters
    # = max_iters, nanoGPT's rule) ends where the run does; a decay of yours that ends elsewhere is kept
    ceiling = given.get("max_iters")
    decay_follows = "lr_decay_iters" not in given or given["lr_decay_iters"] == ceiling
    if ceiling is not None and iters < ceiling:
        keys["max_iters"] = iters
        if decay_follows:
            keys["lr_decay_iters"] = iters
    final = {**vars(chosen), **keys}
    params = blocks_params(final)
    finish = elapsed + EXIT_SECONDS + iters * per_iter / (1 - EVAL_SHARE)  # seconds from start to exit, about
    early = ends_early and finish < 0.9 * budget
    gap = teacher_gap(name, dropout, iters, predicted)
    split_up = splits(gap)
    parts = split_up and world == 1
    size = f"{corpus.train_bytes / 1e6:.2f} MB" if corpus.train_bytes >= 10_000 else f"{corpus.train_bytes:,.0f} bytes"
    why = [f"{corpus.train_tokens:,} train tokens ({size}), vocabulary {corpus.vocab_size:,}"
           f", {corpus.bytes_per_token:.2f} bytes a token; character n-grams of its train text predict its val text at "
           f"{corpus.hardness:.2f} bits a byte" + reading_note(corpus),
           f"this machine: {per_iter * 1000:.1f} ms an iteration of {tokens_per_iter:,} tokens"
           + (f" on {how_many(torch.get_num_threads(), 'thread')}" if device.type == "cpu" else "") + " "
           f"({', '.join(f'{size_of(n)} {s * 1000:.1f} ms' for n, s in speed.probed.items())} probed"
           + "".join(f", {size_of(n)} {s * 1000:.1f} ms timed once chosen" for n, s in speed.timed.items())
           + ("" if name in speed.probed or name in speed.timed else
              f"; {size_of(name)} estimated from its FLOPs "
              + ("between them" if within_measured(speed, chosen, corpus.vocab_size) else
                 "beyond them"))
           + (f"; dropout takes {speed.dropout_factor:.2f}x as long" if speed.dropout_factor != 1.0 else "") + ")",
           *filter(None, [vocabulary_line(final, corpus.vocab_size, corpus.tokenizer)]),
           f"{final['n_layer']} layers x {final['n_embd']} ({params / 1e6:.2f}M in the blocks): "
           + (f"the lowest predicted val bpb of {len(candidates)} shapes at this budget" if len(candidates) > 1
              else "the shape of the teacher whose weights it starts from" + WARM_START if pinned
              else "the shape you set"),
           f"{iters:,} iterations, {iters * tokens_per_iter / 1e6:.2f}M tokens: {epochs:.1f} epochs of the corpus"
           + ("" if "dropout" in given and not dropout
              else dropout_reason(dropout, corpus, vars(chosen), epochs, taught))
           + ("; the best checkpoint is kept (a small corpus peaks within a few epochs)" if epochs > 4.5 else ""),
           *early_end_lines(early, iters, epochs, dropout, finish, cfg.minutes,
                            given.get("max_iters") == iters and finish < 0.9 * budget, corpus, parts, taught),
           *(parts_lines(parts, cfg.minutes, cfg.out_dir, cfg.seed, world) if split_up else []),
           *([f"one run, not three: in a teacher's {DISTILL_SHARES[0]:.0%} of the budget the law puts it {gap:.1%} "
              f"above one run, and three runs gained where a teacher ended within {TEACHER_GAP:.1%} of it"]
             if gap is not None and not split_up else [])]
    # below the study's sizes the law runs high (論語, 65 KB: 17% high; 3 KB of Shakespeare: 29%): a model of the whole
    # text is predicted no worse than the n-grams that read all of it (3 KB: 3.53, measured 3.69; 600 bytes: 4.75,
    # measured 4.32; 論語: 2.54, measured 2.21). The choice of shape is the law's, made above, and so is law_val_bpb,
    # which a plan in parts' revision scales by its teachers' measured against their own law (parts.revised)
    law_predicted = one_run_law = predicted
    capped = corpus.train_bytes < HARDNESS_SAMPLE and corpus.hardness < predicted
    if capped:
        predicted = corpus.hardness
    if parts:  # the parts' own plans say their schedules
        why.append(f"predicted: one run's {predicted:.3f}, less the {DISTILL_MEAN_GAIN:.1%} three runs gained on the "
                   f"texts measured")
        predicted *= 1 - DISTILL_MEAN_GAIN
        law_predicted *= 1 - DISTILL_MEAN_GAIN
    else:
        every = "iteration" if final["eval_interval"] == 1 else f"{final['eval_interval']} iterations"
        windows = "1 fixed val window" if final["eval_windows"] == 1 else f"{final['eval_windows']} fixed val windows"
        why.append(f"warm-up {final['warmup_iters']}, cosine decay to {final['min_lr']:.1e}; an evaluation every "
                   f"{every} over {windows}; best.pt and "
                   f"ckpt.pt keep the best val loss")
    sigma = LAW["rel_sigma"]
    if letters_prose(corpus):
        sigma = EASIER_LETTERS_SIGMA
        why.append(f"prose in two-byte letters ({corpus.two_byte_share:.0%} of its characters), easier than the "
                   f"study's: the easiest text's prediction scaled by {easier(corpus):.2g}, times {EASIER_LETTERS} "
                   f"(eight Russian novels ended 1.02 to 1.11 times the scaled one), +-{sigma:.0%} as measured on "
                   f"Russian; Greek, Hebrew and Arabic are planned the same way, unmeasured")
    elif easier(corpus) < 1:
        sigma = EASIER_SIGMA
        why.append("a text easier than the study's: its prediction is a guess (of such texts, seven of code, markup "
                   "and records ended at 0.12 to 1.12 times it; Russian prose, in characters as tokens, 1.02 to 1.11"
                   + (f"; this text, though in two-byte letters, is not read so: {unlike_the_novels(corpus)} were "
                      f"never measured" if two_byte_letters(corpus) else "") + ")")
    elif unstudied(corpus):
        sigma = UNSTUDIED_SIGMA
        why.append(f"a text unlike the study's: its prediction is less certain (+-{sigma:.0%}: six texts of code, "
                   f"markup and records were up to 12.4% off)")
    if corpus.train_bytes < HARDNESS_SAMPLE:  # its hardness read all of it, fewer bytes than the study's corpora
        sigma = max(sigma, SMALL_TEXT_SIGMA)  # never narrower than a guess's
        why.append(f"a text under {HARDNESS_SAMPLE // 1000} KB: its prediction is the least certain (+-"
                   f"{SMALL_TEXT_SIGMA:.0%} at the least; the study's smallest, 65 KB, was 17% off)")
        if capped:
            why[-1] += (f"; the law says {one_run_law:.3f}, but counting which characters follow which over all "
                        f"of it (n-grams) already scores {corpus.hardness:.3f}, so that is its prediction")
    if ceiling is not None and iters < ceiling:
        why.append(f"your max_iters={ceiling:,} is a ceiling: the run is "
                   + (f"the {iters:,} iterations this text is worth" if ends_early else
                      f"the {iters:,} iterations the budget has time for")
                   + (", and the decay ends with them" if decay_follows else
                      f", and your lr_decay_iters={given['lr_decay_iters']:,} is kept"))
        given = {k: v for k, v in given.items() if k != "max_iters" and (k != "lr_decay_iters" or not decay_follows)}
    if given:
        why.append("kept as you set them: " + ", ".join(f"{k}={v}" for k, v in given.items()))
    if cfg.teacher:
        why.append(f"distilled (--teacher): the {len(teachers)} teachers' forward passes and the loss against them are "
                   f"in the time an iteration takes above ({speed.teaching * 1000:.1f} ms of it, timed), and the "
                   f"prediction is a run's on the text alone")
    plan = {"minutes": cfg.minutes, "shape": name, "params": params, "tokens": iters * tokens_per_iter,
            "epochs": epochs, "iters": iters, "dropout": dropout, "ends_early": ends_early,
            "predicted_val_bpb": predicted, "law_val_bpb": law_predicted,
            "predicted_sigma": predicted * sigma, "seconds_per_iter": per_iter,
            "probe": speed.probed, "timed": speed.timed, "teaching": speed.teaching,
            "corpus": {k: v for k, v in vars(corpus).items()},
            "kept": sorted(given), "parts": plan_parts(cfg.seed) if parts else None,
            "teacher_gap": gap,  # the law's first teacher against one run where the text is used up, else None
            "ceiling": ceiling, "decay_follows": decay_follows,
            # the epochs a model learns from, in iterations: a deadline that finds more time never runs past them
            "most_iters": useful_iters(dropout, corpus, tokens_per_iter, taught),
            "why": why, "planned_at": elapsed}
    return keys, plan


# ---------------------------------------------------------------------------------------------------------------
# Keeping the budget: as the run measures its own speed, the iterations left are fitted to the time left.
# ---------------------------------------------------------------------------------------------------------------
def deadline_ceiling(plan, max_iters):
    """The most iterations a run of `plan` may reach however much time it finds: the epochs its text is worth (a
    machine faster than its probe finds more time than the text can use), or a max_iters the user set where that is
    fewer (a config file's 2000 on a 20 KB text ran 10 epochs where its plan said 4). None: no ceiling (a plan
    recorded before most_iters was)."""
    limits = [plan.get("most_iters")]  # the epochs the text is worth bind every plan, a max_iters of yours too
    if plan.get("ceiling") is not None:
        limits.append(plan["ceiling"])
    elif "max_iters" in plan.get("kept", []) or plan.get("ends_early"):  # its own length (or, recorded before
        # "ceiling" was, a max_iters of yours)
        limits.append(max_iters)
    limits = [n for n in limits if n is not None]
    return min(limits) if limits else None


class Deadline:
    """The iterations a run of cfg can still complete before `end` (a time.time()), its evaluations and final
    save included. update() returns a new max_iters, or None to keep the current one; never more than ceiling
    (a max_iters the user set: the budget may end a run sooner, never make it longer)."""

    def __init__(self, end, ceiling=None):
        self.end, self.ceiling = end, ceiling
        self.start = None  # (iter, training seconds) where the measured stretch began
        self.eval_seconds = 0.0  # the longest evaluation (with its saves) so far

    def evaluated(self, seconds):
        self.eval_seconds = max(self.eval_seconds, seconds)

    def update(self, iter_num, train_time, cfg, now=None):
        now = time.time() if now is None else now
        if self.start is None:
            self.start = (iter_num, train_time)
            return None
        done, spent = iter_num - self.start[0], train_time - self.start[1]
        if done < 5 or spent <= 0:
            return None
        per_iter = spent / done
        left = self.end - now - EXIT_SECONDS - self.eval_seconds  # the final evaluation is certain
        per_eval = self.eval_seconds / cfg.eval_interval
        n = max(0, int(left / (per_iter + per_eval)))
        target = iter_num + n if self.ceiling is None else min(self.ceiling, iter_num + n)
        if abs(target - cfg.max_iters) <= max(2, 0.01 * cfg.max_iters):
            return None
        return target


# The keys a plan sets: a user's own value of any of them is kept (and the plan says so); other keys are not its own.
PLANNED = (set(LADDER["S0"]) | {"max_iters", "lr_decay_iters", "warmup_iters", "min_lr", "eval_interval", "dropout",
                                "eval_windows", "eval_iters", "log_interval", "always_save_checkpoint", "keep_best",
                                "matmul_dtype"})


def plan_run(cfg, given, meta, data_dir, device, dtype, rank, world, elapsed, log=print, teachers=()):
    """(cfg, plan): cfg with the keys the plan chose for cfg.minutes, and the plan's record (rank 0 probes and
    chooses; every rank takes its plan). given: the keys the user set; teachers: the GPTConfigs of --teacher's
    checkpoints (distill.read_teachers)."""
    start = None
    if init_from_kind(cfg.init_from) != "scratch":  # a checkpoint: only one of the teachers the run learns from
        source = checkpoint_file(cfg.init_from)
        named = [os.path.realpath(p) for p in cfg.teacher.split(",")] if cfg.teacher and teachers else []
        if source is None or os.path.realpath(source) not in named:
            raise UserError(f"--minutes plans a new model from scratch, or one that starts from a teacher it learns "
                            f"from (--teacher); with --init_from={cfg.init_from} the model is the checkpoint's: drop "
                            f"--minutes and set max_iters, or train anew")
        start = teachers[named.index(os.path.realpath(source))]
    if meta and meta.get("chat"):
        raise UserError(f"--minutes plans pretraining on text, and {data_dir} is a chat dataset; fine-tune with a "
                        f"config (config/tangshi_sft.py) instead")
    keys = plan = error = None
    if rank == 0:
        try:
            split_paths(data_dir)  # before the tokenizer: a dataset that is not there needs no GPT-2 BPE
            vocab = (meta or {}).get("vocab_size") or cfg.vocab_size
            try:
                strings = token_byte_strings(tokenizer_from_meta(meta), vocab)
            except UserError as e:
                log(f"note: --minutes: counting a byte a token ({e})")
                strings = [bytes([i % 256]) for i in range(vocab)]
            corpus = read_corpus(data_dir, meta, strings)
            keys, plan = make_plan(cfg, {k: v for k, v in given.items() if k in PLANNED}, corpus, device, dtype,
                                   elapsed(), log, world, teachers, start)
        except UserError as e:
            error = str(e)
        except RuntimeError as e:  # the device failed while probing (a GPU that went away, out of memory)
            error = f"--minutes: probing {device} failed ({str(e).splitlines()[0]}); check the device, or use --device=cpu"
    keys, plan, error = from_rank0((keys, plan, error), world)
    if error:
        raise UserError(error)
    log(f"plan: {minutes_text(cfg.minutes)} on {data_dir}")
    for line in plan["why"]:
        log(f"  {line}")
    log(f"  predicted val bpb at the end: {predicted_text(plan['predicted_val_bpb'], plan['predicted_sigma'])}")
    return replace(cfg, **keys), plan


# Halfway through, a planned run has measured its text, which the law reads only through its n-gram hardness (up
# to 7.6% off on 西游记, 红楼梦 and 古文觀止). At the first evaluation at or past half the iterations then planned, the best
# val bpb so far times the law's prediction for a run to the end over its prediction for a run of the tokens
# trained so far: the end's prediction, revised. The law predicts whole runs, each with its decay, not a point
# mid-schedule: that the ratio carries is measured, not derived (docs/results.md, "Halfway, a run revises its
# prediction": 1.6% rms over 25 runs, -0.04% on average, so no factor of its own); stated as 2%
HALFWAY_SIGMA = 0.02
# On texts unlike the study's (reading(), UNSTUDIED_SIGMA) the revision ran high: 1.0% to 8.2% on Python, C headers,
# man pages, dpkg's records and PyTorch's Python, and 24% on apt and dpkg logs (1.5 to 2 minutes each), as these
# texts learn their repeats late in a run. So it is given that much uncertainty; and it is not made for a text that
# reads less than half as hard as the study's easiest (easier()), where the law's curve is that text's scaled down:
# the Rust book's HTML, at 0.11 of it, was revised 29% and 36% high, where the plan was 5% low and 2% high.
UNSTUDIED_HALFWAY_SIGMA = 0.24
HALFWAY_EASIEST = 0.5


def halfway_revision(plan, keys, iter_num, end, best):
    """(val bpb, sigma): the prediction for a run of keys that ends at iteration `end`, revised from the best val
    bpb it measured by iteration iter_num (HALFWAY_SIGMA); None before halfway, at the end, or for a run that
    learns from teachers, whose curve is not the law's (a plan in parts' third is revised by its teachers'
    measurements instead, parts.revised; a run you give --teacher is not revised), or on a text far easier than the
    study's (HALFWAY_EASIEST)."""
    halfway = 0 < iter_num < end <= 2 * iter_num
    corpus = Corpus(**plan["corpus"])
    if keys.get("teacher") or not halfway or not best or easier(corpus) < HALFWAY_EASIEST:
        return None
    tokens_per_iter = keys["batch_size"] * keys["block_size"] * keys["gradient_accumulation_steps"]
    to_go = predict_bpb(keys, end * tokens_per_iter, corpus) / predict_bpb(keys, iter_num * tokens_per_iter, corpus)
    sigma = (LETTERS_HALFWAY_SIGMA if letters_prose(corpus) else UNSTUDIED_HALFWAY_SIGMA if unstudied(corpus)
             else HALFWAY_SIGMA)
    return best * to_go, best * to_go * sigma


def plan_summary(plan, measured, iters, seconds, minutes, reached=False, revision=None):
    """The summary's line: predicted (and revised halfway: revision's val bpb and sigma) against measured, the
    budget spent (a resumed run's earlier training counted), and a run that fell well short of its planned
    iterations, which the prediction assumed (unless it ended on reaching a target_loss: reached)."""
    line = (f"plan: predicted val bpb {predicted_text(plan['predicted_val_bpb'], plan['predicted_sigma'])}"
            + ("" if revision is None else f", revised halfway to {predicted_text(*revision)}")
            + f", measured {measured:.3f} (the best checkpoint's); {seconds:.0f} s of the {minutes * 60:.0f} s "
            f"budget so far")
    if iters < 0.8 * plan["iters"] and not reached:
        line += (f"; it ran {iters:,} of the {plan['iters']:,} iterations planned, as they ran slower than the few "
                 f"the probe timed (a busy machine, or a probe that caught it at its fastest), so the prediction was "
                 f"for a longer run")
    return line


def recorded_plan(out_dir):
    """(plan, revision): the last plan out_dir/log.jsonl records, as it is, and the halfway revision recorded after
    it as (val bpb, sigma); None for either it lacks."""
    path = os.path.join(out_dir, "log.jsonl")
    records = read_log(path, note=lambda *a: None) if os.path.isfile(path) else []
    starts = [i for i, r in enumerate(records) if r.get("kind") == "plan"]
    if not starts:
        return None, None
    revisions = [r for r in records[starts[-1]:] if r.get("kind") == "revision"]
    numbers = tuple(positive(revisions[-1].get(k)) for k in ("revised_val_bpb", "revised_sigma")) if revisions else ()
    return records[starts[-1]], numbers if numbers and None not in numbers else None


def planned(out_dir):
    """(plan, revision): what a resumed run keeps, recorded_plan with the plan's fields checked."""
    plan, revision = recorded_plan(out_dir)
    return plan and checked_plan(plan, os.path.join(out_dir, "log.jsonl")), revision


def checked_plan(plan, path):
    """The plan a resumed run keeps, the fields it reads checked (a log may come from anyone): one line where one
    is wrong, before the run, not a traceback at its halfway or its end."""
    def wrong(key, value, what):
        raise damaged(path, "its plan", key, value, what)
    for key in ("predicted_val_bpb", "predicted_sigma"):
        if positive(plan.get(key)) is None:
            wrong(key, plan.get(key), "a positive number")
    for key in ("iters", "most_iters", "ceiling"):
        value = plan.get(key)
        if (key != "iters" and value is None) or (type(value) is int and value > 0):
            continue
        wrong(key, value, "a positive whole number")
    kept = plan.get("kept", [])
    if not isinstance(kept, list) or not all(isinstance(k, str) for k in kept):
        wrong("kept", kept, "a list of keys")
    corpus = plan.get("corpus")
    named = {f.name: f.type for f in fields(Corpus)}
    needed = {f.name for f in fields(Corpus) if f.default is MISSING}
    if not isinstance(corpus, dict) or set(corpus) - set(named) or needed - set(corpus):
        wrong("corpus", corpus, f"a corpus of {', '.join(named)}")
    for key, value in corpus.items():
        kinds = getattr(named[key], "__args__", (named[key],))  # float | None: (float, NoneType)
        number = type(value) in (int, float) and math.isfinite(value) and value >= 0
        if not (value is None and type(None) in kinds or type(value) is str and str in kinds
                or number and (float in kinds or type(value) is int and int in kinds)):
            wrong(f"corpus.{key}", value, f"a {' or '.join(k.__name__ for k in kinds)}")
    return plan


def damaged(path, whose, key, value, what):
    """The error for a plan's field that a log records wrong (a log may come from anyone)."""
    return UserError(f"{path}: {whose} records {key}={str(value)[:40]!r}, not {what}; a resumed run keeps the plan it "
                     f"began with: restore the file, or train anew in a new --out_dir")


def positive(value):
    """value where a log holds it as a positive finite number, else None."""
    return value if type(value) in (int, float) and math.isfinite(value) and value > 0 else None
