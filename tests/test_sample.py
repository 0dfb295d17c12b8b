"""sample.py's text handling: stops are never printed, streamed text never splits a character."""
from generate import Continuation
from tokenizer import BPETokenizer, CharTokenizer

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
    tok = BPETokenizer()
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
