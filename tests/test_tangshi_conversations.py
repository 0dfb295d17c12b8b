"""data/tangshi/conversations.py's acrostics of drawn keys: real poems whose 句 begin with drawn characters of
the train split, the rarer ones more often, so that the fine-tuned model copies keys it seldom saw."""
import collections
import json

import pytest

from conftest import run_script
from data.prepare import prepare
from data.tangshi.poems import ACROSTIC, clauses, conversations, drawn_acrostics, parse_poems, split_text
from nanogpt.errors import UserError
from test_tangshi_evaluate import poems

TEXT = poems(40)


def test_a_drawn_acrostic_is_a_poem_of_the_corpus_with_its_key_at_each_start():
    drawn = drawn_acrostics(parse_poems(TEXT), TEXT, 200, seed=3)
    bodies = {"\n".join(lines) for _, _, lines in parse_poems(TEXT)}
    for chat in drawn:
        request, answer = (m["content"] for m in chat["messages"])
        key = request.removeprefix(ACROSTIC)
        parts = clauses(answer)
        assert request.startswith(ACROSTIC) and len(key) == len(parts) == 4
        assert [c[0] for c in parts] == list(key)
        starts = {0} | {i + 1 for i, ch in enumerate(answer) if ch in "，。？！；\n"}
        # the answer is a poem of the corpus but for the first character of each 句
        assert any(len(b) == len(answer) and all(b[i] == answer[i] for i in range(len(b)) if i not in starts)
                   for b in bodies)
    assert len({c["messages"][0]["content"] for c in drawn}) > 150  # keys differ from one to the next
    assert drawn == drawn_acrostics(parse_poems(TEXT), TEXT, 200, seed=3) != drawn_acrostics(
        parse_poems(TEXT), TEXT, 200, seed=4)


def test_keys_are_drawn_from_the_text_given_the_rarer_characters_more_often():
    # 秦 400 times, 川 4 times: weights 400 ** -0.5 and 4 ** -0.5, so 川 is drawn 10 times as often as 秦;
    # 雄 is in the poems but not in the text, and punctuation and □ are never keys
    text = "秦" * 400 + "川" * 4 + "，。□\n"
    keys = "".join(c["messages"][0]["content"].removeprefix(ACROSTIC)
                   for c in drawn_acrostics(parse_poems(TEXT), text, 2000, seed=0))
    counts = collections.Counter(keys)
    assert set(counts) == {"秦", "川"}
    assert 8 < counts["川"] / counts["秦"] < 12.5  # 10 expected; 1 if drawn evenly, 0.1 if by count


def test_no_regular_poem_to_draw_into_is_one_line():
    with pytest.raises(UserError, match="give --drawn=0"):
        drawn_acrostics(parse_poems("題\n無名\n秦川雄帝宅。\n"), "秦川", 5, seed=0)
    assert drawn_acrostics([], "", 0, seed=0) == []


def test_conversations_writes_the_drawn_acrostics_beside_the_poems(tmp_path):
    (tmp_path / "input.txt").write_text(TEXT, encoding="utf-8")
    prepare(str(tmp_path / "input.txt"), "char", str(tmp_path / "data"), 0.1, log=lambda *a: None)
    real = conversations(parse_poems(split_text(str(tmp_path / "data"), "train")))
    result = run_script(["data/tangshi/conversations.py", f"--dataset={tmp_path / 'data'}",
                         f"--out={tmp_path / 'chat'}", "--drawn=30"])
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == len(real) + 30 and all(c in lines for c in real)
    assert "(30 of them acrostics of drawn keys)" in result.stdout
    refused = run_script(["data/tangshi/conversations.py", f"--dataset={tmp_path / 'data'}", "--drawn=-1"])
    assert refused.returncode == 2 and "--drawn must be 0 or more, got -1" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_draw_seed_chooses_the_drawn_acrostics(tmp_path):
    """--draw_seed alone changes which keys and poems are drawn: the same seed twice writes the same
    chat.jsonl, another seed other drawn conversations (and the poems' own conversations all the same)."""
    from data.tangshi import conversations as program
    (tmp_path / "input.txt").write_text(TEXT, encoding="utf-8")
    prepare(str(tmp_path / "input.txt"), "char", str(tmp_path / "data"), 0.1, log=lambda *a: None)
    real = conversations(parse_poems(split_text(str(tmp_path / "data"), "train")))

    def drawn(draw_seed):
        program.main([f"--dataset={tmp_path / 'data'}", f"--out={tmp_path / 'chat'}", "--drawn=30",
                      f"--draw_seed={draw_seed}"])
        lines = (tmp_path / "data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
        chats = [json.loads(line) for line in lines]
        return sorted(json.dumps(c, ensure_ascii=False) for c in chats if c not in real)
    first, again, other = drawn(1), drawn(1), drawn(2)
    assert len(first) == 30 and first == again and len(set(first) & set(other)) < 5
