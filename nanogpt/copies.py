"""Copies: the spans of a text found verbatim in a model's training text, where each occurs there, and the share
of the text they cover ("copied"). A small model trained on a few megabytes can recite as easily as write;
this says which it did (docs/copies.md).

The index is a suffix array of the train split's tokens (pydivsufsort), in train.sa beside train.bin:

    a 64-byte header, little-endian:  magic b"NGCOPIES", version (uint32), the bytes of a token in
    train.bin (uint16: 2 or 4), the bytes of a suffix-array entry (uint16: 4 or 8), the token count
    (uint64), the sha256 of train.bin (32 bytes), 8 zero bytes;
    then the suffix array: the token count of int32 (int64 from 2**31 tokens) start positions.

Every header field is checked against the file's size and train.bin before the array is mapped, and the array's
values against the token count, so no read goes past either file. prepare writes it with train.bin; a dataset
without one, or whose train.bin changed after it was built (its checksum differs), has it built on first use. A
file truncated, made for another train.bin after this one was written (copied from another dataset), or not of
this format is refused in one line and left as it is.

A query finds, for each position of the text, the longest run of tokens from there that the training text holds
(matching statistics: a binary search in the suffix array, all positions at once with numpy); the maximal runs of
at least min_chars(span) characters are the copied spans.
"""
import errno
import hashlib
import mmap
import os
import re
import struct
import tempfile
from dataclasses import asdict, dataclass

import numpy as np
from pydivsufsort import divsufsort

from nanogpt.errors import UserError
from nanogpt.files import find_folder, open_regular, open_to_write
from nanogpt.tokenizer import CharTokenizer, ChatTokenizer, read_meta, tokenizer_from_meta
from nanogpt.values import how_many

INDEX_FILE = "train.sa"
MAGIC = b"NGCOPIES"
VERSION = 1
HEADER = struct.Struct("<8sIHHQ32s8x")  # magic, version, token bytes, entry bytes, tokens, sha256 of train.bin
# a copy is a span long enough that chance does not explain it: one whole line of a 七言 poem in Chinese or
# Japanese (a shared 2- or 3-character word is vocabulary, not a copy); about five words elsewhere
CJK_MIN_CHARS = 7
OTHER_MIN_CHARS = 25
CJK = re.compile("[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003ffff]")
TRAIN_END, QUERY_END, NO_TOKEN = -1, -2, -3  # beyond train.bin; beyond the text; a character the vocabulary lacks
FIRST_WINDOW = 32  # tokens compared per search step; positions whose match fills it are searched again, wider
NEIGHBOURHOOD = 20  # characters of training text shown on each side of a span
CHUNK = 1 << 18  # entries (and bytes hashed) at a time: small beside the array, so memory stays the array's


def min_chars(span):
    """The characters a span needs to count as copied: CJK_MIN_CHARS where at least half of its letters are
    Chinese, Japanese or Korean, OTHER_MIN_CHARS otherwise."""
    letters = [c for c in span if c.isalpha()]
    cjk = sum(1 for c in letters if CJK.match(c))
    return CJK_MIN_CHARS if letters and 2 * cjk >= len(letters) else OTHER_MIN_CHARS


def build_command(folder):
    return f"python copies.py --dataset={folder} --build=True"


def sha256_of(path):
    digest = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.digest()


def sorted_bytes(tokens):
    """divsufsort's suffix array of tokens as bytes (which it overwrites): a uint8 token one byte, a wider one its
    big-endian bytes, whose order is the tokens' order (swapped in place). Int32 positions, int64 from 2**31 bytes."""
    if tokens.dtype.itemsize == 1:
        return divsufsort(tokens)
    return divsufsort(tokens.byteswap(inplace=True).view(np.uint8) if np.little_endian else tokens.view(np.uint8))


def whole_tokens(sa, width):
    """sorted_bytes' array of tokens `width` bytes wide, as the tokens' suffix array: the suffixes that start
    inside a token dropped and the rest divided by width, in place, a chunk at a time."""
    if width == 1:
        return sa
    kept = 0
    for start in range(0, len(sa), CHUNK):  # compact in place: kept never passes the chunk being read
        chunk = sa[start:start + CHUNK]
        whole = chunk[chunk % width == 0] // width
        sa[kept:kept + len(whole)] = whole
        kept += len(whole)
    return sa[:kept]


def write_index(folder, dtype, train="train.bin", out=INDEX_FILE):
    """Build the index of folder/train (tokens of dtype) and write it to folder/out, through a temporary file
    renamed into place; returns its path."""
    path = os.path.join(folder, train)
    # peak memory, the tokens and 4 bytes (8 from 2**31) per byte sorted: 5 bytes a token below 256, 10 for uint16;
    # the tokens are let go before anything else is allocated (narrowed, then sorted, then compacted)
    with open_regular(path) as f:
        tokens = np.fromfile(f, dtype=dtype)
    n = len(tokens)
    if not n or tokens.max() < 256:
        tokens = tokens.astype(np.uint8)  # one byte a token: the wide copy goes as the narrow one arrives
    width = tokens.dtype.itemsize
    sa = sorted_bytes(tokens)
    del tokens
    sa = whole_tokens(sa, width)  # one suffix a token
    entry = np.dtype(np.int32 if n < 2**31 else np.int64)
    header = HEADER.pack(MAGIC, VERSION, np.dtype(dtype).itemsize, entry.itemsize, n, sha256_of(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{out}.", dir=folder)
    os.close(fd)
    os.chmod(tmp, 0o644)  # as the dataset's other files (mkstemp makes it the owner's alone)
    try:
        with open_to_write(tmp, "wb") as f:
            f.write(header)
            for start in range(0, len(sa), CHUNK):
                f.write(sa[start:start + CHUNK].astype(entry).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, out))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return os.path.join(folder, out)


def dataset_dtype(folder):
    """The dtype of a dataset's tokens: its metadata's, else uint16 (nanoGPT's GPT-2 datasets have none)."""
    return np.dtype((read_meta(folder) or {}).get("dtype", "uint16"))


def mapped(f, dtype, offset, count):
    """count values of dtype from offset of the open file f, memory-mapped read-only (numpy refuses a map that
    would run past the file)."""
    if count == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype, count, offset)


class Index:
    """A dataset's train tokens and their suffix array, memory-mapped, and the searches over them."""

    def __init__(self, folder, dtype):
        self.folder = folder
        self.train_path = os.path.join(folder, "train.bin")
        self.path = os.path.join(folder, INDEX_FILE)
        if not os.path.isfile(self.train_path):
            raise UserError(f"{self.train_path} not found; copies are found in a dataset's training text: run its "
                            f"prepare.py")
        with open_regular(self.train_path) as f:
            size = os.fstat(f.fileno()).st_size
            if size % dtype.itemsize:
                raise UserError(f"{self.train_path} holds {size:,} bytes, not a whole number of {dtype} tokens; "
                                f"re-run the dataset's prepare.py")
            self.n = size // dtype.itemsize
            if self.n == 0:
                raise UserError(f"{self.train_path} holds no tokens: there is no training text to find copies in")
            self.tokens = mapped(f, dtype, 0, self.n)
        self.sa = self.open_suffix_array(dtype)
        self.lines = None  # the line starts, found on the first locate

    def open_suffix_array(self, dtype):
        """The checked suffix array, built first where it is missing or stale."""
        sha = sha256_of(self.train_path)
        if not os.path.exists(self.path):
            self.rebuild("is missing", dtype)
        try:
            f = open_regular(self.path)
        except OSError as e:
            raise UserError(f"{self.path} cannot be read ({e.strerror or e}); remove it and it is rebuilt") from None
        with f:
            raw = f.read(HEADER.size)
            size = os.fstat(f.fileno()).st_size
            if len(raw) < HEADER.size or raw[:len(MAGIC)] != MAGIC:
                raise UserError(f"{self.path} is not an index of copies (no NGCOPIES header); remove it and it is "
                                f"rebuilt")
            _, version, token_bytes, entry_bytes, count, file_sha = HEADER.unpack(raw)
            if version != VERSION:
                raise UserError(f"{self.path} is version {version} of the index format, this code reads {VERSION}; "
                                f"remove it and it is rebuilt")
            if file_sha != sha:
                if os.path.getmtime(self.path) < os.path.getmtime(self.train_path):  # built before train.bin changed
                    self.rebuild("is stale (train.bin changed since it was built)", dtype)
                    return self.open_suffix_array(dtype)
                raise UserError(f"{self.path} indexes another train.bin (sha256 {file_sha.hex()[:12]}..., this one's "
                                f"is {sha.hex()[:12]}...), written after this one: copied from another dataset? "
                                f"remove it and it is rebuilt")
            if token_bytes != dtype.itemsize or count != self.n or entry_bytes != (4 if count < 2**31 else 8):
                raise UserError(f"{self.path}'s header ({count:,} tokens of {token_bytes} bytes, entries of "
                                f"{entry_bytes}) does not fit {self.train_path} ({self.n:,} of {dtype.itemsize}): "
                                f"damaged; remove it and it is rebuilt")
            if size != HEADER.size + count * entry_bytes:
                raise UserError(f"{self.path} holds {size:,} bytes where its header says {HEADER.size + count * entry_bytes:,}"
                                f": truncated or damaged; remove it and it is rebuilt")
            sa = mapped(f, np.dtype(f"<i{entry_bytes}"), HEADER.size, count)
        if sa.min() < 0 or sa.max() >= self.n:  # every search reads train.bin at these positions
            raise UserError(f"{self.path} holds positions outside train.bin's {self.n:,} tokens: damaged or crafted; "
                            f"remove it and it is rebuilt")
        return sa

    def rebuild(self, why, dtype):
        try:
            write_index(self.folder, dtype)
        except PermissionError:
            raise UserError(f"{self.path} {why} and {self.folder} is read-only: make it writable and run "
                            f"{build_command(self.folder)}") from None
        except OSError as e:
            if e.errno != errno.EROFS:
                raise
            raise UserError(f"{self.path} {why} and {self.folder} is on a read-only file system: copy the dataset "
                            f"where you can write and run {build_command('COPY')}") from None

    def window(self, positions, width):
        """(len(positions), width) int64: the train tokens from each position, TRAIN_END past the end."""
        at = positions[:, None] + np.arange(width)
        out = self.tokens[np.minimum(at, self.n - 1)].astype(np.int64)
        out[at >= self.n] = TRAIN_END
        return out

    def lower_bound(self, keys):
        """For each row of keys, the first suffix-array slot whose suffix's first len(row) tokens are not less
        than the row (a vectorized binary search, one step for every row at once)."""
        lo, hi = np.zeros(len(keys), np.int64), np.full(len(keys), self.n, np.int64)
        rows = np.arange(len(keys))
        for _ in range(self.n.bit_length()):
            mid = (lo + hi) // 2
            suffix = self.window(self.sa[np.minimum(mid, self.n - 1)].astype(np.int64), keys.shape[1])
            differs = suffix != keys
            first = differs.argmax(1)
            less = differs.any(1) & (suffix[rows, first] < keys[rows, first]) & (lo < hi)
            lo, hi = np.where(less, mid + 1, lo), np.where(less | (lo >= hi), hi, mid)
        return lo

    def common_prefix(self, keys, slots):
        """The tokens each row of keys shares with the suffix at its slot (0 for a slot outside the array)."""
        inside = (slots >= 0) & (slots < self.n)
        suffix = self.window(self.sa[np.clip(slots, 0, self.n - 1)].astype(np.int64), keys.shape[1])
        same = suffix == keys
        return np.where(inside, np.where(same.all(1), keys.shape[1], same.argmin(1)), 0)

    def longest_matches(self, ids):
        """(length, position): for each start in ids, the longest run of tokens from there that train.bin holds,
        and where one occurrence starts. Positions whose match fills the window are searched again, 4x wider."""
        m = len(ids)
        padded = np.concatenate([ids, np.full(m, QUERY_END)])
        length, where = np.zeros(m, np.int64), np.zeros(m, np.int64)
        todo, width = np.arange(m), FIRST_WINDOW
        while len(todo):
            width = min(width, m)
            keys = padded[todo[:, None] + np.arange(width)]
            slot = self.lower_bound(keys)
            above, below = self.common_prefix(keys, slot), self.common_prefix(keys, slot - 1)
            best = np.maximum(above, below)
            length[todo] = best
            where[todo] = self.sa[np.clip(np.where(above >= below, slot, slot - 1), 0, self.n - 1)]
            todo = todo[(best == width) & (width < m)]
            width *= 4
        return length, where

    def occurrences(self, ids):
        """How often train.bin holds ids (a 1-d array of tokens), and the first of those occurrences."""
        keys = np.concatenate([ids, [QUERY_END]])[None]
        first = self.lower_bound(keys)[0]
        last = self.lower_bound(np.concatenate([ids, [np.iinfo(np.int64).max]])[None])[0]
        return int(last - first), int(self.sa[first:last].min())

    def line_of(self, position, newline):
        """The line number (from 1) of a train.bin position, for a tokenizer whose newline is one token."""
        if self.lines is None:
            self.lines = np.flatnonzero(self.tokens == newline)
        return int(np.searchsorted(self.lines, position)) + 1


@dataclass
class Span:
    """A copied span: text[start:end] (characters) is found verbatim count times in part's training text,
    first at where (e.g. "line 1,204"), between before and after."""
    start: int
    end: int
    text: str
    count: int
    part: str
    where: str
    before: str
    after: str


@dataclass
class Copies:
    """What a text took verbatim from training: its spans, the share of its characters inside them, and the
    characters of the longest."""
    spans: list
    copied: float
    longest: int

    def as_dict(self):
        return {"copied": round(self.copied, 4), "longest": self.longest, "spans": [asdict(s) for s in self.spans]}


class Part:
    """One body of training text (a dataset's train split) with its index, and how a position in it is named."""

    def __init__(self, folder, tokenizer, conversations=False):
        self.name, self.tokenizer = os.path.normpath(folder), tokenizer
        self.index = Index(folder, dataset_dtype(folder))
        self.starts = np.fromfile(os.path.join(folder, "train_index.bin"), np.int64) if conversations else None

    def where(self, position):
        if self.starts is not None:
            return f"conversation {int(np.searchsorted(self.starts, position, 'right')):,}"
        base = getattr(self.tokenizer, "base", self.tokenizer)
        if isinstance(base, CharTokenizer) and "\n" in base.stoi:
            return f"line {self.index.line_of(position, base.stoi[chr(10)]):,}"
        return f"token {position:,}"

    def text(self, start, stop):
        return self.tokenizer.decode(self.index.tokens[max(start, 0):min(stop, self.index.n)].tolist())


class Training:
    """The training text of a dataset: its train split; for a chat dataset also its base corpus (what the model
    was pretrained on), each with its own index. find(text) says what text took from it."""

    def __init__(self, folder):
        meta = read_meta(folder)
        self.tokenizer = tokenizer_from_meta(meta)
        self.parts = [Part(folder, self.tokenizer, conversations=bool((meta or {}).get("chat")))]
        if isinstance(self.tokenizer, ChatTokenizer):
            beside = os.path.join(os.path.dirname(os.path.abspath(folder)), meta.get("base", ""))  # as prepared
            base = find_folder(beside, holding=["train.bin"]) or find_folder(meta.get("base", ""), "data", ["train.bin"])
            if base is None:
                raise UserError(f"{folder} is a chat dataset made from {meta.get('base')!r}, which is not found; "
                                f"prepare it, or copies in the base corpus cannot be found")
            self.parts.insert(0, Part(base, self.tokenizer.base))

    def tokens_of(self, text):
        """(ids, offsets): text's tokens, NO_TOKEN for a character outside a char vocabulary, and the character
        offset where each token starts, with len(text) last."""
        base = getattr(self.tokenizer, "base", self.tokenizer)
        if isinstance(base, CharTokenizer):
            ids = np.array([base.stoi.get(c, NO_TOKEN) for c in text], np.int64)
            return ids, np.arange(len(text) + 1)
        ids = np.array(base.encode_ordinary(text), np.int64)
        ends = np.cumsum([len(base.token_bytes(int(i))) for i in ids], dtype=np.int64)
        leads = np.frombuffer(text.encode("utf-8"), np.uint8) & 0xC0 != 0x80  # bytes that start a character
        chars_before = np.concatenate([[0], np.cumsum(leads)])  # characters that start before each byte offset
        return ids, np.concatenate([[0], chars_before[ends]])

    def find(self, text, start=0):
        """The Copies of text[start:]: the spans of the whole text that reach past start (one may begin in a
        prompt before it), and the copied share of text[start:]."""
        ids, offsets = self.tokens_of(text)
        found = [part.index.longest_matches(ids) for part in self.parts]
        lengths = np.stack([length for length, _ in found])
        best = lengths.argmax(0)  # the part holding the longest match from each token (the first on a tie)
        length = lengths.max(0)
        ends = np.arange(len(ids)) + length
        spans, covered = [], np.zeros(len(text), bool)
        for i in np.flatnonzero((length > 0) & (ends > np.concatenate([[0], np.maximum.accumulate(ends)[:-1]]))):
            a, b = int(offsets[i]), int(offsets[ends[i]])  # a maximal run: no earlier one reaches its end
            if b <= start or b - a < min_chars(text[a:b]):
                continue
            part = self.parts[best[i]]
            count, first = part.index.occurrences(ids[i:ends[i]])
            spans.append(Span(a, b, text[a:b], count, part.name, part.where(first),
                              part.text(first - NEIGHBOURHOOD, first)[-NEIGHBOURHOOD:],
                              part.text(first + length[i], first + length[i] + NEIGHBOURHOOD)[:NEIGHBOURHOOD]))
            covered[a:b] = True
        examined = len(text) - start
        return Copies(spans, float(covered[start:].sum() / examined) if examined else 0.0,
                      max((s.end - s.start for s in spans), default=0))

    def running(self, text):
        """(len(text) + 1,) int64: at each character offset e, the characters of the longest run of text ending at e
        that the training text holds verbatim (whole tokens; at an offset inside a token, the run ending at the
        last token end before it). trace.py shows it per generation step: whether a token extends a copy."""
        ids, offsets = self.tokens_of(text)
        out = np.zeros(len(text) + 1, np.int64)
        if not len(ids):
            return out
        length = np.max([part.index.longest_matches(ids)[0] for part in self.parts], axis=0)
        reach = np.arange(len(ids)) + length  # where each start's match ends: never decreasing (a match's tail matches)
        ends = np.arange(1, len(ids) + 1)
        first = np.searchsorted(reach, ends)  # the earliest start whose match reaches each token end
        chars = np.where(first < ends, offsets[ends] - offsets[np.minimum(first, len(ids))], 0)
        out[offsets[ends]] = chars
        at = np.zeros(len(text) + 1, np.int64)
        at[offsets[ends]] = offsets[ends]
        return out[np.maximum.accumulate(at)]  # an offset inside a token: the last token end before it

    def mean_copied(self, texts):
        """The mean over texts of each one's copied share (evaluations' "copied" column: what answers recite
        rather than write), 0 for none."""
        return sum(self.find(t).copied for t in texts) / max(len(texts), 1)


def marked(text, copies, colour=False, start=0):
    """text[start:] with its copied spans underlined in colour (a terminal) or in [brackets]; spans overlap where
    two copies share characters, and a mark then runs to the end of the later one."""
    out, at = [], start
    opening, closing = ("\x1b[4;33m", "\x1b[0m") if colour else ("[", "]")
    for s in copies.spans:
        if s.end > at:
            out += [text[at:max(s.start, at)], opening, text[max(s.start, at):s.end], closing]
            at = s.end
    return "".join(out) + text[at:]


def report(copies):
    """Lines for a console: the copied share, the longest span, and where each span comes from."""
    lines = [f"copied: {copies.copied:.0%} of the characters in {how_many(len(copies.spans), 'span')}, the longest "
             f"{copies.longest} characters"]
    for s in copies.spans:
        lines.append(f"  {one_line(s.text)}  <- {s.part} {s.where} ({s.count}x): "
                     f"...{one_line(s.before)}[{one_line(s.text)}]{one_line(s.after)}...")
    return lines


def one_line(text):
    return text.replace("\n", "⏎")


def training_of(dataset, path):
    """The Training of the dataset a model was trained on (source.load_trained's), for --copies=True."""
    if dataset is None:
        raise UserError(f"{path} names no dataset it was trained on (a pretrained model): --copies needs its "
                        f"training text; python copies.py --dataset=DATASET --text=... compares a text with any dataset")
    return Training(dataset)
