"""Dataset preparation: nanoGPT's format and split, bounded streaming, BPE boundaries."""
import codecs
import json
import os
import pickle

import numpy as np
import pytest
import tiktoken

from conftest import CORPUS, SHAKESPEARE
from nanogpt import dataset as prep


def test_char_dataset_matches_a_plain_split(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(CORPUS)
    counts = prep.prepare(str(src), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    chars = sorted(set(CORPUS))
    n = int(len(CORPUS) * 0.9)
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint16)
    assert train.tolist() == [chars.index(c) for c in CORPUS[:n]]
    assert val.tolist() == [chars.index(c) for c in CORPUS[n:]]
    assert counts == {"train": n, "val": len(CORPUS) - n, "vocab_size": len(chars)}
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["chars"] == chars and meta["dtype"] == "uint16"
    legacy = pickle.loads((tmp_path / "out" / "meta.pkl").read_bytes())  # nanoGPT's layout
    assert legacy["vocab_size"] == len(chars) and legacy["itos"][0] == chars[0] and legacy["stoi"][chars[-1]] == len(chars) - 1


def test_gpt2_chunked_encoding_equals_whole_text_encoding(tmp_path, monkeypatch):
    text = ("Hello world!\n\n  Indented line\nthe end.  \n\n\n" + "word " * 30 + "\n") * 50 + "héllo 日本語\n"
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    monkeypatch.setattr(prep, "CHUNK_BYTES", 37)  # force hundreds of chunks
    prep.prepare(str(src), "gpt2", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    enc = tiktoken.get_encoding("r50k_base")
    n = int(len(text) * 0.9)
    assert np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16).tolist() == enc.encode_ordinary(text[:n])
    assert np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint16).tolist() == enc.encode_ordinary(text[n:])


def test_directory_is_read_in_sorted_order_with_eot_between_documents(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "b.txt").write_text("second document " * 20)
    (docs / "a.txt").write_text("first document " * 20)
    (docs / ".hidden").write_text("ignored")
    prep.prepare(str(docs), "gpt2", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    enc = tiktoken.get_encoding("r50k_base")
    first, second = "first document " * 20, "second document " * 20
    a, b = int(len(first) * 0.9), int(len(second) * 0.9)  # each file, half the text, gives its last tenth to val
    train, val = (np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16).tolist() for s in ("train", "val"))
    assert train == enc.encode_ordinary(first[:a]) + [50256] + enc.encode_ordinary(second[:b])
    assert val == enc.encode_ordinary(first[a:]) + [50256] + enc.encode_ordinary(second[b:])


def split_texts(out):
    """A char dataset's train and val as text."""
    chars = json.loads((out / "meta.json").read_text())["chars"]
    return ["".join(chars[i] for i in np.fromfile(out / f"{s}.bin", dtype=np.uint16)) for s in ("train", "val")]


def test_a_folder_of_two_languages_is_validated_on_both_in_proportion(tmp_path):
    """A folder's val was the end of its last file: a folder of a Russian novel and an English one was validated
    on English alone, and its plan (which reads the whole text) predicted the wrong language's loss."""
    docs = tmp_path / "docs"
    docs.mkdir()
    russian, english = "Мой дядя самых честных правил.\n" * 90, "It is a truth universally acknowledged.\n" * 20
    (docs / "1.txt").write_text(russian)
    (docs / "2.txt").write_text(english)
    prep.prepare(str(docs), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    a, b = int(len(russian) * 0.9), int(len(english) * 0.9)
    assert split_texts(tmp_path / "out") == [russian[:a] + english[:b], russian[a:] + english[b:]]


def test_a_folder_of_small_files_gives_val_from_ten_places_not_from_every_file(tmp_path):
    """365 diary entries do not each lose their last lines to val: consecutive files make up a tenth of the text,
    and each tenth gives its end."""
    docs = tmp_path / "days"
    docs.mkdir()
    days = ["".join(chr(0x4E00 + 50 * i + k) for k in range(50)) for i in range(30)]  # ten parts of three files
    for i, day in enumerate(days):
        (docs / f"{i:02d}.txt").write_text(day)
    prep.prepare(str(docs), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    train, val = split_texts(tmp_path / "out")
    assert val == "".join(days[i][35:] for i in range(2, 30, 3))  # the last 15 of each 150 characters
    assert train == "".join(day if i % 3 != 2 else day[:35] for i, day in enumerate(days))


@pytest.mark.parametrize("sizes", [[95, 105] * 5, [90, 910], [1] + [100] * 10, [100] * 10 + [1]])
def test_every_file_of_a_twentieth_of_the_folder_gives_its_end_to_val(tmp_path, sizes):
    """A book just under a tenth of the folder, or a preface of 9% in another language, gives its own last tenth (it
    was taken together with the next file, which gave the part's); a one-line README beside ten chapters is train
    with the chapter after it or val with the one before, never a part of its own."""
    docs = tmp_path / "docs"
    docs.mkdir()
    start, texts = 0x4E00, []
    for i, n in enumerate(sizes):
        texts.append("".join(chr(start + k) for k in range(n)))
        start += n
        (docs / f"{i:02d}.txt").write_text(texts[-1])
    prep.prepare(str(docs), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    train, val = split_texts(tmp_path / "out")
    whole = "".join(texts)
    large = [i for i, n in enumerate(sizes) if n >= 0.05 * sum(sizes)]
    for i in large:  # each large file's last tenth (its part's, with a README beside it) is in val, its start in train
        assert texts[i][-(len(texts[i]) // 10):] in val and texts[i][:len(texts[i]) * 8 // 10] in train
    assert len(val) == pytest.approx(0.1 * len(whole), abs=len(large)) and sorted(train + val) == sorted(whole)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 22])
def test_windows_and_lone_cr_newlines_are_normalized_like_text_mode(tmp_path, monkeypatch, chunk):
    """\r\n and a lone \r each become one \n, also where a chunk ends between \r and \n."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"ab\r\ncd\re\n\r\r\nf\r" * 10)
    expected = "ab\ncd\ne\n\n\nf\n" * 10  # by hand
    assert open(src, encoding="utf-8").read() == expected  # Python's text mode agrees
    monkeypatch.setattr(prep, "CHUNK_BYTES", chunk)
    prep.prepare(str(src), "char", str(tmp_path / "out"), 0.5, log=lambda *a: None)
    chars = json.loads((tmp_path / "out" / "meta.json").read_text())["chars"]
    assert chars == sorted(set(expected))
    ids = np.concatenate([np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert "".join(chars[i] for i in ids) == expected


def test_rerun_replaces_outputs_and_says_so(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(CORPUS)
    out = str(tmp_path / "out")
    said = []
    first = prep.prepare(str(src), "char", out, 0.1, log=said.append)
    assert not any("replaced" in line for line in said)
    second = prep.prepare(str(src), "char", out, 0.1, log=said.append)
    assert first == second and not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert sum(line.startswith(f"note: replaced the dataset that was in {out}") for line in said) == 1


def test_a_folder_says_which_files_it_read(tmp_path):
    """Every file that is not hidden is text to learn from, whatever its name: the user sees which."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for name in ("a.txt", "b.md", ".hidden.txt", *(f"n{i}.txt" for i in range(6))):
        (folder / name).write_text("some text\n" * 3)
    said = []
    prep.prepare(str(folder), "char", str(tmp_path / "out"), 0.1, log=said.append)
    assert said[0] == f"reading 8 files of {folder}: a.txt, b.md, n0.txt, n1.txt, n2.txt and 3 more"


def test_bad_inputs_are_user_errors(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(prep.UserError, match="not UTF-8"):
        prep.prepare(str(tmp_path / "bin.txt"), "char", str(tmp_path / "o"), log=lambda *a: None)
    with pytest.raises(prep.UserError, match="not found"):
        prep.prepare(str(tmp_path / "missing.txt"), "char", str(tmp_path / "o"), log=lambda *a: None)


@pytest.mark.parametrize("encoding, named", [("gbk", "GB18030"), ("big5", "BIG5"), ("utf-16", "UTF-16"),
                                             ("latin-1", None)])
def test_a_text_that_is_not_utf8_gets_the_iconv_command_that_converts_it(tmp_path, encoding, named):
    """A Chinese learner's file from Windows is GBK: `iconv -t utf-8` (the old hint) fails on it without -f. The
    error names the encoding the text reads as, and the command it prints, run as printed, converts it."""
    import shutil
    import subprocess
    text = ("今天天氣很好，我們去公園散步。\n" if encoding == "big5" else "今天天气很好，我们去公园散步。hello\n"
            if encoding != "latin-1" else "café naïve\n") * 40
    (tmp_path / "diary.txt").write_bytes(text.encode(encoding))
    with pytest.raises(prep.UserError) as e:
        prep.prepare(str(tmp_path / "diary.txt"), "char", str(tmp_path / "o"), log=lambda *a: None)
    message = str(e.value)
    if named is None:  # Latin-1 decodes any bytes: no guess, the command names the encoding to fill in
        assert "iconv -f ITS_ENCODING -t UTF-8" in message
        return
    assert f"it reads as {named}: convert it first, iconv -f {named} -t UTF-8" in message
    assert "stray" not in message
    if shutil.which("iconv"):
        command = message.split("convert it first, ", 1)[1]
        subprocess.run(command, shell=True, check=True, cwd=tmp_path)
        assert (tmp_path / "diary.utf8.txt").read_text(encoding="utf-8") == text


@pytest.mark.parametrize("name, data, said", [
    ("photo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "it is a PNG image;"),
    ("essay.docx", b"PK\x03\x04\x14\0\x06\0\x08\0\0\0!\0\xdf\xa4", "it is a zip archive (a .docx, .epub or .xlsx is one)"),
    ("notes.dat", "a log\0 line\n".encode() * 40, "it is a binary file (it holds zero bytes")])  # UTF-8, and no text
def test_a_file_in_the_folder_that_is_no_text_is_named_as_such(tmp_path, name, data, said):
    """A learner's folder of texts holds an image or a Word file too: that file is named for what it is and taken out
    of the input, not given an iconv command to convert it from an encoding (the .docx and the zero bytes decode as
    UTF-8: they became characters of the vocabulary)."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "diary.txt").write_text("今天天气很好。\n" * 50, encoding="utf-8")
    (tmp_path / "texts" / name).write_bytes(data)
    with pytest.raises(prep.UserError) as e:
        prep.prepare(str(tmp_path / "texts"), "char", str(tmp_path / "o"), log=lambda *a: None)
    assert f"{name} is not text: " in str(e.value) and said in str(e.value) and "iconv" not in str(e.value)
    assert "take it out of the input" in str(e.value)


def test_a_byte_order_mark_is_not_a_character_of_the_text(tmp_path):
    """Notepad saves UTF-8 with a BOM at each file's start: it is not in the vocabulary, nor in the tokens."""
    (tmp_path / "texts").mkdir()
    for i in range(2):
        (tmp_path / "texts" / f"{i}.txt").write_bytes(codecs.BOM_UTF8 + "床前明月光，疑是地上霜。\n".encode() * 40)
    prep.prepare(str(tmp_path / "texts"), "char", str(tmp_path / "o"), log=lambda *a: None)
    with open(tmp_path / "o" / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    assert "\ufeff" not in meta["stoi"] and set(meta["stoi"]) == set("床前明月光，疑是地上霜。\n")
    for size in (1, 2, 3, 4096):  # the mark split over reads of a few bytes (tests read so), or whole in one
        assert "".join(t for _, t in prep.read_text(str(tmp_path / "texts" / "0.txt"), size)) == (
            "床前明月光，疑是地上霜。\n" * 40)


def test_a_zero_byte_past_the_first_read_is_found_too(tmp_path):
    (tmp_path / "log.txt").write_bytes(b"a line of text\n" * 100 + b"\0")
    with pytest.raises(prep.UserError, match="it is a binary file"):
        list(prep.read_text(str(tmp_path / "log.txt"), 64))


def test_a_utf8_text_with_one_stray_byte_is_not_told_to_convert_from_another_encoding(tmp_path):
    """é and ï in UTF-8 also read as GB18030 ideographs: a UTF-8 file with one cp1252 é in it was told to convert
    from GB18030, which would have garbled every accent. Where the text before the bad byte is UTF-8 beyond ASCII,
    the byte is named as stray."""
    (tmp_path / "notes.txt").write_bytes(("café naïve " * 2000).encode() + b"\xe9x more\n")
    with pytest.raises(prep.UserError) as e:
        prep.prepare(str(tmp_path / "notes.txt"), "char", str(tmp_path / "o"), log=lambda *a: None)
    assert str(e.value).endswith("(bad byte near offset 26000); the text before it is UTF-8, so that byte is stray: "
                                 "remove it, or save the file again as UTF-8")


@pytest.mark.skipif(not os.path.exists(SHAKESPEARE), reason="needs ../shared/data/tinyshakespeare")
@pytest.mark.parametrize("tokenizer, train, val, vocab", [("char", 1_003_854, 111_540, 65),
                                                         ("gpt2", 301_966, 36_059, 50_257)])
def test_shakespeare_counts(tmp_path, tokenizer, train, val, vocab):
    counts = prep.prepare(SHAKESPEARE, tokenizer, str(tmp_path), 0.1, log=lambda *a: None)
    assert counts == {"train": train, "val": val, "vocab_size": vocab}


def test_openwebtext_recipe_on_a_local_dataset(tmp_path):
    """The OpenWebText script, offline: local JSON lines stand in for the Hub download."""
    pytest.importorskip("datasets")
    from conftest import run_script
    docs = [f"Document number {i}. " + "Some words of text. " * (i % 7 + 1) for i in range(40)]
    (tmp_path / "owt.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    result = run_script(["data/openwebtext/prepare.py", f"--input={tmp_path / 'owt.jsonl'}", f"--out={tmp_path / 'out'}",
                         "--num_proc=2", "--val_fraction=0.1"])
    assert result.returncode == 0, result.stderr[-2000:]
    enc = tiktoken.get_encoding("r50k_base")
    splits = {s: np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16).tolist() for s in ("train", "val")}

    def documents(ids):
        text = enc.decode(ids)
        assert text.endswith("<|endoftext|>")
        return text.split("<|endoftext|>")[:-1]
    train_docs, val_docs = documents(splits["train"]), documents(splits["val"])
    assert len(val_docs) == 4 and sorted(train_docs + val_docs) == sorted(docs)
    assert len(splits["train"]) + len(splits["val"]) == sum(len(enc.encode_ordinary(d)) + 1 for d in docs)
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["tokenizer"] == "gpt2"


def test_vocabularies_over_65536_use_uint32_and_train_reads_them(tmp_path):
    import torch

    from nanogpt.training.batches import Batches
    text = "".join(chr(0x10000 + i) for i in range(70_000)) * 2  # 70,000 symbols: too many for uint16
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    counts = prep.prepare(str(tmp_path / "in.txt"), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert counts["vocab_size"] == 70_000 and meta["dtype"] == "uint32"
    batches = Batches(str(tmp_path / "out"), 8, 4, torch.device("cpu"), 0, meta)
    x, y = batches.get("train", (0, 0, 0))
    assert x.max().item() < 70_000 and torch.equal(x[:, 1:], y[:, :-1])
    assert ((y - x) % 70_000 == 1).all()  # consecutive code points: each next id is one more (mod the repeat)


def test_suggested_command_trains_on_this_data_on_this_machine(tmp_path):
    from conftest import run_script
    (tmp_path / "mine.txt").write_text(CORPUS[:3000], encoding="utf-8")  # a few KB
    result = run_script(["data/prepare.py", "--input", str(tmp_path / "mine.txt"), "--out", str(tmp_path / "my texts")])
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1].split("train on it with: ")[1]
    assert command.startswith("python train.py --dataset=") and command.endswith("--minutes=10")  # a plan
    import shlex
    args = shlex.split(command)[1:] + ["--max_iters=2", "--eval_iters=1", f"--out_dir={tmp_path / 'out'}"]
    trained = run_script(args)
    assert trained.returncode == 0, trained.stderr
    assert "done: 2 iters" in trained.stdout


def test_suggested_context_fits_the_smallest_split():
    # 300 val tokens leave 299 for a window: the GPU recipe's 256 fits, the CPU recipe's 64 too
    assert "--block_size" not in prep.train_command("data/x", {"train": 2700, "val": 300}, cuda=True)
    # 40 val tokens: the largest power of 2 below 40 is 32
    assert prep.train_command("data/x", {"train": 400, "val": 40}, cuda=True).endswith("--out_dir=out-x --block_size=32")
    # on a CPU the plan fits the context itself (plan.largest_block)
    assert prep.train_command("data/x", {"train": 400, "val": 40}).endswith("--out_dir=out-x --minutes=10")
    with pytest.raises(prep.UserError, match="too few to train on"):
        prep.train_command("data/x", {"train": 100, "val": 5})


TANG = "秦川雄帝宅，函谷壯皇居。\n綺殿千尋起，離宮百雉餘。\n" * 40
UNSEEN = "👩‍👩‍👧‍👦 e\u0301 ﬁ\t漢字の文章 naïve\r\n\x00 end"  # joiners, a combining accent, a ligature, CJK, a tab, NUL


@pytest.fixture(scope="module")
def bpe_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    (root / "a.txt").write_text(TANG, encoding="utf-8")  # each file, over a tenth of the text, gives its end to val
    (root / "b.txt").write_text(CORPUS, encoding="utf-8")
    counts = prep.prepare(str(root), "bpe", str(root / "data"), 0.1, log=lambda *a: None, vocab_size=390)
    return root / "data", counts


def test_trained_bpe_round_trips_any_text_and_splits_like_the_whole(bpe_dataset):
    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    data, counts = bpe_dataset
    meta = read_meta(str(data))
    tok = tokenizer_from_meta(meta)
    assert meta["tokenizer"] == "bpe" and counts["vocab_size"] == tok.vocab_size == 390
    assert tok.eot == 389 and meta["special_tokens"] == {"<|endoftext|>": 389}
    assert tok.decode(tok.encode(UNSEEN)) == UNSEEN  # never seen in training: byte fallback
    assert len(tok.encode("函谷壯皇居")) < len("函谷壯皇居".encode("utf-8"))  # it learned merges of this text
    # the ids streaming wrote are those of each split encoded whole, by the tokenizer as loaded: ids, not decoded
    # text, since a BPE loaded with another split pattern (GPT-2's) still round-trips but cuts other tokens
    a, b = int(len(TANG) * 0.9), int(len(CORPUS) * 0.9)
    train, val = (np.fromfile(data / f"{s}.bin", dtype=np.uint16).tolist() for s in ("train", "val"))
    assert train == tok.encode(TANG[:a]) + [tok.eot] + tok.encode(CORPUS[:b])
    assert val == tok.encode(TANG[a:]) + [tok.eot] + tok.encode(CORPUS[b:])


def test_a_trained_bpe_learns_no_merge_from_val(tmp_path):
    """The BPE is trained on the train split only: a pair found only at the ends of a folder's files, its val,
    is not merged."""
    (tmp_path / "a.txt").write_text(CORPUS[:3600] + "zq" * 200)  # each file's last tenth is its pairs
    (tmp_path / "b.txt").write_text(CORPUS[3600:6300] + "xj" * 150)
    assert "zq" not in CORPUS and "xj" not in CORPUS
    prep.prepare(str(tmp_path), "bpe", str(tmp_path / "data"), 0.1, log=lambda *a: None, vocab_size=300)
    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    tok = tokenizer_from_meta(read_meta(str(tmp_path / "data")))
    assert len(tok.encode("zq")) == len(tok.encode("xj")) == 2
    assert len(tok.encode(" Citizen")) == 1  # a word of train is merged


def test_a_bpe_learns_each_files_train_text_apart_from_the_next_files(tmp_path, monkeypatch):
    """A file's train text ends where its val starts, mid-line: joined to the next file's start it made words the
    text never holds ("...is cuChapter 1"), which the BPE counted. The trainer is handed each file's train text
    apart."""
    (tmp_path / "a.txt").write_text("Line one\nLine two is cut here and then some more words\n" * 20)
    (tmp_path / "b.txt").write_text("Chapter 1\nIt begins.\n" * 40)
    handed = []

    class Handed(Exception):
        pass

    class Trainer:
        def train_from_iterator(self, pieces, vocab_size):
            handed.extend(pieces)
            raise Handed

    import rustbpe
    monkeypatch.setattr(rustbpe, "Tokenizer", Trainer)
    with pytest.raises(Handed):
        prep.prepare(str(tmp_path), "bpe", str(tmp_path / "data"), 0.1, log=lambda *a: None, vocab_size=300)
    a, b = (tmp_path / "a.txt").read_text(), (tmp_path / "b.txt").read_text()
    assert "".join(handed) == a[:int(len(a) * 0.9)] + b[:int(len(b) * 0.9)]  # the train split, val left out
    assert not any("Chapter" in piece and "Line" in piece for piece in handed)


@pytest.mark.parametrize("vocab, message", [(200, "at least 257"), (100000, "supports only")])
def test_a_bpe_vocabulary_the_text_cannot_have_is_refused_and_writes_nothing(tmp_path, vocab, message):
    (tmp_path / "in.txt").write_text("abc abd abe\n" * 50, encoding="utf-8")
    with pytest.raises(prep.UserError, match=message):
        prep.prepare(str(tmp_path / "in.txt"), "bpe", str(tmp_path / "out"), 0.1, log=lambda *a: None,
                     vocab_size=vocab)
    assert not (tmp_path / "out").exists()


def test_a_dataset_without_its_tokenizer_file_is_one_line(tmp_path, bpe_dataset):
    import shutil

    from conftest import run_script
    data, _ = bpe_dataset
    shutil.copytree(data, tmp_path / "data")
    (tmp_path / "data" / "tokenizer.bpe").unlink()
    result = run_script(["train.py", f"--dataset={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}",
                         "--device=cpu", "--n_layer=1", "--n_head=1", "--n_embd=8", "--block_size=8"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "tokenizer.bpe, the dataset's tokenizer, cannot be read" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_tokenizer_travels_with_the_checkpoint(tmp_path, bpe_dataset):
    import shutil

    from conftest import run_script
    from train import TrainConfig, train
    data, _ = bpe_dataset
    shutil.copytree(data, tmp_path / "data")
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), dataset=str(tmp_path / "data"), n_layer=1, n_head=2, n_embd=16,
                      block_size=16, batch_size=4, gradient_accumulation_steps=1, eval_iters=1, max_iters=2,
                      eval_interval=2, device="cpu")
    train(cfg, log=lambda *a: None)
    shutil.rmtree(tmp_path / "data")  # the dataset is gone: sample.py and trace.py read the checkpoint's tokenizer
    args = ["--out_dir=" + str(tmp_path / "out"), "--start=秦川雄帝宅"]
    sampled = run_script(["sample.py", *args, "--num_samples=1", "--max_new_tokens=8", "--temperature=0"])
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("秦川雄帝宅")
    traced = run_script(["trace.py", *args, "--steps=1"])
    assert traced.returncode == 0, traced.stderr
    pytest.importorskip("transformers")  # export.py writes through it (requirements-dev.txt)
    exported = run_script(["export.py", "--out_dir=" + str(tmp_path / "out"), "--hf_dir=" + str(tmp_path / "hf")])
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 389  # the trained BPE's


def test_tang_poems_prepare_offline(tmp_path):
    from conftest import SHARED
    corpus = os.path.join(SHARED, "data", "tangshi", "input.txt")
    if not os.path.exists(corpus):
        pytest.skip("needs ../shared/data/tangshi/input.txt")
    text = open(corpus, encoding="utf-8").read()
    # the same layout as data/tangshi/prepare.py writes when it downloads: title, author, lines, blank line
    from data.tangshi.prepare import poems_text
    first = text.split("\n\n")[0].split("\n")
    assert poems_text([{"title": first[0], "author": first[1], "paragraphs": first[2:]}]) == text.split("\n\n")[0] + "\n\n"
    assert len(text) == 1_133_213 and len(set(text)) == 6_552


def test_a_file_cut_inside_a_character_says_so(tmp_path):
    (tmp_path / "cut.txt").write_bytes("秦川雄帝宅".encode("utf-8")[:-1])  # 2 of the last character's 3 bytes
    with pytest.raises(prep.UserError, match=r"ends in the middle of a UTF-8 character .* drop its last 2 bytes"):
        prep.prepare(str(tmp_path / "cut.txt"), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    assert not (tmp_path / "out").exists()


def test_gpt2_bpe_on_chinese_points_to_a_better_tokenizer(tmp_path):
    lines = []
    (tmp_path / "tang.txt").write_text(TANG, encoding="utf-8")
    prep.prepare(str(tmp_path / "tang.txt"), "gpt2", str(tmp_path / "out"), 0.1, log=lines.append)
    note = next(line for line in lines if line.startswith("note:"))
    assert "tokens per character" in note and "--tokenizer char or --tokenizer bpe" in note
    lines.clear()
    (tmp_path / "en.txt").write_text(CORPUS, encoding="utf-8")
    prep.prepare(str(tmp_path / "en.txt"), "gpt2", str(tmp_path / "out2"), 0.1, log=lines.append)
    assert not [line for line in lines if line.startswith("note:")]


def file_hashes(directory):
    import hashlib
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in sorted(os.listdir(directory))}


def test_a_refused_prepare_replaces_nothing_and_a_passing_one_replaces_every_file(tmp_path):
    from conftest import run_script
    out = tmp_path / "mine"
    (tmp_path / "good.txt").write_text(CORPUS, encoding="utf-8")
    (tmp_path / "small.txt").write_text("tiny text, too short\n", encoding="utf-8")  # 3 val tokens: too few
    (tmp_path / "other.txt").write_text(CORPUS.upper(), encoding="utf-8")
    assert run_script(["data/prepare.py", "--input", str(tmp_path / "good.txt"), "--out", str(out)]).returncode == 0
    before = file_hashes(out)
    assert sorted(before) == ["meta.json", "meta.pkl", "train.bin", "train.sa", "val.bin"]
    refused = run_script(["data/prepare.py", "--input", str(tmp_path / "small.txt"), "--out", str(out)])
    assert refused.returncode == 2 and "too few to train on" in refused.stderr and "Traceback" not in refused.stderr
    assert file_hashes(out) == before  # no temporary file left either
    passed = run_script(["data/prepare.py", "--input", str(tmp_path / "other.txt"), "--out", str(out)])
    assert passed.returncode == 0, passed.stderr
    after = file_hashes(out)
    assert sorted(after) == sorted(before) and all(after[name] != before[name] for name in before)


def test_a_refused_prepare_into_a_new_directory_leaves_no_directory(tmp_path):
    (tmp_path / "small.txt").write_text("tiny text, too short\n", encoding="utf-8")

    def refuse(counts):
        raise prep.UserError("too few")
    with pytest.raises(prep.UserError, match="too few"):
        prep.prepare(str(tmp_path / "small.txt"), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None,
                     check=refuse)
    assert not (tmp_path / "out").exists()


def test_a_dataset_re_prepared_with_another_tokenizer_keeps_no_file_of_the_old_one(tmp_path):
    (tmp_path / "in.txt").write_text(CORPUS, encoding="utf-8")
    prep.prepare(str(tmp_path / "in.txt"), "char", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    prep.prepare(str(tmp_path / "in.txt"), "gpt2", str(tmp_path / "out"), 0.1, log=lambda *a: None)
    # nanoGPT's sample.py reads meta.pkl first: a stale one would decode GPT-2 ids as characters
    assert sorted(os.listdir(tmp_path / "out")) == ["meta.json", "train.bin", "train.sa", "val.bin"]


def test_hidden_files_and_folders_are_skipped_at_every_depth(tmp_path):
    docs = tmp_path / "docs"
    for name in ("a.txt", "sub/b.txt", ".hidden/x.txt", ".hidden/deeper/y.txt", "sub/.git/z.txt", "sub/.notes.txt"):
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(name)
    assert prep.list_inputs(str(docs)) == [str(docs / "a.txt"), str(docs / "sub" / "b.txt")]


def test_a_link_out_of_the_input_folder_is_skipped_with_a_note_and_one_inside_is_read(tmp_path):
    """A user's link to /etc/shadow went into a dataset: prepare reads only what its folder holds."""
    docs, secret = tmp_path / "docs", tmp_path / "secret.txt"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "d.txt").write_text("root:SECRET\n")
    secret.write_text("root:SECRET\n" * 20)
    docs.mkdir()
    (docs / "a.txt").write_text("first document\n" * 20)
    os.symlink(secret, docs / "b.txt")  # outside: skipped
    os.symlink("a.txt", docs / "c.txt")  # inside: read
    os.symlink(tmp_path / "elsewhere", docs / "sub")  # a linked folder is not entered
    notes = []
    prep.prepare(str(docs), "char", str(tmp_path / "out"), 0.1, log=notes.append)
    chars = json.loads((tmp_path / "out" / "meta.json").read_text())["chars"]
    ids = [i for split in ("train", "val") for i in np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16)]
    assert "".join(chars[i] for i in ids) == "first document\n" * 40  # a.txt, then c.txt: char datasets join files
    assert [n for n in notes if n.startswith("note:")] == [
        f"note: skipping {docs / 'b.txt'}: it links to {secret}, outside {docs}; copy the file in to include it"]


@pytest.mark.parametrize("kind", ["a FIFO in the folder", "/dev/zero"])
def test_an_input_that_never_ends_is_refused_and_nothing_is_written(tmp_path, kind):
    from conftest import run_script
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("first document\n" * 20)
    os.mkfifo(docs / "b.fifo")  # no writer: a plain open() for reading waits forever
    source, named = (str(docs), docs / "b.fifo") if kind != "/dev/zero" else ("/dev/zero", "/dev/zero")
    result = run_script(["data/prepare.py", "--input", source, "--out", str(tmp_path / "out")], timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"error: {named} is not a regular file (it is "
                                          f"{'a FIFO' if kind != '/dev/zero' else 'a character device'}): "
                                          f"refusing to read it; put the file itself there"]
    assert not (tmp_path / "out").exists()


def suggestion(result):
    """The lines data/prepare.py prints after its counts: the train command, and a note if any."""
    lines = result.stdout.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("done; train on it with: "))
    return lines[start][len("done; train on it with: "):], lines[start + 1:]


@pytest.mark.skipif(prep.torch_cuda_available(), reason="the suggestion on a machine without CUDA")
def test_the_suggested_recipe_is_the_datasets_own_where_there_is_one(tmp_path):
    from conftest import run_script
    (tmp_path / "tang.txt").write_text(TANG, encoding="utf-8")
    result = run_script(["data/prepare.py", "--input", str(tmp_path / "tang.txt"), "--out", str(tmp_path / "tangshi")])
    assert result.returncode == 0, result.stderr
    command, notes = suggestion(result)
    assert command.startswith("python train.py config/tangshi_cpu.py --dataset=") and not notes
    assert prep.train_command("data/poems", {"train": 900, "val": 100}) == (
        "python train.py --dataset=data/poems --out_dir=out-poems --minutes=10")  # no recipe of its own: a plan
    assert prep.train_command("data/shakespeare_char", {"train": 900, "val": 100}).startswith(
        "python train.py config/shakespeare_char_cpu.py")  # the course's own recipe stays
    assert prep.train_command("data/shakespeare_char", {"train": 900, "val": 100}, cuda=True).startswith(
        "python train.py config/shakespeare_char.py")


@pytest.mark.skipif(prep.torch_cuda_available(), reason="the suggestion on a machine without CUDA")
def test_the_gpt2_suggestion_names_the_vocabulary_as_what_makes_it_slow_on_a_cpu(tmp_path):
    from conftest import run_script
    (tmp_path / "en.txt").write_text(CORPUS, encoding="utf-8")
    result = run_script(["data/prepare.py", "--input", str(tmp_path / "en.txt"), "--tokenizer", "gpt2",
                         "--out", str(tmp_path / "en")])
    assert result.returncode == 0, result.stderr
    command, notes = suggestion(result)
    assert command.startswith("python train.py --dataset=") and command.endswith("--minutes=10")
    # config/shakespeare_char_cpu.py: 4 layers, 128 wide. Multiply-adds per token, by hand: blocks 12 * 4 * 128^2
    # = 786,432; output layer 50,257 * 128 = 6,432,896, of 7,219,328 in all (89%); with 4,096 tokens 1,310,720 (5.5x)
    assert len(notes) == 1 and notes[0].startswith("note: the 50,257-token vocabulary makes the output layer 89% of "
                                                   "the work per token of config/shakespeare_char_cpu.py (5.5 times")
    assert "sized for a GPU" in notes[0] and "--tokenizer char or --tokenizer bpe --vocab_size 4096" in notes[0]
    chars = run_script(["data/prepare.py", "--input", str(tmp_path / "en.txt"), "--out", str(tmp_path / "ch")])
    assert suggestion(chars)[1] == []  # 65 characters: the blocks do the work


def test_a_tokenizer_linked_within_the_dataset_is_read(tmp_path, bpe_dataset):
    """Only a link out of the dataset is refused: the file is copied into every checkpoint."""
    import shutil

    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    data, counts = bpe_dataset
    shutil.copytree(data, tmp_path / "data")
    (tmp_path / "data" / "merges").mkdir()
    os.replace(tmp_path / "data" / "tokenizer.bpe", tmp_path / "data" / "merges" / "v1.bpe")
    os.symlink("merges/v1.bpe", tmp_path / "data" / "tokenizer.bpe")
    assert tokenizer_from_meta(read_meta(str(tmp_path / "data"))).vocab_size == counts["vocab_size"]
    os.symlink(tmp_path / "data", tmp_path / "linked")  # a dataset directory that is itself a link
    assert tokenizer_from_meta(read_meta(str(tmp_path / "linked"))).vocab_size == counts["vocab_size"]


@pytest.mark.parametrize("name", ["meta.json", "meta.pkl"])
def test_dataset_metadata_that_is_a_fifo_is_refused_not_waited_on(tmp_path, name):
    import signal

    from nanogpt.tokenizer import read_meta

    def hung(*_):
        pytest.fail(f"reading a FIFO named {name} blocked for 60 s")
    (tmp_path / "data").mkdir()
    os.mkfifo(tmp_path / "data" / name)  # no writer: a plain open() for reading waits forever
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(prep.UserError, match=f"{name} is not a regular file \\(it is a FIFO\\)"):
            read_meta(str(tmp_path / "data"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("script", ["data/prepare.py", "data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py",
                                    "data/openwebtext/prepare.py", "data/chat/prepare.py", "data/tangshi/prepare.py",
                                    "data/tangshi/conversations.py", "data/tangshi/evaluate.py", "plot.py"])
def test_help_describes_every_option(script):
    """argparse lists an option without help= bare: each entry of --help has its text, beside it or below."""
    from conftest import run_script
    result = run_script([script, "--help"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n\n", 1)[1].splitlines()  # past the usage
    entries = [i for i, line in enumerate(lines) if line.startswith("  ") and not line.startswith("   ")]
    for i in entries:
        described = "  " in lines[i].strip() or (i + 1 < len(lines) and lines[i + 1].startswith("   "))
        assert described, f"{script} --help: {lines[i].strip()} has no description"


def test_the_study_advises_a_bpe_for_megabytes_of_latin_letters_and_characters_otherwise(tmp_path):
    """The tokenizer note follows what the study measured (docs/minutes.md): a few MB of Latin text, a BPE."""
    notes = []
    latin = "It was the best of times, it was the worst of times, it was the age of wisdom.\n" * 40_000  # 3.2 MB
    (tmp_path / "en.txt").write_text(latin, encoding="utf-8")
    prep.prepare(str(tmp_path / "en.txt"), "char", str(tmp_path / "en"), log=notes.append)
    assert any(n.startswith("note: 3.2 MB of mostly Latin letters") and "--tokenizer bpe" in n for n in notes)
    for name, text in (("small", latin[:400_000]), ("cjk", "秦川雄帝宅，函谷壯皇居。綺殿千尋起，離宮百雉餘。" * 50_000)):
        notes = []
        (tmp_path / f"{name}.txt").write_text(text, encoding="utf-8")
        prep.prepare(str(tmp_path / f"{name}.txt"), "char", str(tmp_path / name), log=notes.append)
        assert not any("--tokenizer bpe" in n for n in notes), (name, notes)  # below 3 MB; Chinese characters
