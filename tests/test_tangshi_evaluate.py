"""data/tangshi/evaluate.py: a chat model's answers to held-out acrostic keys, and so its figures, are the same in
process and through serve.py's chat API (the request, the seed of each key, the sampling defaults)."""
import json
import os
import random

import numpy as np
import pytest
import torch

from conftest import run_script
from data.prepare import prepare
from data.tangshi.evaluate import evaluate
from data.tangshi.poems import held_out_poems
from model import GPT, GPTConfig
from nanogpt.checkpoint import model_args
from nanogpt.tokenizer import chat_meta, read_meta

CHARS = "秦川雄帝宅函谷壯皇居綺殿千尋起離宮百雉餘連甍遙接漢飛觀迥凌虛雲日隱層闕風煙出綺疏"


def poems(n, seed=0):
    """n regular poems (title, author, two lines of two 五言 句) with keys that differ: the corpus's layout."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        chunks = ["".join(rng.choice(CHARS) for _ in range(5)) for _ in range(4)]
        out.append(f"藏頭詩：題{CHARS[i % len(CHARS)]}\n無名\n{chunks[0]}，{chunks[1]}。\n{chunks[2]}，{chunks[3]}。\n")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def tang_chat(tmp_path_factory):
    """(dataset, out_dir): poems prepared as characters, and a chat model of random weights on their tokenizer."""
    root = tmp_path_factory.mktemp("tang")
    (root / "input.txt").write_text(poems(120), encoding="utf-8")
    prepare(str(root / "input.txt"), "char", str(root / "data"), 0.1, log=lambda *a: None)
    meta = chat_meta(read_meta(str(root / "data")))
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=128, vocab_size=meta["vocab_size"], n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():  # every parameter random: the answers then depend on every weight
        for p in model.parameters():
            p.normal_(0, 0.5)
    (root / "sft").mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "iter_num": 0, "config": {},
                "tokenizer": meta}, root / "sft" / "ckpt.pt")
    return root / "data", root / "sft"


@pytest.mark.parametrize("decoding", ["greedy", "sampled"])
def test_a_served_chat_model_answers_the_evaluation_as_in_process(tang_chat, decoding):
    from serve import ServeConfig, Service
    from test_serve import running
    dataset, out_dir = tang_chat
    keys = [k for k, _ in held_out_poems(str(dataset), 6, 1337)]
    row, texts = evaluate(str(out_dir), keys, decoding, seed=7)
    service = Service.load(ServeConfig(out_dir=str(out_dir), device="cpu", max_batch=4, max_queue=8))
    with running(service.app()) as url:
        served, served_texts = evaluate(url + "/v1", keys, decoding, seed=7)
    assert served_texts == texts and len(set(texts)) > 1  # the answers follow the keys, the same both ways
    assert served["model"] == f"sft at {url}/v1" and {**served, "model": row["model"]} == row


def test_evaluate_names_a_server_it_cannot_reach(tang_chat):
    dataset, _ = tang_chat
    result = run_script(["data/tangshi/evaluate.py", "--out_dir=http://127.0.0.1:9/v1", f"--dataset={dataset}",
                         "--keys=2"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot reach http://127.0.0.1:9/v1" in result.stderr and "python serve.py" in result.stderr


def rl_eval_answers(sft, keys, seed, max_new_tokens=40):
    """The answers rl.py's evaluation samples for keys: evaluate.py's sampled settings, rl.py's per-key seeds."""
    from data.tangshi.evaluate import DECODINGS, load
    from data.tangshi.poems import ACROSTIC
    from nanogpt.generate import generate, sample_seed
    model, tokenizer = load(str(sft), "cpu")
    texts = []
    for j, key in enumerate(keys):
        x = torch.tensor([tokenizer.render([{"role": "user", "content": ACROSTIC + key}])[0]])
        gen = torch.Generator().manual_seed(sample_seed(seed, j))
        with torch.no_grad():
            y = generate(model, x, max_new_tokens, stop=tokenizer.answer_stops, generator=gen, **DECODINGS["sampled"])
        texts.append(tokenizer.decode([t for t in y[0, x.size(1):].tolist() if t >= 0]))
    return texts


def test_rl_scores_the_held_out_keys_as_sampled_and_checked_here(tang_chat, tmp_path):
    """rl.py's curve (its evaluation at iter 0: the starting model) equals the rewards of answers sampled here with
    generate() at evaluate.py's sampled settings and rl.py's per-key seeds: the same keys, texts and scores."""
    from data.tangshi.poems import ACROSTIC, held_out_keys
    from nanogpt.rewards import REGISTRY
    from rl import RLConfig, rl
    dataset, sft = tang_chat
    cfg = RLConfig(init_from=str(sft), out_dir=str(tmp_path / "rl"), dataset=str(dataset), eval_keys=6,
                   max_iters=1, batch_size=2, samples=2, max_new_tokens=40, eval_interval=50, learning_rate=0.05)
    summary = rl(cfg, log=lambda *a, **k: None)
    logged = [json.loads(line) for line in (tmp_path / "rl" / "log.jsonl").read_text().splitlines()]
    first = next(r for r in logged if r["kind"] == "rl_eval" and r["iter"] == 0)
    last = next(r for r in logged if r["kind"] == "rl_eval" and r["iter"] == 1)
    rates = [{k: v for k, v in r.items() if k not in ("kind", "iter")} for r in (first, last)]
    assert rates[1] != rates[0] and summary["held_out"] == rates[1]  # the step's effect is what main() prints

    keys = held_out_keys(str(dataset), 6, cfg.seed)
    texts = rl_eval_answers(sft, keys, cfg.seed)
    assert len(set(texts)) > 1
    for name in ("acrostic", "form", "rhyme", "tone", "guard"):
        scores = [REGISTRY[name].fn(ACROSTIC + k, t) for k, t in zip(keys, texts)]
        assert first[name] == pytest.approx(sum(scores) / len(scores)), name
        assert first[f"{name}_pass"] == pytest.approx(sum(s == 1 for s in scores) / len(scores)), name


def test_misses_are_counted_by_how_often_the_key_character_occurs_in_train():
    import collections
    from data.tangshi.evaluate import missed_by_count
    counts = collections.Counter({"春": 1200, "江": 5, "花": 60, "月": 300, "風": 10, "雨": 9})
    keys = ["春江花月", "春風", "粔"]  # 粔: in no train text (count 0)
    texts = ["春水，江流。\n草色，月明。", "夏雨", "粔雨，"]  # 花 missed; 春 missed and 風 has no 句
    assert missed_by_count(keys, texts, counts) == {"under 10": [0, 2], "10-49": [1, 1], "50-199": [1, 1],
                                                    "200-999": [0, 1], "1,000+": [1, 2]}


def test_copied_is_each_answers_share_in_spans_of_the_train_split_and_the_held_out_poems_are_the_baseline(tmp_path):
    """Held-out poems whose first line is a train poem's (12 characters, a copy) and whose others are new, 2 or 4
    lines (so a mean over poems differs from a share of all their characters): the held-out row's copied share
    is the mean over poems of a brute-force search's share, and main prints it."""
    from data.tangshi.poems import split_text
    from test_copies import brute_force_spans
    blocks, rng = poems(120).split("\n\n"), random.Random(1)
    for i in range(100, 120):  # the val split is the last 10%: these poems recite a line each, half are 律詩
        lines = blocks[i].split("\n")
        more = ["".join(rng.choice(CHARS) for _ in range(5)) for _ in range(4)] if i % 2 else []
        more = [f"{more[0]}，{more[1]}。", f"{more[2]}，{more[3]}。"] if more else []
        blocks[i] = "\n".join(lines[:2] + [blocks[i - 100].split("\n")[2]] + lines[3:4] + more + lines[4:])
    (tmp_path / "input.txt").write_text("\n\n".join(blocks), encoding="utf-8")
    prepare(str(tmp_path / "input.txt"), "char", str(tmp_path / "data"), 0.1, log=lambda *a: None)
    train, held_out = split_text(str(tmp_path / "data"), "train"), held_out_poems(str(tmp_path / "data"), 5, 1337)

    def share(text):
        covered = {i for a, b in brute_force_spans(text, train) for i in range(a, b)}
        return len(covered) / len(text)
    expected = sum(share(p) for _, p in held_out) / len(held_out)
    assert {len(p.split("\n")) for _, p in held_out} == {2, 4} and 0.2 < expected < 0.6
    model = GPT(GPTConfig(block_size=64, vocab_size=read_meta(str(tmp_path / "data"))["vocab_size"], n_layer=1,
                          n_head=1, n_embd=8))
    (tmp_path / "out").mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "iter_num": 0, "config": {},
                "tokenizer": read_meta(str(tmp_path / "data"))}, tmp_path / "out" / "ckpt.pt")
    out = run_script(["data/tangshi/evaluate.py", f"--out_dir={tmp_path / 'out'}", f"--dataset={tmp_path / 'data'}",
                      "--keys=5", "--decoding=greedy", f"--log={tmp_path / 'rows.jsonl'}"])
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert rows[0]["model"] == "held-out poems" and rows[0]["copied"] == pytest.approx(expected)
    header, human = [next(line for line in out.stdout.splitlines() if line.startswith(start))
                     for start in ("| model | decoding | 句", "| held-out poems |")]
    column = header.split(" | ").index("copied")
    assert "copied" in rows[1] and human.split(" | ")[column] == f"{expected:.1%}"


def test_rl_evaluation_copied_is_the_share_of_its_answers_found_in_the_train_split(tang_chat, tmp_path):
    """The train split with the answers rl.py's evaluation will sample appended, every other one (its index left
    to be rebuilt): the logged copied share is the mean of a brute-force search's share of each answer, about half."""
    import shutil

    from data.tangshi.poems import held_out_keys, split_text
    from nanogpt.copies import INDEX_FILE
    from nanogpt.tokenizer import tokenizer_from_meta
    from rl import RLConfig, rl
    from test_copies import brute_force_spans
    dataset, sft = tang_chat
    keys = held_out_keys(str(dataset), 6, 1337)
    texts = rl_eval_answers(sft, keys, 1337)
    shutil.copytree(dataset, tmp_path / "data")
    os.remove(tmp_path / "data" / INDEX_FILE)  # a missing index is built on first use
    tokenizer = tokenizer_from_meta(read_meta(str(tmp_path / "data")))
    with open(tmp_path / "data" / "train.bin", "ab") as f:
        f.write(np.array(tokenizer.encode("".join(f"\n{t}\n" for t in texts[::2])), np.uint16).tobytes())
    train = split_text(str(tmp_path / "data"), "train")

    def share(text):
        covered = {i for a, b in brute_force_spans(text, train) for i in range(a, b)}
        return len(covered) / max(len(text), 1)
    expected = sum(map(share, texts)) / len(texts)
    assert 0.3 < expected < 0.7, texts  # the recited half, and little of the rest
    rl(RLConfig(init_from=str(sft), out_dir=str(tmp_path / "rl"), dataset=str(tmp_path / "data"), eval_keys=6,
                max_iters=1, batch_size=2, samples=2, max_new_tokens=40, eval_interval=50), log=lambda *a, **k: None)
    logged = [json.loads(line) for line in (tmp_path / "rl" / "log.jsonl").read_text().splitlines()]
    assert next(r for r in logged if r["kind"] == "rl_eval" and r["iter"] == 0)["copied"] == pytest.approx(expected)
