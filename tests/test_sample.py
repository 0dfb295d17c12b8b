"""sample.py's text handling: stops are never printed, streamed text never splits a character."""
import random
import time

from nanogpt.generate import Continuation
from nanogpt.tokenizer import GPT2BPE, CharTokenizer

CHARS = CharTokenizer(list("abc \nXYZ"))


def feed(cont, ids):
    shown = [cont.add(i) for i in ids]
    return "".join(shown) + cont.finish(), shown


def test_stop_string_ends_the_sample_and_is_not_printed():
    cont = Continuation(CHARS, ["\n\n"], [])
    text, shown = feed(cont, CHARS.encode("ab c\nX\n\nabc"))
    assert text == "ab c\nX" and cont.done
    assert "\n\n" not in "".join(shown)


def test_text_that_may_start_a_stop_is_held_back_until_decided():
    cont = Continuation(CHARS, ["XYZ"], [])
    assert cont.add(CHARS.stoi["a"]) == "a"
    assert cont.add(CHARS.stoi["X"]) == ""  # could be the start of XYZ
    assert cont.add(CHARS.stoi["Y"]) == ""
    assert cont.add(CHARS.stoi["a"]) == "XYa"  # it was not
    assert cont.add(CHARS.stoi["X"]) == ""
    assert cont.finish() == "X"  # generation ended: what was held is shown


def test_stop_token_ids_end_the_sample():
    cont = Continuation(CHARS, [], [[CHARS.stoi["c"], CHARS.stoi["a"]]])
    text, _ = feed(cont, CHARS.encode("abcbca"))
    assert text == "abcb" and cont.done


def test_streamed_bpe_never_prints_half_a_character():
    tok = GPT2BPE()
    text = "naïve café: 日本語の文章 🙂 done"
    ids = tok.encode(text)
    assert any(tok.decoder().feed(i) == "" for i in ids)  # some token ends mid-character
    cont = Continuation(tok, [], [])
    streamed, shown = feed(cont, ids)
    assert streamed == text
    assert all("\ufffd" not in piece for piece in shown)


def test_stop_escapes_typed_in_a_shell_are_the_characters_they_name():
    from configurator import parse_args
    from sample import SampleConfig
    for typed, stop in [(r"--stop=\n\n", ["\n\n"]), (r"--stop='\n\n'", ["\n\n"]), (r"--stop=['\t', 7]", ["\t", 7]),
                        (r"--stop=\u4e00\\", ["\u4e00\\"]), ("--stop=END", ["END"]), ("--stop=詩\\n", ["詩\n"])]:
        assert parse_args(SampleConfig, [typed])[0].stop == stop, typed


def test_empty_stop_is_refused():
    import pytest

    from configurator import UserError, parse_args
    from sample import SampleConfig
    with pytest.raises(UserError, match="empty string"):
        parse_args(SampleConfig, ["--stop="])


def test_an_override_is_reported_as_the_config_holds_it():
    from configurator import parse_args, report_overrides
    from sample import SampleConfig
    cfg, overrides = parse_args(SampleConfig, [r"--stop=\n\n"])
    lines = []
    report_overrides(overrides, SampleConfig(), lines.append)
    assert lines == ["override: stop = ['\\n\\n'] (was [])"] and cfg.stop == ["\n\n"]


class Pieces:
    """A tokenizer whose tokens are the given strings (several characters each, some)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decoder(self):
        return self

    def feed(self, token):
        return self.pieces[token]

    def flush(self):
        return ""


def shown_by_hand(text, stops):
    """What may be shown of text: up to the earliest stop in it, else all but its longest end that begins a stop."""
    hits = [text.find(s) for s in stops if s in text]
    if hits:
        return text[:min(hits)]
    held = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[:len(text) - held]


def test_continuation_shows_what_a_search_of_the_whole_text_allows_at_every_token():
    """Overlapping stops ("abab", "aab"), stops completed inside a multi-character token, several in one:
    at each token the text shown so far is what searching the whole text by hand allows."""
    rng = random.Random(0)
    pieces = Pieces(["a", "b", "ab", "ba", "aab", "bbab", "c"])
    for _ in range(1000):
        stops = ["".join(rng.choice("aab") for _ in range(rng.randint(1, 8))) + rng.choice(["", "c"])
                 for _ in range(rng.randint(1, 4))]
        ids = [rng.randrange(len(pieces.pieces)) for _ in range(40)]
        cont, shown, text = Continuation(pieces, stops), "", ""
        for i in ids:
            shown += cont.add(i)
            text += pieces.pieces[i]
            assert shown == shown_by_hand(text, stops), (stops, ids)
            assert cont.done == any(s in text for s in stops)
            if cont.done:  # the earliest of the stops found in this token's text: later text changes nothing
                assert cont.add(ids[0]) == cont.finish() == ""
                break


def test_a_long_stop_costs_no_more_per_token_than_a_short_one():
    """Each token costs O(1) per stop whatever its length (the stops are matched as text arrives), so a client
    sending long stops cannot stall the engine thread for everyone else."""
    ids = CHARS.encode("ab " * 300)
    cont = Continuation(CHARS, ["a" * 300_000, "ab X" * 75_000, "b" * 299_999 + "X", "XYZ"], [])
    start = time.perf_counter()
    text = "".join(cont.add(i) for i in ids)
    assert time.perf_counter() - start < 1.0
    assert text == "ab " * 299  # the last "ab " could begin "ab X...": held back


def save_checkpoint_of(tmp_path, vocab_size, tokenizer_meta):
    """A tiny random model of vocab_size tokens whose checkpoint carries tokenizer_meta; its out_dir."""
    import torch

    from model import GPT, GPTConfig
    from nanogpt.checkpoint import model_args
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=32))
    out = tmp_path / f"out-{vocab_size}"
    out.mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "tokenizer": tokenizer_meta},
               out / "ckpt.pt")
    return out


def test_a_char_tokenizer_smaller_than_the_model_is_refused_at_load(tmp_path):
    """The model emits any id below its vocab_size; 8 characters cannot decode ids 8 to 63."""
    from conftest import run_script
    out = save_checkpoint_of(tmp_path, 64, {"tokenizer": "char", "chars": list("abc \nXYZ")})
    result = run_script(["sample.py", f"--out_dir={out}", "--start=abc", "--num_samples=2", "--max_new_tokens=50"],
                        timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert errors == [f"error: {out / 'ckpt.pt'} has a vocabulary of 64 tokens but its tokenizer has 8; sample with "
                      f"the tokenizer (dataset) it was trained on"]


def test_serve_refuses_the_same_checkpoint_at_load(tmp_path):
    import pytest
    pytest.importorskip("starlette")
    from configurator import UserError
    from serve import ServeConfig, Service
    out = save_checkpoint_of(tmp_path, 64, {"tokenizer": "char", "chars": list("abc \nXYZ")})
    with pytest.raises(UserError, match="vocabulary of 64 tokens but its tokenizer has 8"):
        Service.load(ServeConfig(out_dir=str(out), device="cpu"))


def test_gpt2_bpe_loads_with_the_model_padded_to_50304(tmp_path):
    """nanoGPT pads GPT-2's 50,257 tokens to 50,304: the padding ids decode to nothing."""
    import torch

    from nanogpt.source import load_model
    from sample import SampleConfig
    out = save_checkpoint_of(tmp_path, 50304, {"tokenizer": "gpt2"})
    model, tokenizer = load_model(SampleConfig(out_dir=str(out)), torch.device("cpu"))
    assert (model.config.vocab_size, tokenizer.vocab_size) == (50304, 50257)
    decoder = tokenizer.decoder()
    assert decoder.feed(50303) == "" and decoder.feed(tokenizer.encode("hi")[0]) == "hi"


def test_continue_rows_ends_each_row_and_keeps_the_tokens_a_stop_held_back():
    """Rows stop on their own; when the steps run out, a row's last tokens that began a stop (held back,
    undecoded, while the stop could still come) are its text after all."""
    import torch

    from nanogpt.generate import continue_rows
    steps = [torch.tensor(CHARS.encode(pair)) for pair in ("aa", "bb", "bc", "c ")]
    held = [CHARS.encode(" X")]  # token ids: " " is held until the next token says whether "X" follows
    rows = continue_rows([Continuation(CHARS, ["bb"]), Continuation(CHARS, [], held)], iter(steps))
    assert [row.done for row in rows] == [True, False]
    assert rows[0].text == "a" and rows[1].text == "abc "
