"""data/tangshi/evaluate.py: a chat model's answers to held-out acrostic keys, and so its figures, are the same in
process and through serve.py's chat API (the request, the seed of each key, the sampling defaults)."""
import json
import random

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


def test_rl_scores_the_held_out_keys_as_sampled_and_checked_here(tang_chat, tmp_path):
    """rl.py's curve (its evaluation at iter 0: the starting model) equals the rewards of answers sampled here with
    generate() at evaluate.py's sampled settings and rl.py's per-key seeds: the same keys, texts and scores."""
    from data.tangshi.evaluate import DECODINGS, load
    from data.tangshi.poems import ACROSTIC, held_out_keys
    from nanogpt.generate import generate, sample_seed
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

    model, tokenizer = load(str(sft), "cpu")
    keys = held_out_keys(str(dataset), 6, cfg.seed)
    texts = []
    for j, key in enumerate(keys):
        x = torch.tensor([tokenizer.render([{"role": "user", "content": ACROSTIC + key}])[0]])
        gen = torch.Generator().manual_seed(sample_seed(cfg.seed, j))
        with torch.no_grad():
            y = generate(model, x, 40, stop=tokenizer.answer_stops, generator=gen, **DECODINGS["sampled"])
        texts.append(tokenizer.decode([t for t in y[0, x.size(1):].tolist() if t >= 0]))
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
