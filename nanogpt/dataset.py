"""Datasets from text: read a file or a directory of them, split it (the first 1 - val_fraction of the
characters train, the rest val, as nanoGPT splits; a directory's val is taken from each of its parts: val_spans),
tokenize it, and write train.bin / val.bin (uint16 tokens, uint32 if the vocabulary needs it) and meta.json (plus
nanoGPT's meta.pkl for char vocabularies), each renamed into place. data/prepare.py and every
data/<name>/prepare.py write their datasets with it."""
import argparse
import codecs
import os
import shlex
import unicodedata
import urllib.request

import numpy as np
from tqdm import tqdm

from nanogpt import REPOSITORY
from nanogpt.copies import INDEX_FILE, build_command, write_index
from nanogpt.errors import UserError, closest
from nanogpt.files import find_folder, folders_near, open_regular, open_to_write
from nanogpt.settings import read_config_file  # a recipe's assignments: what train.py would run
from nanogpt.tokenizer import GPT2BPE, CharTokenizer, TrainedBPE, ranks_text, write_meta
from nanogpt.values import how_many

CHUNK_BYTES = 1 << 22  # 4 MiB of text per read
DEFAULT_BPE_VOCAB = 4096
DATASET_RANKS_FILE = "tokenizer.bpe"  # a trained BPE's merges, beside a dataset's meta.json (an export's: export.py)
DATASET_FILES = ("train.bin", INDEX_FILE, "val.bin", DATASET_RANKS_FILE, "meta.pkl", "meta.json")  # renamed in this order
INDEX_TOKENS = 1 << 30  # prepare indexes a train split up to this (the index needs 5-10 bytes a token to build)
VAL_PARTS = 10  # a directory's val comes from up to about this many places in it (val_spans)
TMP = ".tmp"  # the suffix of a file written aside, in the dataset directory
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def dataset_dir(dataset):
    """data/<dataset> (beside train.py or under the working directory), or dataset itself if a directory."""
    return find_folder(dataset, "data", holding=["train.bin"]) or os.path.join(REPOSITORY, "data", dataset)


def prepared_dir(dataset):
    """dataset_dir(dataset) where it holds a train.bin; else the one-line error that says what --dataset named
    and how to prepare it."""
    folder = dataset_dir(dataset)
    if os.path.isfile(os.path.join(folder, "train.bin")):
        return folder
    raise missing_dataset(dataset)


def missing_dataset(dataset):
    """What --dataset named instead of a prepared dataset (a text file, a folder without train.bin, nothing), the
    prepared dataset its name is closest to, and the command that prepares one."""
    stem = os.path.splitext(os.path.basename(os.path.normpath(dataset)))[0] or "mytext"
    shown = lambda p: p if os.path.relpath(p).startswith("..") else os.path.relpath(p)  # noqa: E731  (from here)
    prepare = shown(os.path.join(REPOSITORY, "data", "prepare.py"))
    if os.path.isfile(dataset):
        return UserError(f"--dataset={dataset} is a text file, not a prepared dataset; prepare it first: python "
                         f"{prepare} --input {shlex.quote(dataset)} --out data/{stem}, then train with "
                         f"--dataset=data/{stem}")
    out = dataset if os.path.sep in os.path.normpath(dataset) else os.path.join("data", dataset)
    how = f"python {prepare} --input YOUR_TEXT --out {out}"
    folder = find_folder(dataset, "data")
    if folder is not None and os.path.isfile(os.path.join(folder, "prepare.py")):  # a recipe's: its own script
        return UserError(f"--dataset={dataset}: {folder} holds no train.bin; prepare it (python "
                         f"{shown(os.path.join(folder, 'prepare.py'))})")
    if folder is not None and any(not n.startswith(".") for n in os.listdir(folder)):  # a folder of texts
        return UserError(f"--dataset={dataset} is a folder without train.bin, not a prepared dataset; if it holds "
                         f"your texts, prepare them first: python {prepare} --input {shlex.quote(dataset)} --out "
                         f"data/{stem}, then train with --dataset=data/{stem}")
    if folder is not None:
        return UserError(f"--dataset={dataset}: {folder} holds no train.bin; prepare it (python {prepare} --input "
                         f"YOUR_TEXT --out {folder})")
    # the prepared dataset nearest what was typed, by name (a long shared folder makes every path look alike)
    near = folders_near(dataset, "data", holding=["train.bin"])
    guess = closest(os.path.basename(os.path.normpath(dataset)), list(near), cutoff=0.75)
    head = f"--dataset={dataset}: no prepared dataset there or under data/"
    if guess is not None:
        return UserError(f"{head}; did you mean --dataset={near[guess]}? Or prepare one: {how}")
    return UserError(f"{head}; prepare one: {how}")


def find_or_download(argv, here, url=SHAKESPEARE_URL):
    """The corpus path: --input PATH, else input.txt in `here`, else downloaded there."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", help="a local copy of the corpus (no download)")
    args = parser.parse_args(argv)
    if args.input:
        if not os.path.isfile(args.input):
            raise UserError(f"--input {args.input} not found")
        return args.input
    path = os.path.join(here, "input.txt")
    if not os.path.exists(path):
        print(f"downloading {url} to {path}")
        try:
            urllib.request.urlretrieve(url, path + ".tmp")
        except OSError as e:
            if os.path.exists(path + ".tmp"):
                os.remove(path + ".tmp")
            raise UserError(f"download failed ({e}); offline, pass a local copy with --input PATH") from None
        os.replace(path + ".tmp", path)
    return path


def list_inputs(path, log=print):
    """The input files: the file itself, or every file under a directory in sorted order, hidden files and
    folders (names starting with a dot) skipped, and so is a link whose target lies outside the directory (a
    note names it): a dataset holds only what the folder holds. (read_text reads only regular files.)"""
    if not os.path.isdir(path):
        if not os.path.lexists(path):
            raise UserError(f"input {path} not found; give a UTF-8 text file or a directory of them")
        return [path]
    files, inside = [], os.path.realpath(path)
    for d, dirs, names in os.walk(path):
        dirs[:] = [name for name in dirs if not name.startswith(".")]  # hidden folders (.git, .cache) at any depth
        for name in sorted(n for n in names if not n.startswith(".")):
            file = os.path.join(d, name)
            target = os.path.realpath(file)
            if os.path.commonpath([target, inside]) != inside:
                log(f"note: skipping {file}: it links to {target}, outside {path}; copy the file in to include it")
                continue
            files.append(file)
    files.sort()
    if not files:
        raise UserError(f"input directory {path} has no files")
    return files


# What a text that is not UTF-8 most often is, for the command that converts it: a Byte Order Mark's UTF-16, then
# mainland China's GB18030 (a superset of GBK and GB2312) and Taiwan's Big5, where the text they decode to is mostly
# ideographs (a Windows Chinese file; Latin-1 decodes any bytes, so it is no guess)
ENCODING_GUESSES = ("gb18030", "big5")
# What else a folder of a learner's texts holds, by the bytes such a file begins with: no encoding converts it
BINARY_FILES = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
                (b"%PDF", "a PDF"), (b"PK\x03\x04", "a zip archive (a .docx, .epub or .xlsx is one)"),
                (b"\xd0\xcf\x11\xe0", "an old Office document (.doc)"), (b"\x1f\x8b", "a gzip archive"))


def conversion(path, bad, sample=1 << 16):
    """How to convert path to UTF-8: iconv from the encoding its first bytes decode as, or from the one to name; or,
    where the text before the bad byte at offset `bad` is UTF-8 beyond ASCII, the stray byte to remove (é and ï
    in UTF-8 also read as GB18030 ideographs: converting such a file would garble it)."""
    with open_regular(path) as f:
        f.seek(max(0, bad - sample))
        before = f.read(min(bad, sample)).lstrip(bytes(range(0x80, 0xC0)))  # from a character's first byte
        f.seek(0)
        raw = f.read(sample)
    if any(b > 127 for b in before):
        try:
            before.decode("utf-8")
            return (f"the text before it is UTF-8, so that byte is stray: remove it, or save the file again as "
                    f"UTF-8")
        except UnicodeDecodeError:  # a character cut where `before` ends, or another encoding: guessed below
            pass
    out = shlex.quote(os.path.splitext(path)[0] + ".utf8.txt")
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        found = "UTF-16"
    else:
        found = None
        for encoding in ENCODING_GUESSES:
            try:
                text = codecs.getincrementaldecoder(encoding)().decode(raw)  # a character cut at the end waits
            except UnicodeDecodeError:
                continue
            wide = [c for c in text if ord(c) > 127]
            if wide and sum("\u4e00" <= c <= "\u9fff" for c in wide) >= 0.5 * len(wide):
                found = encoding.upper()
                break
    if found:
        return f"it reads as {found}: convert it first, iconv -f {found} -t UTF-8 {shlex.quote(path)} > {out}"
    return f"convert it first: iconv -f ITS_ENCODING -t UTF-8 {shlex.quote(path)} > {out} (iconv -l lists them)"


def check_is_text(path, raw, first):
    """A UserError where a file's bytes say it is no text: its first bytes (first: raw begins the file) an image's, a
    PDF's or an archive's (BINARY_FILES), or anywhere a zero byte outside UTF-16 (whose decoding fails on its own),
    which no text holds though UTF-8 allows it (a .docx can decode as UTF-8 for a while)."""
    kind = next((name for magic, name in BINARY_FILES if raw.startswith(magic)), None) if first else None
    if kind is None and b"\0" in raw and not (first and raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))):
        kind = "a binary file (it holds zero bytes; or UTF-16 without its byte order mark)"
    if kind:
        raise UserError(f"{path} is not text: it is {kind}; take it out of the input, or save its text as a UTF-8 "
                        f".txt file")


def read_text(path, chunk_bytes=None):
    """Yield (bytes read, text) chunks of chunk_bytes (CHUNK_BYTES) with universal newlines, as open(path).read()
    gives, less a Byte Order Mark at its start (Windows' Notepad writes one: a mark, not a character of the text);
    a file that is no text is refused (check_is_text)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES  # read at each call: tests set it small
    utf8 = codecs.getincrementaldecoder("utf-8")()
    pending = ""  # a trailing \r waits: it may start a \r\n
    offset = 0
    started = False  # whether any text has come: the BOM is the first character's place
    with open_regular(path) as f:  # a FIFO or a device in the input would never end
        while True:
            raw = f.read(chunk_bytes)
            check_is_text(path, raw, offset == 0)
            try:
                text = pending + utf8.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                if not raw:  # the bytes held back at the end never completed a character
                    raise UserError(f"{path} ends in the middle of a UTF-8 character (the file was cut, e.g. by "
                                    f"head -c): drop its last {how_many(len(utf8.getstate()[0]), 'byte')} or cut "
                                    f"it at a line end (head -n)") from None
                raise UserError(f"{path} is not UTF-8 text (bad byte near offset {offset + e.start}); "
                                f"{conversion(path, offset + e.start)}") from None
            if not started and text:
                started, text = True, text.removeprefix("\ufeff")
            offset += len(raw)
            pending = ""
            if raw and text.endswith("\r"):
                text, pending = text[:-1], "\r"
            yield len(raw), text.replace("\r\n", "\n").replace("\r", "\n")
            if not raw:
                return


def safe_pieces(chunks):
    """Re-cut text so no piece boundary changes BPE: cut only after a newline that a non-space follows.

    No chunk of GPT-2's split pattern, nor of GPT-4's (a trained BPE's), spans such a place.
    """
    carry = ""
    for text in chunks:
        text = carry + text
        cut, pos = -1, len(text) - 1  # text[pos + 1] must exist to look at
        while cut < 0:
            i = text.rfind("\n", 0, pos)
            if i < 0:
                break
            if not text[i + 1].isspace():
                cut = i + 1
            pos = i
        if cut <= 0:  # no safe place yet: keep reading (a single giant line is cut at the end)
            carry = text
            continue
        yield text[:cut]
        carry = text[cut:]
    if carry:
        yield carry


def scan(files, bar):
    """Total characters of each file and the set of characters used."""
    sizes, chars = [], set()
    for path in files:
        n = 0
        for nbytes, text in read_text(path):
            n += len(text)
            chars.update(text)
            bar.update(nbytes)
        sizes.append(n)
    return sizes, chars


def prepare(input_path, tokenizer="char", out_dir=".", val_fraction=0.1, log=print, vocab_size=DEFAULT_BPE_VOCAB,
            check=None):
    """Tokenize input_path into out_dir; returns {"train": n, "val": n, "vocab_size": n}.

    tokenizer: char, gpt2 (GPT-2's BPE), or bpe (a byte-level BPE of vocab_size tokens trained here
    on the train split, saved in out_dir beside meta.json). check(counts) may refuse the result with a
    UserError. Every file is written aside and renamed into place only once all of them are written and
    check has passed: a refused or failed prepare leaves out_dir as it was.
    """
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if tokenizer not in ("char", "gpt2", "bpe"):
        raise UserError(f"--tokenizer must be char, gpt2 or bpe, got {tokenizer!r}")
    if tokenizer == "bpe" and not 257 <= vocab_size <= 1 << 20:
        raise UserError(f"--vocab_size must be at least 257 (the 256 bytes and <|endoftext|>) and at most "
                        f"{1 << 20}, got {vocab_size}")
    files = list_inputs(input_path, log)
    if os.path.isdir(input_path):  # which files a folder gave: every file in it that is not hidden, of any name
        names = [os.path.relpath(f, input_path) for f in files]
        log(f"reading {len(files):,} file{'s' if len(files) > 1 else ''} of {input_path}: {', '.join(names[:5])}"
            + (f" and {len(names) - 5:,} more" if len(names) > 5 else ""))
    replacing = os.path.isfile(os.path.join(out_dir, "train.bin"))
    total_bytes = sum(os.path.getsize(f) for f in files)
    passes = 3 if tokenizer == "bpe" else 2  # scan, (train,) encode
    with tqdm(total=passes * total_bytes, unit="B", unit_scale=True, desc="prepare", disable=None) as bar:
        sizes, chars = scan(files, bar)
        total = sum(sizes)
        if total < 2:
            raise UserError(f"{input_path} holds {total} characters; a dataset needs at least 2")
        spans = val_spans(sizes, val_fraction)
        if tokenizer == "char":
            tok = CharTokenizer(sorted(chars))
            meta = {"tokenizer": "char", "chars": tok.chars}
        elif tokenizer == "gpt2":
            tok = GPT2BPE()
            meta = {"tokenizer": "gpt2", "encoding": "r50k_base"}
        else:
            tok = train_bpe(files, spans, vocab_size, bar)
            meta = tok.meta(DATASET_RANKS_FILE)
        meta["vocab_size"] = tok.vocab_size
        meta["dtype"] = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
        encode = tok.encode if tokenizer == "char" else tok.encode_ordinary
        created = not os.path.isdir(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        try:
            counts = write_splits(files, encode, tok.eot, spans, out_dir, np.dtype(meta["dtype"]), bar)
            if tokenizer == "bpe":
                with open_to_write(os.path.join(out_dir, DATASET_RANKS_FILE + TMP), "w", encoding="ascii") as f:
                    f.write(ranks_text(tok.enc._mergeable_ranks))
            staged = ["train.bin", "val.bin"] + ([DATASET_RANKS_FILE] if tokenizer == "bpe" else [])
            if 0 < counts["train"] <= INDEX_TOKENS:  # the copies' index (nanogpt/copies.py), of these train tokens
                write_index(out_dir, np.dtype(meta["dtype"]), train="train.bin" + TMP, out=INDEX_FILE + TMP)
                staged.append(INDEX_FILE)
            staged += write_meta(out_dir, meta, suffix=TMP)
            if check is not None:
                check(counts)
        except BaseException:
            discard(out_dir, created)
            raise
    commit(out_dir, staged)
    if replacing:
        log(f"note: replaced the dataset that was in {out_dir}")
    log(f"vocab size: {tok.vocab_size:,}")
    log(f"train has {counts['train']:,} tokens")
    log(f"val has {counts['val']:,} tokens")
    if counts["train"] > INDEX_TOKENS:
        log(f"note: the train split is too large to index here for finding copies; {build_command(out_dir)} "
            f"builds it")
    per_char = (counts["train"] + counts["val"]) / total
    note = tokenizer_note(out_dir, tok, np.dtype(meta["dtype"]), total_bytes) if tokenizer == "char" else None
    if note:
        log(note)
    if tokenizer == "gpt2" and per_char > 1.2:  # GPT-2's merges are English ones: other scripts fall apart into bytes
        log(f"note: GPT-2's BPE spends {per_char:.2f} tokens per character on this text, and a 50,257-token "
            f"vocabulary makes a small model mostly embedding; --tokenizer char or --tokenizer bpe fits it better")
    return {**counts, "vocab_size": tok.vocab_size}


# From the study behind train.py --minutes (docs/minutes.md#characters-or-a-bpe): on a 3.3 MB English novel, a BPE of
# 4,096 tokens trained on it reached 1.650 val bpb in 3 minutes where characters reached 1.822. Below a few MB, and
# for Chinese (a character is already a word's worth), characters stay the default.
BPE_FROM_BYTES = 3_000_000


def tokenizer_note(out_dir, tok, dtype, total_bytes):
    """The study's advice for a char dataset, or None: a BPE where the text is mostly Latin letters and large."""
    if total_bytes < BPE_FROM_BYTES:
        return None
    counts = np.bincount(np.memmap(os.path.join(out_dir, "train.bin"), dtype=dtype, mode="r"),
                         minlength=tok.vocab_size)
    letters = [i for i, c in enumerate(tok.chars) if c.isalpha()]
    latin = [i for i in letters if unicodedata.name(tok.chars[i], "").startswith("LATIN")]
    if not letters or 2 * counts[latin].sum() < counts[letters].sum():
        return None
    return (f"note: {total_bytes / 1e6:.1f} MB of mostly Latin letters: on such text a BPE trained on it beat "
            f"characters in the study (1.650 against 1.822 val bpb on a 3.3 MB novel in 3 minutes; docs/minutes.md); "
            f"try --tokenizer bpe")


def train_bpe(files, spans, vocab_size, bar):
    """A byte-level BPE of vocab_size tokens (the 256 bytes, merges, <|endoftext|>) trained with rustbpe
    on the train split (the characters outside the val spans), streamed."""
    try:
        import rustbpe
    except ImportError:
        raise UserError("--tokenizer bpe needs rustbpe: pip install rustbpe") from None

    pos = 0  # characters read so far

    def file_train_text(path):  # a file's train text: always its start, as its val is always its end
        nonlocal pos
        for nbytes, text in read_text(path):
            bar.update(nbytes)
            yield from (piece for split, piece in routed(text, pos, spans) if split == "train")
            pos += len(text)

    def train_text():  # re-cut file by file: one file's train end is never joined to the next file's start
        for path in files:
            yield from safe_pieces(file_train_text(path))
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(train_text(), vocab_size - 1)
    if trainer.vocab_size < vocab_size - 1:
        raise UserError(f"the train split supports only {trainer.vocab_size + 1} tokens (no pair of tokens repeats "
                        f"beyond that); use --vocab_size={trainer.vocab_size + 1} or less, or more text")
    ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
    return TrainedBPE(trainer.get_pattern(), ranks, {"<|endoftext|>": len(ranks)})


def val_spans(sizes, val_fraction):
    """The val split's character ranges [start, end) in the files' text, given each file's characters: the last
    val_fraction of each part. A part is a file of at least a twentieth of the text, or consecutive smaller files
    together until they hold a tenth (VAL_PARTS), and files too few at the end to be one close the last part. One file
    is split at its last val_fraction, as nanoGPT splits; a folder of books is validated on every book of a
    twentieth of it or more, and a folder of small files in ten places, not at the end of its last file alone."""
    total = sum(sizes)
    large = total / (2 * VAL_PARTS)
    parts, start, end = [], 0, 0
    for n in sizes:
        if n >= large and end - start >= large:  # a large file after files enough to be a part: a part of its own
            parts.append((start, end))
            start = end
        end += n
        if end - start >= total / VAL_PARTS:
            parts.append((start, end))
            start = end
    if end > start:
        if parts and end - start < large:
            start = parts.pop()[0]
        parts.append((start, end))
    return [(a + int((b - a) * (1 - val_fraction)), b) for a, b in parts]  # nanoGPT: data[:int(n*0.9)]


def routed(text, pos, spans):
    """(split, piece) for text, which starts at character pos of the whole, cut where a val span starts or ends."""
    for a, b in spans:
        if b <= pos or not text:
            continue
        if a >= pos + len(text):
            break
        if a > pos:
            yield "train", text[:a - pos]
            text, pos = text[a - pos:], a
        if b > pos:  # (not an empty span: a val_fraction so small that int() keeps every character in train)
            yield "val", text[:b - pos]
            text, pos = text[b - pos:], b
    if text:
        yield "train", text


def write_splits(files, encode, eot, spans, out_dir, dtype, bar):
    """Encode every file, routing the characters in the val spans to val.bin and the rest to train.bin; with eot,
    each split's text from one file is separated from the next file's by it."""
    counts = {"train": 0, "val": 0}
    outs = {s: open_to_write(os.path.join(out_dir, f"{s}.bin{TMP}"), "wb") for s in counts}  # never through a link
    last = {s: None for s in counts}  # the file each split's last text came from
    try:
        pos = 0  # characters seen so far
        for i, path in enumerate(files):
            def counted(p=path):
                for nbytes, text in read_text(p):
                    bar.update(nbytes)
                    yield text
            for piece in safe_pieces(counted()):
                for split, text in routed(piece, pos, spans):
                    ids = ([eot] if eot is not None and last[split] not in (None, i) else []) + encode(text)
                    np.asarray(ids, dtype=dtype).tofile(outs[split])
                    counts[split] += len(ids)
                    last[split] = i
                pos += len(piece)
    finally:
        for f in outs.values():
            f.close()
    return counts


def commit(out_dir, staged):
    """Rename each staged file over its name; remove the dataset files the new dataset has not (a stale
    meta.pkl or tokenizer.bpe would describe the old tokens: nanoGPT reads meta.pkl before meta.json)."""
    for name in DATASET_FILES:
        path = os.path.join(out_dir, name)
        if name in staged:
            os.replace(path + TMP, path)
        elif os.path.isfile(path):
            os.remove(path)


def discard(out_dir, created):
    """Remove the files written aside, and out_dir too where this prepare created it."""
    for name in DATASET_FILES:
        if os.path.isfile(os.path.join(out_dir, name + TMP)):
            os.remove(os.path.join(out_dir, name + TMP))
    if created and not os.listdir(out_dir):
        os.rmdir(out_dir)


def torch_cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def recipe_for(out, cuda=False):
    """The config that fits dataset out on this machine: the dataset's own (config/NAME_cpu.py on a CPU,
    config/NAME.py on a GPU, as train.py names them) where there is one, else Shakespeare's characters'."""
    name = os.path.basename(os.path.normpath(out))
    own = f"config/{name}.py" if cuda else f"config/{name}_cpu.py"
    if os.path.isfile(os.path.join(REPOSITORY, own)):
        return own
    return "config/shakespeare_char.py" if cuda else "config/shakespeare_char_cpu.py"


def recipe_settings(recipe):
    return read_config_file(os.path.join(REPOSITORY, recipe))


def train_command(out, counts, cuda=False, minutes=10):
    """A train.py command for this dataset on this machine. On a CPU, a dataset without a recipe of its own gets
    a plan (--minutes: the shape, schedule and context fitted to it and to this machine); otherwise its recipe,
    with a context that fits."""
    recipe = recipe_for(out, cuda)
    block = recipe_settings(recipe).get("block_size", 1024)
    fits = context_that_fits(out, counts["train"], counts["val"], block)
    name = os.path.basename(os.path.normpath(out))
    where = f"--dataset={shlex.quote(out)} --out_dir={shlex.quote('out-' + name)}"
    if not cuda and recipe == "config/shakespeare_char_cpu.py" and name != "shakespeare_char":
        return f"python train.py {where} --minutes={minutes}"
    command = f"python train.py {recipe} {where}"
    if fits < block:
        command += f" --block_size={fits}"
    return command


def context_that_fits(where, train, val, wanted):
    """`wanted`, or the largest power of 2 below it whose windows (context + 1 tokens) fit in both splits; a
    UserError where not even 8 do."""
    fits = min(train, val) - 1
    if fits < 8:
        raise UserError(f"{where} has {train:,} train and {val:,} val tokens: too few to train on, too few for a val "
                        f"split (a context of 8 needs 9 tokens in each); give more text or a larger --val_fraction")
    return min(wanted, 1 << (fits.bit_length() - 1))


def vocabulary_note(counts, recipe):
    """A note where the vocabulary makes the output layer most of a recipe's work on a CPU (GPT-2's 50,257
    tokens on a small model): train.py may then call the run sized for a GPU, and the cause is the tokenizer."""
    settings = recipe_settings(recipe)
    width, layers = settings.get("n_embd", 768), settings.get("n_layer", 12)

    def work(vocab):  # multiply-adds per token: the blocks' matrices and the output layer, attention aside
        return 12 * layers * width * width + vocab * width
    vocab = counts["vocab_size"]
    share = vocab * width / work(vocab)
    if share <= 0.75:
        return None
    return (f"note: the {vocab:,}-token vocabulary makes the output layer {share:.0%} of the work per token of "
            f"{recipe} ({work(vocab) / work(DEFAULT_BPE_VOCAB):.1f} times that of a {DEFAULT_BPE_VOCAB:,}-token "
            f"BPE): that is why, on a CPU, train.py may call the run sized for a GPU; --tokenizer char or "
            f"--tokenizer bpe --vocab_size {DEFAULT_BPE_VOCAB} trains in minutes there")
