"""eval.py and harness.NanoGPT: lm-evaluation-harness's requests answered by a checkpoint, checked against
a numpy log-softmax over the exact token ids and against generate.py's own greedy decoding."""
import json

import numpy as np
import pytest
import torch
from lm_eval.api.instance import Instance

from conftest import CORPUS, run_script
from nanogpt.generate import generate
from nanogpt.harness import NanoGPT
from nanogpt.source import Source, load_model
from reference import next_token_log_probs

TINY_TRAIN = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=8, gradient_accumulation_steps=1,
                  eval_iters=1, eval_interval=30, log_interval=30, learning_rate=1e-2, warmup_iters=2, min_lr=1e-3,
                  max_iters=30, lr_decay_iters=30, device="cpu", compile=False)
BLOCK = TINY_TRAIN["block_size"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A char-level checkpoint trained briefly on CORPUS (block_size 16), its model and tokenizer."""
    from nanogpt.dataset import prepare
    from train import TrainConfig, train
    tmp = tmp_path_factory.mktemp("eval")
    (tmp / "input.txt").write_text(CORPUS, encoding="utf-8")
    prepare(str(tmp / "input.txt"), "char", str(tmp / "data"), 0.1, log=lambda *a: None)
    torch.manual_seed(0)
    train(TrainConfig(**TINY_TRAIN, out_dir=str(tmp / "out"), dataset=str(tmp / "data")), log=lambda *a, **k: None)
    model, tokenizer = load_model(Source(out_dir=str(tmp / "out")))
    return tmp / "out", model, tokenizer


def request(kind, *args, task="tiny"):
    return Instance(request_type=kind, doc={}, arguments=args, idx=0, metadata=(task, 0, 1))


def reference_loglikelihood(model, context, continuation):
    """Sum of the continuation's log-probs; whether each is the argmax. The input is the last BLOCK + 1 ids
    without the last, so a long context loses its beginning."""
    ids = (context + continuation)[-(BLOCK + 1):]
    lp = next_token_log_probs(model, ids[:-1])
    first = len(ids) - len(continuation)  # the continuation's first id in ids
    picked = [lp[j - 1, ids[j]] for j in range(first, len(ids))]
    return sum(picked), all(lp[j - 1].argmax() == ids[j] for j in range(first, len(ids)))


def greedy_text(model, tokenizer, prompt, n):
    out = generate(model, torch.tensor([tokenizer.encode(prompt)]), n, temperature=0.0)
    return tokenizer.decode(out[0, -n:].tolist())


def test_loglikelihood_sums_the_continuations_logprobs_and_says_if_greedy(trained):
    _, model, tok = trained
    greedy = greedy_text(model, tok, "All:\nSpeak", 6)
    pairs = [("All:\nSpeak", greedy),  # the model's own choice: greedy
             ("All:\nSpeak", ("A" if greedy[0] != "A" else "B") + greedy[1:]),  # one token off: not greedy
             ("First Citizen:\nBefore we proceed any further, hear me", " speak."),  # longer than the block
             ("A", "ll:\nResolved"), ("Speak, speak.\n\n", "First")]  # "\n\nFirst" is scored
    got = NanoGPT(model, tok, batch_size=2).loglikelihood([request("loglikelihood", c, t) for c, t in pairs])
    for (context, continuation), (logprob, is_greedy) in zip(pairs, got):
        moved = context[len(context.rstrip()):]  # lm-eval's rule: the context's trailing spaces are scored
        want, want_greedy = reference_loglikelihood(model, tok.encode(context.rstrip()), tok.encode(moved + continuation))
        assert logprob == pytest.approx(want, abs=1e-4), (context, continuation)
        assert is_greedy == want_greedy, (context, continuation)
    assert [g for _, g in got[:2]] == [True, False]


def test_loglikelihood_rolling_scores_every_token_once_in_block_windows(trained):
    """40 tokens, block 16: tokens 0-15 after the newline prefix, 16-31 after tokens 15-30, 32-39 after 23-38."""
    _, model, tok = trained
    text = CORPUS[3:43]
    t = tok.encode(text)
    prefix = tok.encode("\n")
    first = next_token_log_probs(model, prefix + t[:15])
    second = next_token_log_probs(model, t[15:31])
    third = next_token_log_probs(model, t[23:39])
    want = (sum(first[j, t[j]] for j in range(16)) + sum(second[j - 16, t[j]] for j in range(16, 32))
            + sum(third[j - 24, t[j]] for j in range(32, 40)))
    lm = NanoGPT(model, tok, batch_size=2)
    got = lm.loglikelihood_rolling([request("loglikelihood_rolling", text), request("loglikelihood_rolling", "A")])
    assert got[0] == pytest.approx(want, abs=1e-4)
    assert got[1] == pytest.approx(next_token_log_probs(model, prefix)[0, tok.encode("A")[0]], abs=1e-5)


def test_generate_until_is_greedy_text_cut_at_the_first_stop(trained):
    _, model, tok = trained
    prompts = ["First Citizen:\n", "All:\n", "All:\nSpeak", "Resolved. r", CORPUS[:40]]  # two of the same length
    greedy = [greedy_text(model, tok, p[-BLOCK:], 12) for p in prompts]
    # a stop some text meets after a character or more, and another that none meets
    stop = next(t[i] for t in greedy for i in range(1, 12) if t.find(t[i]) == i)
    args = {"until": [stop, "Zz"], "max_gen_toks": 12, "do_sample": False}
    got = NanoGPT(model, tok, batch_size=4).generate_until([request("generate_until", p, args) for p in prompts])
    want = [text[:text.find(stop)] if stop in text else text for text in greedy]
    assert got == want and any(0 < len(w) < 12 for w in want), (stop, greedy)



def test_sampled_generate_until_gives_each_row_the_text_of_its_own_seed_in_any_batch(trained):
    """do_sample at temperature 1.5: each context's text is generate's for a generator seeded by that context
    (docs/eval.md), whether decoded in a batch of four rows of one length, alone, or after other requests,
    and whatever torch's global RNG holds."""
    import zlib
    _, model, tok = trained
    prompts = ["All:\n", "First", "Speak", "You a", "Resolved. r"]  # four of one length: one batch
    args = {"until": ["Zz"], "max_gen_toks": 12, "do_sample": True, "temperature": 1.5}
    want = []
    for p in prompts:
        g = torch.Generator().manual_seed(zlib.crc32(p.encode()))
        out = generate(model, torch.tensor([tok.encode(p)]), 12, temperature=1.5, generator=g)
        want.append(tok.decode(out[0, -12:].tolist()))
    torch.manual_seed(1)
    together = NanoGPT(model, tok, batch_size=4).generate_until([request("generate_until", p, args) for p in prompts])
    torch.manual_seed(2)
    alone = NanoGPT(model, tok, batch_size=1).generate_until([request("generate_until", p, args) for p in prompts])
    reverse = NanoGPT(model, tok, batch_size=4).generate_until([request("generate_until", p, args) for p in prompts[::-1]])
    assert together == alone == reverse[::-1] == want
    assert len(set(want)) == len(want) and want != [greedy_text(model, tok, p, 12) for p in prompts]

def write_task(directory, name, docs, data_files=None):
    """A multiple-choice task YAML over a local JSONL in directory."""
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: {data_files or 'json'}\n"
        + (f"dataset_kwargs:\n  data_files:\n    test: {path}\n" if data_files is None else "")
        + "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
          "doc_to_choice: '{{choices}}'\ndoc_to_target: label\ntarget_delimiter: ''\n"
          "metric_list:\n  - metric: acc\n  - metric: acc_norm\n", encoding="utf-8")


def known_answer_docs(model, tok):
    """Each item's answer is the model's greedy next character, the others three other characters: the
    greedy one has the highest log-probability of all, so acc is 1 whatever the training did."""
    docs = []
    for context in ["First Citizen:\n", "All:\n", "All:\nSpeak", "Resolved. r", "you are all"]:
        answer = greedy_text(model, tok, context, 1)
        others = [c for c in "vAp?" if c != answer][:3]
        docs.append({"context": context, "label": 2, "choices": others[:2] + [answer] + others[2:]})
    return docs


def test_simple_evaluate_scores_a_known_answer_task(trained, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager
    out, model, tok = trained
    docs = known_answer_docs(model, tok)
    write_task(tmp_path / "tasks", "tiny_known", docs)
    want = np.mean([np.argmax([reference_loglikelihood(model, tok.encode(d["context"]), tok.encode(c))[0]
                               for c in d["choices"]]) == d["label"] for d in docs])
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    results = lm_eval.simple_evaluate("nanogpt", model_args={"out_dir": str(out)}, device="cpu", batch_size=3,
                                      tasks=["tiny_known"], task_manager=manager, log_samples=False)  # by its name
    assert results["results"]["tiny_known"]["acc,none"] == want == 1.0


def test_eval_script_prints_the_table_and_writes_the_results(trained, tmp_path):
    out, model, tok = trained
    write_task(tmp_path / "tasks", "tiny_known", known_answer_docs(model, tok))
    result = run_script(["eval.py", f"--out_dir={out}", "--tasks=tiny_known", f"--include_path={tmp_path / 'tasks'}",
                         "--device=cpu", f"--output_path={tmp_path / 'r.json'}", "--limit=3"])
    assert result.returncode == 0, result.stderr
    assert "|tiny_known|" in result.stdout.replace(" ", "") and "acc_norm" in result.stdout
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["results"]["tiny_known"]["acc,none"] == 1.0 and saved["n-samples"]["tiny_known"]["effective"] == 3


def test_eval_script_names_characters_outside_the_vocabulary_in_one_line(trained, tmp_path):
    out, _, _ = trained
    write_task(tmp_path / "tasks", "tiny_tang", [{"context": "床前明月光，", "label": 0, "choices": ["疑是地上霜。", "AAAAAA"]},
                                                 {"context": "A", "label": 0, "choices": ["舉頭望明月", "B"]}])
    result = run_script(["eval.py", f"--out_dir={out}", "--tasks=tiny_tang", f"--include_path={tmp_path / 'tasks'}",
                         "--device=cpu", f"--output_path={tmp_path / 'r.json'}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: task tiny_tang: its text has 15 characters") and all(
        repr(c) in line for c in "床前明月光疑是地上霜，。舉頭望")  # every item's
    assert not (tmp_path / "r.json").exists()


def test_eval_script_offline_says_which_data_could_not_be_fetched(trained, tmp_path):
    out, _, _ = trained
    write_task(tmp_path / "tasks", "tiny_hub", [], data_files="nanogpt-tests/no-such-dataset")
    result = run_script(["eval.py", f"--out_dir={out}", "--tasks=tiny_hub", f"--include_path={tmp_path / 'tasks'}",
                         "--device=cpu"], env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "could not be fetched" in result.stderr and "nanogpt-tests/no-such-dataset" in result.stderr


def test_eval_script_without_the_network_says_at_once_which_data_could_not_be_fetched(trained, tmp_path):
    """No HF_HUB_OFFLINE, no network, an empty cache: one line naming the Hub dataset, no retries before it
    (datasets retries each download for half a minute)."""
    from test_interop import NO_NETWORK
    out, _, _ = trained
    write_task(tmp_path / "tasks", "tiny_hub", [], data_files="Rowan/hellaswag")
    result = run_script(["eval.py", f"--out_dir={out}", "--tasks=tiny_hub", f"--include_path={tmp_path / 'tasks'}",
                         "--device=cpu"], env={**NO_NETWORK, "HF_HOME": str(tmp_path / "empty-cache")})
    errors = [line for line in result.stderr.splitlines() if not line.startswith(("override: ", "[Task: tiny_hub]"))]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert errors[0].startswith("error: a task's data could not be fetched from the Hugging Face Hub") and (
        "'Rowan/hellaswag'" in errors[0] and "HF_HOME" in errors[0])


def test_eval_gpt2_without_the_network_names_the_weights_before_indexing_tasks(tmp_path):
    """--init_from=gpt2 offline, not cached: one line naming the weights and both ways out, before lm-eval
    indexes its own tasks (which would have refused the unknown name first, half a minute later)."""
    from test_interop import NO_NETWORK
    result = run_script(["eval.py", "--init_from=gpt2", "--tasks=hellaswag,no_such_task", "--device=cpu",
                         f"--output_path={tmp_path / 'r.json'}"],
                        env={**NO_NETWORK, "HF_HOME": str(tmp_path / "empty-cache")})
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert errors[0].startswith("error: cannot load GPT-2 weights 'gpt2'") and (
        "--init_from=DIR" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0])


def poems(tag, n):
    """n poems of title, author and four lines; line k of poem i is tag-marked and k + 5 characters long."""
    return "".join(f"{tag}題{i}\n作者{i}\n" + "".join(f"{tag}{i:03d}" + "字" * k + "。\n" for k in range(4)) + "\n"
                   for i in range(n))


def test_next_line_items_come_from_the_val_split_with_distractors_of_the_answers_length(tmp_path):
    from tasks.prepare import make_items, val_text
    raw = tmp_path / "input.txt"
    raw.write_text(poems("訓", 90) + poems("驗", 12), encoding="utf-8")  # the last poems are the last 10%
    text = val_text("tangshi", str(raw))
    items = make_items(text, 2, seed=1, max_items=100)
    assert items == make_items(text, 2, seed=1, max_items=100) and 8 <= len(items) <= 11
    for item in items:
        answer = item["choices"][item["label"]]
        title, author, *lines = item["context"].splitlines()
        poem = int(title[2:])
        assert answer == f"驗{poem:03d}" + "字" * len(lines) + "。"  # the true next line
        assert {len(c) for c in item["choices"]} == {len(answer)} and len(set(item["choices"])) == 4
        assert all(c.startswith("驗") and int(c[1:4]) != poem for c in item["choices"] if c != answer)
    assert "訓" not in "".join(json.dumps(item, ensure_ascii=False) for item in items)


def test_ctrl_c_during_scoring_is_one_line_and_writes_no_results(trained, tmp_path, monkeypatch, capsys):
    from eval import main as eval_main
    from nanogpt.program import run_main
    out, model, tok = trained
    write_task(tmp_path / "tasks", "tiny_known", known_answer_docs(model, tok))

    def interrupted(self, requests, disable_tqdm=False):
        raise KeyboardInterrupt
    monkeypatch.setattr(NanoGPT, "_loglikelihood_tokens", interrupted)
    monkeypatch.setattr("eval.read_caches_if_offline", lambda: None)  # offline it would stay set for later tests
    with pytest.raises(SystemExit) as exit_:
        run_main(eval_main, [f"--out_dir={out}", "--tasks=tiny_known", f"--include_path={tmp_path / 'tasks'}",
                             "--device=cpu", f"--output_path={tmp_path / 'r.json'}"])
    assert exit_.value.code == 130 and capsys.readouterr().err.strip().splitlines()[-1] == "interrupted"
    assert list(tmp_path.glob("r.json*")) == []


def test_unknown_task_names_the_nearest_or_says_ours_need_the_include_path():
    from configurator import UserError
    from nanogpt.harness import check_names
    with pytest.raises(UserError, match="unknown task 'tangshi_next_lin' \\(did you mean 'tangshi_next_line'\\?\\)"):
        check_names(["hellaswag", "tangshi_next_lin"], {"hellaswag", "tangshi_next_line"}, "tasks")
    with pytest.raises(UserError, match="unknown task 'shakespeare_next_line'; ours need --include_path=tasks"):
        check_names(["shakespeare_next_line"], {"hellaswag"}, None)
    check_names(["hellaswag"], {"hellaswag"}, None)


def test_a_next_line_task_without_its_data_says_how_to_build_it(tmp_path, monkeypatch):
    import tasks.prepare
    from configurator import UserError
    monkeypatch.setattr(tasks.prepare, "DATA", str(tmp_path))
    with pytest.raises(UserError, match="tangshi_next_line.jsonl not found; run python tasks/prepare.py"):
        tasks.prepare.load("tangshi_next_line", version=1.0)
    tasks.prepare.write_jsonl([{"context": "a\n", "choices": ["b", "c"], "label": 1}], str(tmp_path / "x.jsonl"))
    assert tasks.prepare.load("x", version=1.0)["test"][0] == {"context": "a\n", "choices": ["b", "c"], "label": 1}


# --- tangshi_acrostic: a generate_until task for a chat model --------------------------------------------

QUATRAIN = "春眠不覺曉，處處聞啼鳥。\n夜來風雨聲，花落知多少。"  # 孟浩然's 春曉, a 五言絕句


def test_the_acrostic_metric_is_poems_pys_rule():
    from tasks.acrostic import process_results
    assert process_results({"key": "春處夜花"}, [QUATRAIN]) == {"hits": 1.0, "one_length": 1.0, "whole": 1.0}
    assert process_results({"key": "春江花月"}, [QUATRAIN]) == {"hits": 0.25, "one_length": 1.0, "whole": 1.0}
    assert process_results({"key": "春江花月"}, ["春風，江水長流。"]) == {"hits": 0.5, "one_length": 0.0, "whole": 0.0}


def test_acrostic_requests_are_the_keys_of_the_val_splits_regular_poems(tmp_path):
    from tasks.prepare import acrostic_items, val_text
    raw = tmp_path / "input.txt"
    train, val = "訓題\n作者\n" + QUATRAIN.replace("春", "秋") + "\n\n", "驗題\n作者\n" + QUATRAIN + "\n\n"
    raw.write_text(train * 90 + val * 6 + "亂題\n作者\n春風，江水長流。\n\n" + val * 6, encoding="utf-8")  # 10%: 驗
    items = acrostic_items(val_text("tangshi", str(raw)), seed=1, max_items=10)
    assert items == [{"request": "藏頭詩：春處夜花", "key": "春處夜花"}]  # one key, once; the irregular poem none


def test_lm_eval_local_chat_completions_scores_the_acrostic_task(tmp_path):
    """lm_eval's local-chat-completions with apply_chat_template runs tangshi_acrostic against serve.py: each
    answer is the model's greedy reply to "藏頭詩：XXXX", and each metric the mean of poems.py's scores of them."""
    import shutil

    import lm_eval
    from lm_eval.tasks import TaskManager

    import serve
    from conftest import ROOT
    from data.tangshi.poems import score_acrostic
    from model import GPTConfig
    from nanogpt.tokenizer import CharTokenizer, ChatTokenizer
    from test_generate import sharp
    tasks = tmp_path / "tasks"
    (tasks / "data").mkdir(parents=True)
    for name in ("tangshi_acrostic.yaml", "prepare.py", "acrostic.py"):
        shutil.copy(f"{ROOT}/tasks/{name}", tasks / name)
    keys = ["春處夜花", "江花月夜"]
    (tasks / "data" / "tangshi_acrostic.jsonl").write_text(
        "".join(json.dumps({"request": "藏頭詩：" + k, "key": k}, ensure_ascii=False) + "\n" for k in keys))
    tok = ChatTokenizer(CharTokenizer(sorted(set(QUATRAIN + "藏頭詩：江月"))))
    model = sharp(GPTConfig(block_size=64, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32)).float().eval()
    service = serve.Service(model, tok, "tiny-tang", torch.device("cpu"), torch.float32, max_batch=2, max_queue=4)
    with serve.running(service.app()) as url:
        results = lm_eval.simple_evaluate(
            model="local-chat-completions", model_args={"base_url": f"{url}/v1/chat/completions",
                                                        "model": "tiny-tang"},
            tasks=["tangshi_acrostic"], task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
            apply_chat_template=True, log_samples=True)
    samples = sorted(results["samples"]["tangshi_acrostic"], key=lambda s: s["doc_id"])
    for key, sample in zip(keys, samples):
        ids = tok.render([{"role": "user", "content": "藏頭詩：" + key}])[0]
        out = generate(model, torch.tensor([ids]), 80, temperature=0.0, stop=tok.answer_stops)[0, len(ids):]
        assert sample["resps"] == [[tok.decode([t for t in out.tolist() if t >= 0]).split("\n\n")[0]]]
    scores = [score_acrostic(k, s["resps"][0][0]) for k, s in zip(keys, samples)]
    got = results["results"]["tangshi_acrostic"]
    assert got["hits,none"] == pytest.approx(sum(s["hits"] / 4 for s in scores) / 2)
    assert got["whole,none"] == sum(s["whole"] for s in scores) / 2
