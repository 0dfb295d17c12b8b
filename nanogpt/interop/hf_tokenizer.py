"""Our tokenizers as Hugging Face's: a `tokenizers` Tokenizer (tokenizer.json) that encodes every text as
ours does, the role tokens as special tokens and the chat template in Jinja (tokenizer_config.json).

- Characters: a WordLevel vocabulary of the characters, the text split into single characters; a
  character outside the vocabulary is an error there too (ours refuses it).
- Byte-level BPE (GPT-2's, a trained one): tiktoken's ranks as a BPE of merges. tiktoken merges the
  adjacent pair whose concatenation ranks lowest; a BPE of merges ordered by the rank of what they make
  (each token's one split, bpe_merges) merges the same pairs in the same order. A piece that is one
  token is that token without merging (ignore_merges), as tiktoken does.
- Chat: typed text never becomes a role token in ours. Hugging Face matches a token's spelling in the
  text the template (ChatTokenizer.chat_template) writes, so the template escapes each role token's
  spelling in a message (tokenizer.escaped) and a normalizer, which runs after the template's own role
  tokens are matched, takes the ESCAPE out again: the message is encoded as the characters it holds. (A
  message holding the escaped spelling itself is encoded without its ESCAPE.) tokenizer(text) outside the
  template matches role tokens in text, as every Hugging Face chat tokenizer does;
  split_special_tokens=True encodes them as text, as ours does.
"""
from nanogpt.tokenizer import CHAT_TOKENS, CharTokenizer, ChatTokenizer, escaped


def byte_chars():
    """GPT-2's printable stand-in for each byte (tokenizers' ByteLevel uses the same table)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def bpe_merges(ranks):
    """[(left bytes, right bytes)] in rank order: the pair each multi-byte token is made of, found by
    merging its bytes as tiktoken does with the tokens ranked below it."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
            best, i = min(pairs)
            assert best < rank, f"token {token!r} (rank {rank}) cannot be made from lower-ranked tokens"
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        merges.append((parts[0], parts[1]))
    return merges


def base_tokenizer(base):
    """The tokenizers.Tokenizer of a CharTokenizer, GPT2BPE or TrainedBPE."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    if isinstance(base, CharTokenizer):
        tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(base.chars)}, unk_token="<unk>"))  # no <unk>: an error
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        tok.decoder = decoders.Fuse()
        return tok
    enc, chars = base.enc, byte_chars()
    ranks = enc._mergeable_ranks

    def spelled(token):
        return "".join(chars[b] for b in token)
    vocab = {spelled(token): rank for token, rank in ranks.items()}
    merges = [(spelled(a), spelled(b)) for a, b in bpe_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(enc._pat_str), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    for name, i in sorted(enc._special_tokens.items(), key=lambda kv: kv[1]):
        tok.add_special_tokens([AddedToken(name, special=True, normalized=False)])
        assert tok.token_to_id(name) == i, f"{name} is id {tok.token_to_id(name)} there, {i} here"
    return tok


def hf_tokenizer(tokenizer, model_max_length):
    """A transformers PreTrainedTokenizerFast that encodes as tokenizer (ours) does; save_pretrained writes it."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    chat = isinstance(tokenizer, ChatTokenizer)
    tok = base_tokenizer(tokenizer.base if chat else tokenizer)
    special = {}
    if chat:
        for name in CHAT_TOKENS:  # ids base.vocab_size, ...: the next free ones
            tok.add_special_tokens([AddedToken(name, special=True, normalized=False)])
            assert tok.token_to_id(name) == tokenizer.ids[name], f"{name}: {tok.token_to_id(name)} != {tokenizer.ids[name]}"
        tok.normalizer = normalizers.Sequence([normalizers.Replace(escaped(t), t) for t in CHAT_TOKENS])
        special = dict(eos_token="<|end|>", chat_template=tokenizer.chat_template())
    elif tokenizer.eot is not None:
        special = dict(eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False, **special)


def stop_ids(tokenizer):
    """The ids that end an answer (eos_token_id of the model's config): every role token for a chat model, as
    chat.py stops; end-of-text for a BPE; none for characters."""
    if isinstance(tokenizer, ChatTokenizer):
        return [i for [i] in tokenizer.answer_stops]
    return None if tokenizer.eot is None else tokenizer.eot
