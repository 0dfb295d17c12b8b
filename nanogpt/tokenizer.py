"""Tokenizers (characters, GPT-2 BPE, a BPE trained on your text) and the dataset metadata that names them.

A dataset directory holds meta.json ({"tokenizer": "char", "chars": [...]},
{"tokenizer": "gpt2"} or {"tokenizer": "bpe", "pattern": ..., "ranks": FILE,
"special_tokens": {...}}, plus "vocab_size" and "dtype"). A trained BPE's
merges are in FILE beside it (tiktoken's format: base64 bytes and rank per
line); read_meta inlines them, so the metadata dict alone rebuilds any
tokenizer and travels inside checkpoints. nanoGPT's meta.pkl is read too, with
an unpickler that builds only plain data and runs no code.
"""
import base64
import codecs
import contextlib
import json
import os
import pickle
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cache, cached_property

from nanogpt.errors import UserError
from nanogpt.files import open_to_write, read_regular
from nanogpt.pickles import load_pickle
from nanogpt.values import how_many

BPE_ENCODING = "r50k_base"  # the same 50,257-token vocabulary as tiktoken's "gpt2"
# the split patterns a trained BPE may have: what data/prepare.py writes (rustbpe's, GPT-4's with possessive
# quantifiers) and GPT-2's. Any other is refused: a pattern can take exponential time on crafted text
# ((?:a|aa)+(?=b) on "aaaa..."), and tiktoken's engine stops a match only after a million backtracking steps.
KNOWN_PATTERNS = {
    "GPT-4's (rustbpe's)": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
                           r"""\s*[\r\n]|\s+(?!\S)|\s+""",
    "GPT-2's": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
}

SPECIAL_NAME = re.compile(r"<\|[^\s|<>]+\|>")  # how a special token is written: no text holds one by accident


class CharTokenizer:
    kind = "char"

    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        self.eot = None

    def encode(self, text):
        missing = sorted(set(text) - self.stoi.keys())
        if missing:
            shown = " ".join(repr(c) for c in missing[:20])
            raise UserError(f"the text has {how_many(len(missing), 'character')} outside the vocabulary: {shown}; "
                            f"use only characters of the training data")
        return [self.stoi[c] for c in text]

    def fit(self, text, start=True):
        """text written in this vocabulary's characters, as a Fitted. A character the vocabulary has stays as it
        is (the Tang poems write both 征 and 徵). One it lacks is first written as the vocabulary's script writes
        it, where the vocabulary has that form (OpenCC, in the text's context: the simplified 头 as the Tang
        poems' 頭), else as the first of its variants whose characters are inside (its Unicode compatibility form:
        a full-width ！ as !; its letters without their accents: é as e), else it is left out. With start, a text
        of which nothing is left becomes a line break where the vocabulary has one (sample.py's start)."""
        if set(text) <= self.stoi.keys():
            return Fitted(text)
        script = self.script
        written = chinese_variants(text, script) if script is not None else text
        out, fitted = [], Fitted(text)
        for c, w in zip(text, written):
            forms = [c] + ([w] if w != c else []) + [unicodedata.normalize("NFKC", c), unaccented(c)]
            form = next((f for f in forms if f and all(ch in self.stoi for ch in f)), None)
            if form is None:
                fitted.dropped.append(c)
                continue
            out.append(form)
            if form != c:
                fitted.converted.append((c, form))
        fitted.text = "".join(out) or ("\n" if start and text and "\n" in self.stoi else "")
        return fitted

    @cached_property
    def script(self):
        """"s2t" where the vocabulary writes Chinese in traditional characters (more of its characters have a
        simplified form than a traditional one), "t2s" where in simplified ones, None otherwise or without opencc:
        OpenCC's conversion into the vocabulary's script."""
        chars = "".join(self.chars)
        s2t, t2s = opencc_converter("s2t"), opencc_converter("t2s")
        traditional = sum(a != b for a, b in zip(chars, t2s.convert(chars))) if t2s else 0
        simplified = sum(a != b for a, b in zip(chars, s2t.convert(chars))) if s2t else 0
        return "s2t" if traditional > simplified else "t2s" if simplified > traditional else None

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def decoder(self):
        return StreamDecoder(lambda i: self.chars[i].encode("utf-8"))


@dataclass
class Fitted:
    """A text as a tokenizer writes it (tokenizer.fit): the characters converted to forms its vocabulary has,
    as (character, form), and those left out, in the text's order. A byte-level BPE writes every text."""
    text: str
    converted: list = field(default_factory=list)
    dropped: list = field(default_factory=list)

    def note(self, what="the text"):
        """One line for the console, or "" where nothing changed: which characters were converted or left out."""
        parts = []
        if self.converted:
            shown = ", ".join(f"{c} as {f}" for c, f in dict(self.converted).items())
            parts.append(f"{how_many(len(self.converted), 'character')} written in the vocabulary's form "
                         f"({shown[:200]})")
        if self.dropped:
            shown = " ".join(repr(c) for c in dict.fromkeys(self.dropped))
            parts.append(f"{how_many(len(self.dropped), 'character')} outside the vocabulary left out ({shown[:200]})")
        return f"note: {what}: " + "; ".join(parts) if parts else ""


@cache
def opencc_converter(name):
    """OpenCC's converter (s2t: simplified to traditional, t2s: back), or None where opencc is not installed."""
    try:
        import opencc
    except ImportError:
        return None
    return opencc.OpenCC(name)


def chinese_variants(text, name):
    """text converted by OpenCC's `name`, aligned character for character with text (a phrase whose
    conversion changes its length is converted character by character)."""
    converter = opencc_converter(name)
    converted = converter.convert(text)
    return converted if len(converted) == len(text) else [converter.convert(c) for c in text]


def unaccented(c):
    """c's letters without their combining marks (é as e, ñ as n), as Unicode's compatibility decomposition."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", c) if not unicodedata.combining(ch))


class TiktokenTokenizer:
    """Byte-level BPE through tiktoken: any UTF-8 text round-trips, seen in training or not."""

    def __init__(self, enc):
        self.enc, self.vocab_size = enc, enc.n_vocab
        self.eot = enc._special_tokens.get("<|endoftext|>")

    def encode(self, text):
        with regex_errors():
            return self.enc.encode(text, allowed_special={"<|endoftext|>"} if self.eot is not None else set())

    def encode_ordinary(self, text):
        with regex_errors():
            return self.enc.encode_ordinary(text)

    def fit(self, text, start=True):
        return Fitted(text)  # bytes: every text is inside the vocabulary

    def decode(self, ids):
        return self.enc.decode(ids)

    def decoder(self):
        return StreamDecoder(self.token_bytes)

    def token_bytes(self, token):
        try:
            return self.enc.decode_single_token_bytes(token)
        except KeyError:  # an id of the model's padded vocabulary that no text has
            return b""


class GPT2BPE(TiktokenTokenizer):
    """GPT-2's BPE (50,257 tokens)."""
    kind = "gpt2"

    def __init__(self):
        try:
            import tiktoken
            enc = tiktoken.get_encoding(BPE_ENCODING)
        except Exception as e:  # tiktoken downloads the ranks on first use
            reason = str(e).splitlines()[0][:160] if str(e) else ""  # a connection error's repr runs to many lines
            raise UserError(f"cannot load the GPT-2 BPE ({type(e).__name__}: {reason}); offline, set "
                            f"TIKTOKEN_CACHE_DIR to a directory holding tiktoken's {BPE_ENCODING} file") from None
        super().__init__(enc)


class TrainedBPE(TiktokenTokenizer):
    """A byte-level BPE trained on a dataset's own text (data/prepare.py --tokenizer bpe)."""
    kind = "bpe"

    def __init__(self, pattern, ranks, special_tokens, name="bpe"):
        import tiktoken
        if pattern not in KNOWN_PATTERNS.values():
            shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
            raise UserError(f"refusing the trained BPE's split pattern {shown!r}: only {' and '.join(KNOWN_PATTERNS)} "
                            f"are taken, as another can take exponential time on some text; re-run the dataset's "
                            f"prepare.py")
        try:
            enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_tokens)
        except ValueError as e:
            raise UserError(f"the trained BPE's pattern or ranks are damaged ({e}); re-run the dataset's "
                            f"prepare.py") from None
        super().__init__(enc)

    def meta(self, ranks_file):
        """meta.json's fields for this tokenizer, its merges written to ranks_file (a name in the dataset)."""
        return {"tokenizer": "bpe", "pattern": self.enc._pat_str, "ranks": ranks_file,
                "special_tokens": dict(self.enc._special_tokens)}


@contextlib.contextmanager
def regex_errors():
    """tiktoken's regex failing on a text (its backtracking limit) as a UserError."""
    try:
        yield
    except ValueError as e:
        if "Regex error" not in str(e):
            raise
        raise UserError(f"the tokenizer's split pattern failed on this text ({str(e).splitlines()[0]}); "
                        f"use another text") from None


def ranks_text(ranks):
    """tiktoken's file format: each token's bytes in base64, a space, its rank; one per line."""
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in sorted(ranks.items(),
                                                                                          key=lambda kv: kv[1]))


def parse_ranks(text, path):
    """{token bytes: rank} of a ranks file: its n lines rank n distinct tokens 0, ..., n - 1, the 256
    single bytes among them (byte-level BPE encodes any text through them)."""
    lines = text.splitlines()
    ranks, seen = {}, set()
    for number, line in enumerate(lines, start=1):
        try:
            token, rank = line.split()
            token, rank = base64.b64decode(token, validate=True), int(rank)
        except ValueError:
            raise UserError(f"{path}:{number}: not a 'base64 rank' line; re-run the dataset's prepare.py") from None
        if not 0 <= rank < len(lines) or rank in seen or token in ranks:
            what = "a rank repeated" if rank in seen else "a token repeated" if token in ranks else \
                f"rank {rank}, outside 0 to {len(lines) - 1} (the file has {len(lines)} lines)"
            raise UserError(f"{path}:{number}: {what}; re-run the dataset's prepare.py")
        ranks[token] = rank
        seen.add(rank)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise UserError(f"{path}: {len(missing)} of the 256 single bytes have no rank (byte {missing[0]} first), "
                        f"so some text cannot be encoded; re-run the dataset's prepare.py")
    return ranks


def check_special_tokens(special_tokens, n, path):
    """special_tokens if their ids follow the n ranks: n, n + 1, ..., each once."""
    ids = sorted(special_tokens.values())
    if ids != list(range(n, n + len(ids))):
        raise UserError(f"{path}: special token ids {ids[:5]} should be {list(range(n, n + min(len(ids), 5)))}, "
                        f"following the {n} ranks; re-run the dataset's prepare.py")
    return special_tokens


def token_byte_strings(tokenizer, vocab_size):
    """The UTF-8 bytes of each token id below vocab_size (b"" for special tokens and padding)."""
    if isinstance(tokenizer, ChatTokenizer):  # role tokens are no text
        base = tokenizer.base.vocab_size
        return token_byte_strings(tokenizer.base, base) + [b""] * (vocab_size - base)
    if isinstance(tokenizer, CharTokenizer):
        strings = [c.encode("utf-8") for c in tokenizer.chars]
    else:
        strings = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        for i in tokenizer.enc._special_tokens.values():
            strings[i] = b""
    return (strings + [b""] * vocab_size)[:vocab_size]


def token_byte_lengths(tokenizer, vocab_size):
    """UTF-8 bytes of each token id below vocab_size (0 for special tokens and padding): the
    denominator of bits per byte."""
    return [len(b) for b in token_byte_strings(tokenizer, vocab_size)]


class StreamDecoder:
    """Text of tokens fed one at a time; a UTF-8 character split across BPE tokens waits for its end."""

    def __init__(self, token_bytes):
        self.token_bytes = token_bytes
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token):
        return self.utf8.decode(self.token_bytes(token))

    def flush(self):
        return self.utf8.decode(b"", final=True)


def tokenizer_kind(meta):
    """"char", "gpt2" or "bpe": meta.json names it; nanoGPT's meta.pkl is char-level (itos); no metadata is GPT-2."""
    if meta is None:
        return "gpt2"
    return meta.get("tokenizer") or ("char" if "chars" in meta or "itos" in meta else "gpt2")


def tokenizer_from_meta(meta):
    """The tokenizer a dataset's metadata describes (as read_meta returns it); GPT-2 BPE when there is none.
    A chat dataset's (role tokens in "chat") is its base tokenizer with them appended."""
    if meta and meta.get("chat"):
        return ChatTokenizer(tokenizer_from_meta(base_meta(meta)), tuple(meta["chat"]))
    kind = tokenizer_kind(meta)
    if kind == "gpt2":
        return GPT2BPE()
    if kind == "bpe":
        if not isinstance(meta.get("ranks_text"), str):
            raise UserError(f"the trained BPE's ranks ({meta['ranks']}) are missing; re-run the dataset's prepare.py")
        ranks = parse_ranks(meta["ranks_text"], meta["ranks"])
        return TrainedBPE(meta["pattern"], ranks, check_special_tokens(meta["special_tokens"], len(ranks),
                                                                       "the trained BPE's special_tokens"))
    if kind != "char":
        raise UserError(f"unknown tokenizer {kind!r} in the dataset's metadata; expected 'char', 'gpt2' or 'bpe'")
    chars = meta.get("chars") or [meta["itos"][i] for i in range(len(meta["itos"]))]
    return CharTokenizer(chars)


def read_meta(dataset_dir):
    """The dataset's metadata dict (meta.json, else a legacy meta.pkl), or None."""
    path = os.path.join(dataset_dir, "meta.json")
    if os.path.exists(path):
        try:
            data = read_regular(path)
        except OSError as e:
            raise UserError(f"{path} cannot be read ({e}); re-run the dataset's prepare.py") from None
        try:
            meta = check_meta(json.loads(data.decode("utf-8")), path)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
            reason = "nested too deep" if isinstance(e, RecursionError) else e
            raise UserError(f"{path} is not valid JSON ({reason}); re-run the dataset's prepare.py") from None
        if meta.get("tokenizer") == "bpe":  # the merges travel with the metadata
            ranks = os.path.join(dataset_dir, meta["ranks"])
            if os.path.commonpath([os.path.realpath(ranks), os.path.realpath(dataset_dir)]) != \
                    os.path.realpath(dataset_dir):
                raise UserError(f"{ranks}, the dataset's tokenizer, links to {os.path.realpath(ranks)}, outside the "
                                f"dataset; copy the file into {dataset_dir}")
            try:
                meta["ranks_text"] = read_regular(ranks).decode("ascii")
            except (OSError, ValueError) as e:
                raise UserError(f"{ranks}, the dataset's tokenizer, cannot be read ({e}); re-run the dataset's "
                                f"prepare.py") from None
            check_special_tokens(meta["special_tokens"], len(parse_ranks(meta["ranks_text"], ranks)), path)
        return meta
    path = os.path.join(dataset_dir, "meta.pkl")
    if os.path.exists(path):
        try:
            data = read_regular(path)
        except OSError as e:
            raise UserError(f"{path} cannot be read ({e}); re-run the dataset's prepare.py") from None
        return check_meta(load_plain_pickle(data, path), path)
    return None


def check_meta(meta, path):
    """meta itself if its fields have the types and values a dataset's metadata needs; else a UserError."""
    def bad(what):
        return UserError(f"{path}: {what}; re-run the dataset's prepare.py")
    if not isinstance(meta, dict):
        raise bad(f"holds a {type(meta).__name__}, expected an object")
    for key, value in meta.items():  # JSON's "\ud800" reads as a lone surrogate, which no text can write
        try:
            json.dumps([key, value], ensure_ascii=False, default=repr).encode("utf-8")
        except UnicodeEncodeError as e:
            raise bad(f"{key} holds {e.object[e.start:e.end]!r}, a lone surrogate: no character of text") from None
    kind = meta.get("tokenizer")
    if kind is not None and kind not in ("char", "gpt2", "bpe"):
        raise bad(f"unknown tokenizer {kind!r}; expected 'char', 'gpt2' or 'bpe'")
    if kind == "bpe" and not (isinstance(meta.get("pattern"), str) and isinstance(meta.get("ranks"), str)
                              and os.path.basename(meta["ranks"]) == meta["ranks"]
                              and isinstance(meta.get("special_tokens"), dict)
                              and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                      for k, v in meta["special_tokens"].items())):
        raise bad("a bpe tokenizer needs its pattern, its ranks file (a name in the dataset) and special_tokens")
    names = [name for name in meta.get("special_tokens") or {} if not SPECIAL_NAME.fullmatch(name)]
    if kind == "bpe" and names:  # "", " " or "the" would take text for a special token, or never match
        raise bad(f"special token {names[0]!r} is not written <|name|> (as <|endoftext|>) with no space in the name")
    vocab = meta.get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        raise bad(f"vocab_size is {vocab!r}, expected a whole number >= 1")
    chat = meta.get("chat") or []
    if chat and (not isinstance(chat, list) or tuple(chat) != CHAT_TOKENS[:len(chat)] or len(chat) != len(CHAT_TOKENS)
                 or not isinstance(vocab, int) or vocab <= len(chat)):
        raise bad(f"chat is {chat!r}, expected {list(CHAT_TOKENS)} with a vocab_size beyond them")
    if meta.get("dtype", "uint16") not in ("uint16", "uint32"):
        raise bad(f"dtype is {meta.get('dtype')!r}, expected 'uint16' or 'uint32'")
    if "chars" in meta:
        chars = meta["chars"]
        if (not isinstance(chars, list) or not all(isinstance(c, str) and len(c) == 1 for c in chars)
                or len(set(chars)) != len(chars) or not chars):
            raise bad("chars is not a list of distinct single characters")
        if vocab is not None and vocab != len(chars) + len(chat):
            raise bad(f"vocab_size ({vocab}) differs from the {len(chars)} chars" + (f" and {len(chat)} role tokens" if chat else ""))
    elif "itos" in meta:
        itos = meta["itos"]
        if (not isinstance(itos, dict) or set(itos) != set(range(len(itos))) or not itos
                or not all(isinstance(c, str) for c in itos.values())):
            raise bad("itos is not a map from 0, 1, 2, ... to characters")
    elif kind == "char":
        raise bad("a char tokenizer needs its chars")
    return meta


def write_meta(dataset_dir, meta, suffix=""):
    """meta.json always; meta.pkl too for char vocabularies, in nanoGPT's layout. Each file's name has
    suffix appended (a file written aside); returns the names without it."""
    with open_to_write(os.path.join(dataset_dir, "meta.json" + suffix)) as f:
        json.dump(meta, f, ensure_ascii=False)
    if meta["tokenizer"] != "char" or "chat" in meta:  # nanoGPT's layout has no role tokens
        return ["meta.json"]
    chars = meta["chars"]
    legacy = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    with open_to_write(os.path.join(dataset_dir, "meta.pkl" + suffix), "wb") as f:
        pickle.dump(legacy, f)
    return ["meta.json", "meta.pkl"]


def load_plain_pickle(data, path):
    """A legacy meta.pkl's dict: dicts, lists, tuples, strings and numbers only (any class or function is
    refused), its sizes checked against its bytes before anything is built (pickles.load_pickle)."""
    remedy = "delete it and re-run the dataset's prepare.py"
    try:
        obj = load_pickle(data, path, remedy)
    except UserError:
        raise
    except Exception as e:
        reason = " ".join(str(e).split())  # pickle's own messages can span lines
        raise UserError(f"{path} is not plain data ({reason}); delete it and re-run the dataset's prepare.py") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} holds a {type(obj).__name__}, expected a dict; re-run the dataset's prepare.py")
    return obj


# --- chat: a base tokenizer with role tokens -----------------------------------------------------------

# The chat template's rules: render(), chat_template()'s Jinja and the role names read in text
# (encode_with_role_names) are all written from these, and tests/test_chat_template.py holds them to each other.
ROLES = ("system", "user", "assistant")  # the roles with a token
# the role tokens a chat dataset appends after its base vocabulary, in this order; END closes every turn
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# OpenAI's roles beyond ours, as ours (what real clients send): developer is OpenAI's newer name for system; a
# tool's (or a function's) result is new text the model reads, as a user's
AS_ROLE = {"developer": "system", "tool": "user", "function": "user"}
# An assistant's message with content null (an agent's tool call, replayed) said nothing the model could read: it
# is left out. Content is a string or OpenAI's list of text parts (joined); anything else is refused, as is a
# role outside ROLES and AS_ROLE. A reply opens with <|assistant|>.
#
# A role token's spelling inside a message is text, never the token. Whoever reads the template's text as
# tokens (a Hugging Face tokenizer, serve.py's prompts) reads a role token's name as the token, so the template
# writes a message's spelling of one escaped (ESCAPE after its "<") and the reader takes the ESCAPE out again.
ESCAPE = "\ue000"  # a private-use character: no text of ours holds it next to a role token's spelling


def escaped(name):
    """A role token's name as the chat template writes it inside a message."""
    return name[0] + ESCAPE + name[1:]


def chat_messages(messages):
    """[{"role", "content"}] of messages under the template's rules: roles in ROLES (AS_ROLE's mapped), content
    a string, an assistant's null content left out. A message the rules refuse is a UserError naming it."""
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str) or role not in ROLES + tuple(AS_ROLE):
            raise UserError(f"messages[{i}].role is {json.dumps(role, default=repr)[:40]}; this model knows "
                            f"{', '.join(ROLES + tuple(AS_ROLE))}")
        content = m.get("content")
        if content is None and role == "assistant":
            continue
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            if not all(isinstance(p.get("text"), str) for p in content):
                raise UserError(f"messages[{i}].content has a text part whose text is not a string")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise UserError(f"messages[{i}].content must be text (a string, or a list of text parts)")
        out.append({"role": AS_ROLE.get(role, role), "content": content})
    return out


class ChatTokenizer:
    """A base tokenizer (characters, a trained BPE or GPT-2's) with CHAT_TOKENS appended as ids
    base.vocab_size, base.vocab_size + 1, ...

    Text never encodes to a role token, even text that spells one: only render() places them, so a
    user's message cannot forge a turn.
    """

    def __init__(self, base, tokens=CHAT_TOKENS):
        self.base, self.kind = base, base.kind
        self.ids = {name: base.vocab_size + i for i, name in enumerate(tokens)}
        self.names = {i: name for name, i in self.ids.items()}
        self.vocab_size = base.vocab_size + len(tokens)
        self.end = self.ids["<|end|>"]
        self.eot = self.end
        # what ends an answer: <|end|>, or any role token (a model that starts the next turn has finished)
        self.answer_stops = [[self.end]] + [[i] for name, i in self.ids.items() if i != self.end]

    def encode(self, text):
        return self.base.encode(text)

    def fit(self, text, role_names=False):
        """The base tokenizer's fit; role_names: the role tokens' names in text, and their escaped spellings, are
        kept as they are (for a prompt that encode_with_role_names reads, serve.py's completions), the text
        around them fitted."""
        if not role_names:
            return self.base.fit(text)
        kept = [*self.ids, *map(escaped, self.ids)]
        parts = [p for p in re.split("(" + "|".join(map(re.escape, kept)) + ")", text) if p]
        fits = [Fitted(p) if p in kept else self.base.fit(p, start=False) for p in parts]
        return Fitted("".join(f.text for f in fits), [c for f in fits for c in f.converted],
                      [c for f in fits for c in f.dropped])

    def decode(self, ids):
        """Text of ids, role tokens written as their names."""
        out, run = [], []
        for i in ids:
            if i in self.names:
                out += [self.base.decode(run), self.names[i]]
                run = []
            else:
                run.append(i)
        return "".join(out) + self.base.decode(run)

    def token_bytes(self, token):
        if token in self.names:
            return self.names[token].encode()
        return self.base.token_bytes(token) if hasattr(self.base, "token_bytes") else self.base.decode([token]).encode()

    def decoder(self):
        return StreamDecoder(self.token_bytes)

    def encode_with_role_names(self, text):
        """text's ids with the role tokens' names in it read as the role tokens, as a Hugging Face tokenizer
        reads its special tokens: the text chat_template() writes encodes as render() places it (serve.py's
        prompts and /tokenize). A name escaped (as the template writes a message's) is the name's characters."""
        ids = []
        for part in re.split("(" + "|".join(map(re.escape, self.ids)) + ")", text):
            if part in self.ids:
                ids.append(self.ids[part])
            elif part:
                for name in self.ids:
                    part = part.replace(escaped(name), name)
                ids += self.encode(part)
        return ids

    def render(self, messages, reply=True):
        """(ids, mask) of a conversation under the template's rules (chat_messages): each message as
        <|role|> text <|end|>; mask 1 marks the tokens the loss sees (the assistant's words and its <|end|>).
        reply: end with <|assistant|>, the prompt a model answers."""
        ids, mask = [], []
        for message in chat_messages(messages):
            role, content = message["role"], message["content"]
            text = self.encode(content)
            learn = int(role == "assistant")
            ids += [self.ids[f"<|{role}|>"], *text, self.end]
            mask += [0, *[learn] * len(text), learn]
        if reply:
            ids.append(self.ids["<|assistant|>"])
            mask.append(0)
        return ids, mask

    def chat_template(self):
        """render() in Jinja, for whoever renders messages themselves (a Hugging Face export's
        tokenizer_config.json, GGUF's tokenizer.chat_template, serve.py's /tokenizer_info): the same rules, a
        role token's spelling in a message escaped (encode_with_role_names and Hugging Face's normalizer read
        it back as text). Unknown roles and content that is not text are refused with raise_exception."""
        def refuse(why):
            return "{{ raise_exception('messages[' ~ i ~ ']" + why + "') }}"

        def text(value):
            return "{{ " + value + "".join(f" | replace('{t}', '{escaped(t)}')" for t in self.ids) + " }}"
        turns = "".join(f"{{%- {'if' if n == 0 else 'elif'} message['role'] in "
                        f"{[r] + [k for k, v in AS_ROLE.items() if v == r]} -%}}<|{r}|>\n    "
                        for n, r in enumerate(ROLES))
        return ("{%- for message in messages -%}\n"
                "  {%- set i = loop.index0 -%}\n"
                "  {%- set content = message['content'] if message['content'] is defined else none -%}\n"
                "  {%- if content is none and message['role'] == 'assistant' -%}\n"  # said nothing
                "  {%- else -%}\n    " + turns +
                "{%- else -%}" + refuse(".role is ' ~ message['role'] ~ '; this model knows "
                                         + ", ".join(ROLES + tuple(AS_ROLE))) + "\n"
                "    {%- endif -%}\n"
                "    {%- if content is string -%}" + text("content") + "\n"
                "    {%- elif content is iterable and content is not mapping -%}\n"
                "      {%- for part in content -%}\n"
                "        {%- if part is not mapping or part['type'] != 'text' -%}"
                + refuse(".content must be text (a string, or a list of text parts)") + "\n"
                "        {%- elif part['text'] is not string -%}"
                + refuse(".content has a text part whose text is not a string") + "\n"
                "        {%- endif -%}\n"
                "      {%- endfor -%}" + text("content | map(attribute='text') | join") + "\n"  # joined, then escaped
                "    {%- else -%}" + refuse(".content must be text (a string, or a list of text parts)") + "\n"
                "    {%- endif -%}<|end|>\n"
                "  {%- endif -%}\n"
                "{%- endfor -%}\n"
                "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}\n")


def chat_meta(meta_of_base):
    """A chat dataset's metadata: its base dataset's, with the role tokens after the base vocabulary."""
    base = tokenizer_from_meta(meta_of_base)
    meta = {k: v for k, v in meta_of_base.items() if k != "ranks_text"}
    return {**meta, "chat": list(CHAT_TOKENS), "vocab_size": base.vocab_size + len(CHAT_TOKENS)}


def base_meta(meta):
    """The metadata of a chat dataset's base tokenizer (meta itself where it has no role tokens)."""
    if not meta or "chat" not in meta:
        return meta
    base = {k: v for k, v in meta.items() if k != "chat"}
    base["vocab_size"] = meta["vocab_size"] - len(meta["chat"])
    return base
