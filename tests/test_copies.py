"""Copies: the spans of a text found verbatim in training, against a brute-force search of the training text; the
threshold per script; the copied share worked by hand; and the index file refused, rebuilt or left as it is."""
import json
import os
import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SHARED, run_script
from nanogpt.copies import HEADER, INDEX_FILE, Training, marked, min_chars, write_index
from nanogpt.errors import UserError
from nanogpt.tokenizer import write_meta

TANG = os.path.join(SHARED, "data", "tangshi", "input.txt")


def char_dataset(folder, train, chars=None):
    """A char dataset whose train split is exactly train (chars: its vocabulary, train's own by default), indexed."""
    os.makedirs(folder, exist_ok=True)
    chars = sorted(set(chars or train))
    write_meta(str(folder), {"tokenizer": "char", "chars": chars, "vocab_size": len(chars), "dtype": "uint16"})
    np.array([chars.index(c) for c in train], np.uint16).tofile(os.path.join(folder, "train.bin"))
    write_index(str(folder), np.dtype(np.uint16))
    return str(folder)


def brute_force_spans(text, train):
    """Every (start, end) of text found in train that can grow neither left nor right, and is long enough: each
    substring looked up with str's own search, nothing shared with the index."""
    spans = []
    for a in range(len(text)):
        b = a
        while b < len(text) and text[a:b + 1] in train:
            b += 1
        if b > a and not (a > 0 and text[a - 1:b] in train) and b - a >= min_chars(text[a:b]):
            spans.append((a, b))
    return spans


def spans_of(copies):
    return [(s.start, s.end) for s in copies.spans]


@settings(max_examples=60, deadline=None)
@given(train=st.text("春江花月夜", min_size=1, max_size=300), text=st.text("春江花月夜X", max_size=60))
def test_spans_equal_a_brute_force_search_on_random_texts(tmp_path_factory, train, text):
    """Five characters (and X, outside the vocabulary): runs of 7 and more are common, so are ties and overlaps."""
    folder = char_dataset(tmp_path_factory.mktemp("d"), train, chars="春江花月夜")
    assert spans_of(Training(folder).find(text)) == brute_force_spans(text, train)


@settings(max_examples=30, deadline=None)
@given(train=st.text("ab", min_size=80, max_size=300), cut=st.tuples(st.integers(0, 40), st.integers(0, 150)),
       around=st.tuples(st.text("ab", max_size=10), st.text("ab", max_size=10)))
def test_longest_matches_are_the_longest_runs_found_by_brute_force(tmp_path_factory, train, cut, around):
    """The matching statistics under every span, any length: a piece of train (up to 150 letters) between random
    ones makes matches past the first window (32 tokens) common, where a second, wider search must take over."""
    text = around[0] + train[cut[0]:cut[0] + cut[1]] + around[1]
    folder = char_dataset(tmp_path_factory.mktemp("d"), train, chars="ab")
    training = Training(folder)
    ids, _ = training.tokens_of(text)
    length, where = training.parts[0].index.longest_matches(ids)
    for i in range(len(text)):
        n = int(length[i])
        assert text[i:i + n] in train and (i + n == len(text) or text[i:i + n + 1] not in train), (i, n)
        assert train[where[i]:where[i] + n] == text[i:i + n]


@settings(max_examples=40, deadline=None)
@given(train=st.text("ab", min_size=1, max_size=200), text=st.text("abX", max_size=60))
def test_running_runs_are_the_longest_suffixes_found_by_brute_force(tmp_path_factory, train, text):
    """At each offset, the longest run of the text ending there that train holds (X, outside the vocabulary,
    ends every run): what trace.py shows per step."""
    training = Training(char_dataset(tmp_path_factory.mktemp("d"), train, chars="ab"))
    expected = [max(n for n in range(end + 1) if text[end - n:end] in train) for end in range(len(text) + 1)]
    assert training.running(text).tolist() == expected


def test_spans_equal_a_brute_force_search_on_real_poems(tmp_path):
    """Held-out poems and lines from training, cut and spliced, against the Tang poems' train split."""
    with open(TANG, encoding="utf-8") as f:
        corpus = f.read()
    train, held_out = corpus[:200_000], corpus[200_000:400_000]
    folder = char_dataset(tmp_path / "tang", train, chars=corpus)
    training = Training(folder)
    rng = random.Random(0)
    for _ in range(8):
        a, b = rng.randrange(len(train) - 40), rng.randrange(len(held_out) - 40)
        text = held_out[b:b + 30] + train[a:a + rng.randrange(3, 40)] + held_out[b + 30:b + 40]
        assert spans_of(training.find(text)) == brute_force_spans(text, train), text


def test_a_span_counts_from_seven_chinese_characters_or_twenty_five_others(tmp_path):
    """A shared word is no copy: 6 characters of a 七言 line are not one, the whole line is; in English 24
    characters are not, 25 are."""
    line, english = "春江潮水連海平", "the quick brown fox jumps over the lazy dog"
    training = Training(char_dataset(tmp_path / "d", f"{line}\n{english}\n", chars=f"{line}{english}\n。甲"))
    assert spans_of(training.find("甲" + line[:6] + "甲")) == []
    assert spans_of(training.find("甲" + line + "甲")) == [(1, 8)]
    assert spans_of(training.find("。" + english[:24] + "。")) == []
    assert spans_of(training.find("。" + english[:25] + "。")) == [(1, 26)]


def test_copied_share_and_where_worked_by_hand(tmp_path):
    """Train 一二三四五六七八九十 on line 2: the text 一二三四五六七甲乙丙 copies its first 7 of 10 characters; after a
    prompt of 3 (一二三), the span still counts whole and covers 4 of the 7 characters the model wrote."""
    training = Training(char_dataset(tmp_path / "d", "甲\n一二三四五六七八九十\n", chars="甲乙丙一二三四五六七八九十\n"))
    text = "一二三四五六七甲乙丙"
    copies = training.find(text)
    assert (copies.copied, copies.longest, spans_of(copies)) == (0.7, 7, [(0, 7)])
    span = copies.spans[0]
    assert (span.count, span.where, span.before, span.after) == (1, "line 2", "甲\n", "八九十\n")
    after_prompt = training.find(text, start=3)
    assert after_prompt.copied == pytest.approx(4 / 7) and spans_of(after_prompt) == [(0, 7)]
    assert marked(text, after_prompt, start=3) == "[四五六七]甲乙丙"


def test_a_chat_dataset_is_searched_in_its_base_corpus_and_its_conversations(tmp_path):
    from nanogpt.chat_dataset import prepare_chat
    from nanogpt.dataset import prepare
    poem = "白日依山盡黃河入海流欲窮千里目更上一層樓"
    (tmp_path / "base.txt").write_text((poem + "\n") * 20 + "寫問答說" * 50, encoding="utf-8")
    prepare(str(tmp_path / "base.txt"), "char", str(tmp_path / "base"), log=lambda *a: None)
    answers = ["欲窮千里目寫寫問問", "問答說寫問答說寫白"]
    with open(tmp_path / "chats.jsonl", "w", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"messages": [{"role": "user", "content": "說"},
                                             {"role": "assistant", "content": answers[i % 2] + "說" * (i % 3)}]}) + "\n")
    prepare_chat(str(tmp_path / "chats.jsonl"), str(tmp_path / "base"), str(tmp_path / "chat"), block_size=32,
                 log=lambda *a: None)
    training = Training(str(tmp_path / "chat"))
    from_base, from_chats = training.find(poem[:10]), training.find("千里目寫寫問問")
    assert [(s.part, s.text) for s in from_base.spans] == [(os.path.normpath(tmp_path / "base"), poem[:10])]
    assert [(s.part, s.where) for s in from_chats.spans] == [(os.path.normpath(tmp_path / "chat"), "conversation 1")]


def index_bytes(folder):
    with open(os.path.join(folder, INDEX_FILE), "rb") as f:
        return f.read()


def test_a_stale_index_is_rebuilt_and_answers_for_the_new_train_bin(tmp_path):
    folder = char_dataset(tmp_path / "d", "一二三四五六七八九十", chars="一二三四五六七八九十甲")
    old = os.path.getmtime(os.path.join(folder, INDEX_FILE))
    chars = sorted("一二三四五六七八九十甲")
    np.array([chars.index(c) for c in "甲甲甲一二三四五六七八九十"], np.uint16).tofile(os.path.join(folder, "train.bin"))
    os.utime(os.path.join(folder, "train.bin"), (old + 10, old + 10))  # changed after the index was built
    span = Training(folder).find("一二三四五六七").spans[0]
    assert span.before == "甲甲甲"  # found where the new train.bin has it
    assert struct.unpack_from("<Q", index_bytes(folder), 16)[0] == 13


def damaged(data):
    """Index files that are not this dataset's, each with the words its one line must hold."""
    header = HEADER.unpack(data[:HEADER.size])
    other_sha = HEADER.pack(*header[:5], b"\1" * 32)
    huge = HEADER.pack(*header[:4], 1 << 40, header[5])
    out_of_range = data[:HEADER.size] + struct.pack("<i", 1 << 30) + data[HEADER.size + 4:]
    return {"truncated": (data[:-3], "truncated or damaged"),
            "header only": (data[:HEADER.size - 1], "not an index of copies"),
            "another dataset's": (other_sha + data[HEADER.size:], "indexes another train.bin"),
            "a billion tokens claimed": (huge + data[HEADER.size:], "does not fit"),
            "positions past train.bin": (out_of_range, "positions outside train.bin"),
            "a pickle": (b"\x80\x04\x95" + data[3:], "not an index of copies"),
            "another version": (data[:8] + struct.pack("<I", 9) + data[12:], "version 9")}


@pytest.mark.parametrize("case", list(damaged(b"\0" * 200)))
def test_a_damaged_or_foreign_index_is_one_line_exit_2_and_left_as_it_is(tmp_path, case):
    folder = char_dataset(tmp_path / "d", "一二三四五六七八九十" * 3)
    data, words = damaged(index_bytes(folder))[case]
    with open(os.path.join(folder, INDEX_FILE), "wb") as f:
        f.write(data)
    result = run_script(["copies.py", f"--dataset={folder}", "--text=一二三四五六七八"], timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert len(errors) == 1 and words in errors[0] and "remove it" in errors[0], errors
    assert index_bytes(folder) == data


def test_characters_outside_the_vocabulary_never_match_and_an_empty_train_split_is_one_line(tmp_path):
    training = Training(char_dataset(tmp_path / "d", "一二三四五六七八九十"))
    assert spans_of(training.find("一二三é四五六七八九十")) == [(4, 11)]
    assert spans_of(training.find("")) == [] and training.find("").copied == 0.0
    empty = char_dataset(tmp_path / "e", "", chars="一")
    with pytest.raises(UserError, match="holds no tokens"):
        Training(empty)


def test_a_missing_index_in_a_read_only_folder_says_how_to_build_it(tmp_path, monkeypatch):
    import nanogpt.copies
    folder = char_dataset(tmp_path / "d", "一二三四五六七八九十")
    os.remove(os.path.join(folder, INDEX_FILE))

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(nanogpt.copies, "write_index", refused)  # root writes into a read-only folder
    with pytest.raises(UserError, match=f"is missing and {folder} is read-only.*python copies.py --dataset={folder}"):
        Training(folder)


def test_the_index_of_wide_tokens_builds_within_ten_bytes_a_token(tmp_path):
    """uint16 tokens sort as 2 bytes each, 4 bytes of array a byte: the tokens (2) and the array (8) at the sort,
    and no more after it (the tokens are freed before the compaction's chunks); tokens below 256 are narrowed to
    one byte first: 1 + 4. tracemalloc sees numpy's allocations and divsufsort's array."""
    import tracemalloc
    n = 2_000_000
    for vocab, per_token in ((3000, 10), (200, 5)):  # uint16 tokens of two bytes; of one byte, narrowed first
        np.random.default_rng(0).integers(0, vocab, n, dtype=np.uint16).tofile(tmp_path / "train.bin")
        was_tracing = tracemalloc.is_tracing()  # PYTHONTRACEMALLOC may have started it: measure above what it holds
        if not was_tracing:
            tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            write_index(str(tmp_path), np.dtype(np.uint16))
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            if not was_tracing:
                tracemalloc.stop()
        assert per_token * n <= peak <= per_token * n + 500_000, vocab
        assert os.path.getsize(tmp_path / INDEX_FILE) == HEADER.size + 4 * n


def test_prepare_writes_the_index_beside_train_bin(tmp_path):
    from nanogpt.dataset import prepare
    (tmp_path / "in.txt").write_text("床前明月光疑是地上霜舉頭望明月低頭思故鄉\n" * 30, encoding="utf-8")
    prepare(str(tmp_path / "in.txt"), "char", str(tmp_path / "d"), log=lambda *a: None)
    before = index_bytes(tmp_path / "d")
    assert Training(str(tmp_path / "d")).find("舉頭望明月低頭").copied == 1.0
    assert index_bytes(tmp_path / "d") == before  # used as prepare wrote it, not rebuilt


def test_sample_py_marks_copies_after_generating_the_same_text(char_dataset, tmp_path):
    """--copies=True writes the text --copies=False writes, with the library's spans bracketed and its share."""
    from nanogpt.copies import report
    from train import TrainConfig, train
    train(TrainConfig(dataset=str(char_dataset), out_dir=str(tmp_path / "out"), n_layer=2, n_head=2, n_embd=32,
                      block_size=32, batch_size=16, gradient_accumulation_steps=1, max_iters=300, lr_decay_iters=300,
                      eval_interval=300, eval_iters=2, learning_rate=1e-2, warmup_iters=5, device="cpu",
                      compile=False), log=lambda *a: None)
    args = ["sample.py", f"--out_dir={tmp_path / 'out'}", "--start=First", "--temperature=0", "--max_new_tokens=80"]
    plain, flagged = run_script(args), run_script(args + ["--copies=True"])
    assert plain.returncode == 0 and flagged.returncode == 0, flagged.stderr
    text = plain.stdout.split("---------------")[0][:-1]
    found = Training(str(char_dataset)).find(text, start=len("First"))
    assert found.spans, text  # the corpus repeats: a model trained on it recites
    expected = "First" + marked(text, found, start=len("First")) + "\n" + "\n".join(report(found)) + "\n"
    assert flagged.stdout.split("---------------")[0] == expected
