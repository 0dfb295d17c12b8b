"""trace.py records the real model's stages; each check below recomputes a stage independently."""
import math
from dataclasses import replace
from html.parser import HTMLParser
from trace import TraceConfig, build_trace, print_trace, render_html

import pytest
import torch

from conftest import run_script
from model import GPT
from nanogpt.generate import generate
from nanogpt.tokenizer import GPT2BPE, CharTokenizer
from test_model_options import OPTIONS, perturbed

CHARS = CharTokenizer(sorted(set("Cats sit on the mat. ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz,;:!?'\n-")))


def traced(config, **kw):
    model = perturbed(replace(config, vocab_size=CHARS.vocab_size))
    cfg = TraceConfig(start="Cats sit on", **kw)
    return model, build_trace(model, CHARS, cfg, torch.device("cpu")), cfg


def stage(result, name, layer=0):
    return next(s for s in result["layers"][layer]["stages"] if s["name"] == name)


def as_tensor(values):
    return torch.tensor([[float("-inf") if v == "-inf" else v for v in row] for row in values])


@pytest.mark.parametrize("option", OPTIONS)
def test_weights_recomputed_from_traced_q_and_k_match(tiny_config, option):
    model, result, _ = traced(replace(tiny_config, **OPTIONS[option]))
    c = model.config
    q = stage(result, "q")
    k = stage(result, "k")
    weights = stage(result, "attention weights")
    T = len(result["tokens"])
    for h, qh, kh, wh in zip(q["heads"], q["values"], k["values"], weights["values"]):
        scores = torch.tensor(qh) @ torch.tensor(kh).T / math.sqrt(c.head_dim)
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        w = torch.tensor(wh)
        torch.testing.assert_close(torch.softmax(scores, -1), w, atol=1e-5, rtol=0)
        torch.testing.assert_close(w.sum(-1), torch.ones(T), atol=1e-5, rtol=0)
        assert torch.all(w.triu(1) == 0)
        assert all(v == "-inf" for t in range(T) for v in stage(result, "masked scores")["values"][h][t][t + 1:])
    assert k["heads"] == [h // (c.n_head // c.kv_heads) for h in range(c.n_head)]


def test_rope_is_traced_before_and_after(tiny_config):
    _, result, _ = traced(replace(tiny_config, pos_emb="rope"))
    before, after = stage(result, "q before RoPE")["values"][0], stage(result, "q after RoPE")["values"][0]
    assert before[0] == pytest.approx(after[0], abs=1e-6)  # position 0 is not rotated
    assert before[3] != pytest.approx(after[3], abs=1e-3)
    assert stage(result, "q")["values"][0] == after


def test_merged_channels_map_to_heads_and_logits_equal_the_model(tiny_config):
    model, result, _ = traced(tiny_config)
    merged = torch.tensor(stage(result, "merged heads")["values"])  # (T, C)
    heads = torch.tensor(stage(result, "head outputs")["values"])  # (H, T, D)
    D = model.config.head_dim
    for entry in stage(result, "merged heads")["channel_map"]:
        c, h, r = entry["channel"], entry["head"], entry["r"]
        assert (h, r) == (c // D, c % D)
        torch.testing.assert_close(merged[:, c], heads[h, :, r])
    idx = torch.tensor([result["ids"]])
    with torch.no_grad():
        expected, _ = model(idx)  # the sdpa path, untouched by tracing
    torch.testing.assert_close(result["logits"], expected, atol=1e-5, rtol=0)
    final = torch.tensor(result["final norm"]["values"])
    torch.testing.assert_close(final @ model.lm_head.weight.T, expected[0], atol=1e-5, rtol=0)
    resid = torch.tensor(stage(result, "residual 1 (input + attention)")["values"])
    block_in = torch.tensor(stage(result, "block input")["values"])
    proj = torch.tensor(stage(result, "attention projection")["values"])
    torch.testing.assert_close(resid, block_in + proj)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generation_trace_chooses_what_generate_chooses(tiny_config, temperature):
    model, result, cfg = traced(tiny_config, steps=5, temperature=temperature, top_k=10, top_p=0.9, seed=3)
    expected = generate(model, torch.tensor([result["ids"]]), 5, temperature, 10, 0.9,
                              generator=torch.Generator().manual_seed(3))
    assert [s["chosen"]["id"] for s in result["generation"]] == expected[0, len(result["ids"]):].tolist()
    for step in result["generation"]:
        assert step["greedy"] == (temperature == 0)
        assert step["candidates_kept"] <= 10
        probs = [c["prob"] for c in step["candidates"]]
        assert probs == sorted(probs, reverse=True)


def test_bpe_model_traces_with_token_text():
    from model import GPTConfig
    model = GPT(GPTConfig(block_size=16, vocab_size=50257, n_layer=1, n_head=2, n_embd=16)).eval()
    result = build_trace(model, GPT2BPE(), TraceConfig(start="Cats sit on", steps=1), torch.device("cpu"))
    assert result["tokens"] == ["C", "ats", " sit", " on"]  # GPT-2 BPE splits "Cats"


def test_html_has_one_heatmap_per_traced_head(tiny_config):
    _, result, cfg = traced(tiny_config, layer=1)
    page = render_html(result, cfg)

    class Counter(HTMLParser):
        tables, scripts, external = [], 0, 0

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "table":
                self.tables.append(attrs.get("class", ""))
            if tag == "script":
                Counter.scripts += 1
                Counter.external += "src" in attrs
    parser = Counter()
    parser.feed(page)
    parser.close()
    assert parser.tables.count("heatmap weights") == tiny_config.n_head  # one heatmap per traced head
    assert parser.tables.count("heatmap raw") == tiny_config.n_head  # the switch: scores before the mask
    assert parser.tables.count("heatmap masked") == tiny_config.n_head  # and after it
    assert page.count("-inf") >= tiny_config.n_head * 11 * 10 // 2  # every masked table shows the upper triangle
    assert Counter.external == 0 and "http" not in page


@pytest.mark.parametrize("args, message", [(["--layer=9"], "--layer=9 is out of range: the model has 2 layers"),
                                           (["--head=-1"], "--head=-1 is out of range"),
                                           (["--start="], "the prompt is empty")])
def test_bad_arguments_are_one_line_errors(tmp_path, char_dataset, args, message):
    from train import TrainConfig, train
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32,
                      block_size=16, batch_size=4, gradient_accumulation_steps=1, eval_iters=1, max_iters=1,
                      eval_interval=1, device="cpu")
    train(cfg, log=lambda *a: None)
    result = run_script(["trace.py", f"--out_dir={tmp_path / 'out'}", "--start=First"] + args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [(["--steps=-1"], "steps must be >= 0, got -1"),
                                           (["--precision=-3"], "precision must be in [0, 17] (digits after the point), got -3"),
                                           (["--top=0"], "top must be >= 1, got 0"),
                                           (["--temperature=-1"], "temperature must be a finite number >= 0")])
def test_bad_settings_are_one_line_errors_before_any_loading(tmp_path, args, message):
    result = run_script(["trace.py", f"--out_dir={tmp_path / 'none'}"] + args)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr


def test_each_step_says_how_long_a_run_of_training_text_its_token_extends(tmp_path):
    """A training text holding characters 2-25 of prompt and sampled text: each step's run is the longest suffix
    a brute-force search finds in it, and counts as copied from 25 characters (Latin) on, not before."""
    from conftest import CORPUS
    from model import GPTConfig
    from nanogpt.copies import Training
    from test_copies import char_dataset
    chars = sorted(set(CORPUS))
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=len(chars), n_layer=2, n_head=4, n_embd=32)).eval()
    with torch.no_grad():  # every weight drawn wide: varied samples
        for p in model.parameters():
            p.normal_(0, 0.5)
    cfg = TraceConfig(start="First Citizen:", steps=30, temperature=1.0, seed=3)
    generated = build_trace(model, CharTokenizer(chars), cfg, torch.device("cpu"))["generated"]
    text = cfg.start + CharTokenizer(chars).decode(generated)
    train = CORPUS + "\n" + text[2:len(cfg.start) + 20] + "\n"
    training = Training(char_dataset(tmp_path / "d", train, chars=chars))
    result = build_trace(model, CharTokenizer(chars), cfg, torch.device("cpu"), training)
    assert result["generated"] == generated and len(set(text[len(cfg.start):])) > 5, text
    runs = [max(n for n in range(end + 1) if text[end - n:end] in train)
            for end in range(len(cfg.start) + 1, len(text) + 1)]
    assert [s["copy"]["length"] for s in result["generation"]] == runs
    assert [s["copy"]["copied"] for s in result["generation"]] == [n >= 25 for n in runs]
    assert any(n >= 25 for n in runs) and any(0 < n < 25 for n in runs)  # the data holds both sides of k
    lines = []
    print_trace(result, cfg, lines.append)
    assert sum("extends a copied span" in line for line in lines) == sum(n >= 25 for n in runs)
