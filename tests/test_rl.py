"""rl.py and nanogpt/policy_gradient.py on a tiny chat model: the estimator's pieces against independent values, the
engine's samples against generate.py's, learning a reward in a few steps, exact resume, and bad input."""
import json
import math
import re

import pytest
import torch

from conftest import run_script
from model import GPT, GPTConfig
from nanogpt.checkpoint import load_checkpoint, model_args
from nanogpt.errors import UserError
from nanogpt.generate import generate
from nanogpt.policy_gradient import advantages, answer_batch, pg_loss, sample_answers, token_log_probs
from nanogpt.tokenizer import chat_meta, tokenizer_from_meta
from plot import draw_rewards, read_rewards
from reference import next_token_log_probs
from rl import RLConfig, learning_rate, rl

CHARS = list("ab.\n sy")
META = chat_meta({"tokenizer": "char", "chars": CHARS, "vocab_size": len(CHARS)})
# reward: the share of a's in the answer (a model learns it in a few steps)
REWARD_FILE = ("from nanogpt.rewards import reward\n\n@reward('many_a')\ndef many_a(request, answer):\n"
               "    return answer.count('a') / len(answer) if answer else 0.0\n")
QUICK = dict(batch_size=4, samples=4, max_new_tokens=6, learning_rate=3e-3, eval_keys=0, reward="many_a",
             eval_interval=100, log_interval=1)


def quiet(*args, **kwargs):
    pass


def tiny_model(seed=0, block_size=32):
    torch.manual_seed(seed)
    config = GPTConfig(block_size=block_size, vocab_size=len(CHARS) + 4, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    return GPT(config)


@pytest.fixture
def start(tmp_path):
    """A tiny chat checkpoint (random weights, the role tokens), a prompts file and a reward file."""
    model = tiny_model()
    path = tmp_path / "sft"
    path.mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "iter_num": 0,
                "config": {}, "tokenizer": META}, path / "ckpt.pt")
    (tmp_path / "prompts.txt").write_text("say ab\nsay ba\nsay aa\nsay bb\nsay a\nsay b\n")
    (tmp_path / "many_a.py").write_text(REWARD_FILE)
    return tmp_path


def cfg_for(tmp, **changes):
    return RLConfig(**{**QUICK, "init_from": str(tmp / "sft"), "out_dir": str(tmp / "rl"),
                       "prompts": f"FILE:{tmp / 'prompts.txt'}", "reward_file": str(tmp / "many_a.py"), **changes})


def records(out_dir, kind="rl"):
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == kind]


def test_the_engine_samples_what_generate_samples():
    model = tiny_model().eval()
    tok = tokenizer_from_meta(META)
    prompts = [tok.render([{"role": "user", "content": t}])[0] for t in ("say ab", "say a")]  # two lengths
    seeds = [11, 12, 13, 14]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    answers = sample_answers(model, prompts, 2, gens, 8, temperature=1.0, top_k=5)
    for n, ans in enumerate(answers):  # one at a time through generate.py's stream: the same tokens
        x = torch.tensor([prompts[n // 2]])
        y = generate(model, x, len(ans), temperature=1.0, top_k=5, generator=[torch.Generator().manual_seed(seeds[n])])
        assert y[0, x.size(1):].tolist() == ans


def test_log_probs_are_the_models_at_the_sampled_tokens():
    model = tiny_model().eval()
    prompts, answers = [[1, 2, 3], [4, 5]], [[0, 1], [2], [3, 3, 3], [6]]
    x, y = answer_batch(prompts, answers, 2)
    assert y.tolist()[0] == [-1, -1, 0, 1] and y.tolist()[3] == [-1, 6, -1, -1]
    with torch.no_grad():
        logp = token_log_probs(model, x, y)
    for n, a in enumerate(answers):
        row = prompts[n // 2] + a
        ref = next_token_log_probs(model, row[:-1])  # numpy log-softmax of the model's own forward
        start = len(prompts[n // 2]) - 1
        for i, t in enumerate(a):
            assert logp[n, start + i].item() == pytest.approx(ref[start + i, t], abs=1e-5)
    assert (logp[y < 0] == 0).all()


def sampler_log_prob(logp1, token, temperature, top_k, top_p):
    """log p(token) under the distribution the sampler draws from, in numpy from the model's log-probabilities at
    temperature 1 (logits up to a constant): over the temperature, the top_k kept, then the smallest set of the
    most likely reaching top_p, renormalised. Also the number of tokens kept."""
    import numpy as np
    scaled = logp1 / temperature
    kept = scaled >= np.sort(scaled)[-top_k]
    p = np.where(kept, np.exp(scaled - scaled.max()), 0.0)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]  # the mass ranked above each token
    nucleus = np.zeros_like(kept)
    nucleus[order[(before < top_p) | (np.arange(len(p)) == 0)]] = True
    p = np.where(nucleus, p, 0.0)
    return np.log(p[token] / p.sum()), int(nucleus.sum())


def test_the_gradient_steps_on_the_log_probs_of_the_distribution_sampled_from(start, monkeypatch):
    """rl.py at temperature 0.7, top_k 4, top_p 0.9: the log-probabilities its loss takes are those of the
    sampler's distribution (an off-policy gradient, from the model's plain softmax, would differ), worked here
    in numpy from the starting model's own forward. Its embeddings are scaled up 3 times so that the nucleus
    holds 2 to 4 tokens, and a different set where it is taken before the temperature."""
    import rl as program
    model = tiny_model().eval()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(3.0)  # tied to lm_head: logits 3 times as far apart
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "iter_num": 0, "config": {},
                "tokenizer": META}, start / "sft" / "ckpt.pt")
    seen = {}
    real_batch, real_loss = program.answer_batch, program.pg_loss

    def answer_batch(*args, **kwargs):
        seen["x"], seen["y"] = real_batch(*args, **kwargs)
        return seen["x"], seen["y"]

    def pg_loss(logp, *args, **kwargs):
        seen["logp"] = logp.detach().clone()
        return real_loss(logp, *args, **kwargs)
    monkeypatch.setattr(program, "answer_batch", answer_batch)
    monkeypatch.setattr(program, "pg_loss", pg_loss)
    settings = dict(temperature=0.7, top_k=4, top_p=0.9)
    rl(cfg_for(start, max_iters=1, **settings), log=quiet)
    x, y, logp = seen["x"], seen["y"], seen["logp"]
    sizes, plain = set(), []
    for n in range(len(x)):
        ref = next_token_log_probs(model, x[n].tolist())  # (T, V) at temperature 1
        for t in (y[n] >= 0).nonzero().flatten().tolist():
            want, kept = sampler_log_prob(ref[t], y[n, t].item(), **settings)
            assert math.isfinite(want) and logp[n, t].item() == pytest.approx(want, abs=1e-4), (n, t)
            sizes.add(kept)
            plain.append(abs(ref[t, y[n, t]] - want))
    assert len(plain) > 20 and min(sizes) < 4 and max(plain) > 0.1  # top_p and the temperature both matter here


def test_advantages_and_the_token_level_loss_by_hand():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    assert advantages(r, 2).tolist() == [0.5, -0.5, 0.0, 0.0]
    z = advantages(torch.tensor([1.0, 0.0, 0.2, 0.4]), 2, "zscore")
    assert z.tolist() == pytest.approx([1, -1, -1, 1], abs=1e-4)
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    y = torch.tensor([[5, 5, -1], [5, -1, -1]])
    adv = torch.tensor([0.5, -1.0])
    # -(0.5 * (-1 - 2) + (-1) * (-3)) / 3 sampled tokens
    assert pg_loss(logp, y, adv).item() == pytest.approx(-(0.5 * -3 + 3) / 3)
    ref = logp + 0.1  # KL's k3: exp(0.1) - 0.1 - 1 per token
    assert pg_loss(logp, y, torch.zeros(2), ref, kl=2.0).item() == pytest.approx(2 * (math.exp(0.1) - 1.1), rel=1e-5)


def test_the_learning_rate_warms_up_then_stays_or_follows_a_cosine_to_min_lr():
    cfg = RLConfig(learning_rate=1e-3, warmup_iters=4, max_iters=14)
    assert [learning_rate(cfg, it) for it in (0, 3, 4, 13)] == pytest.approx([2e-4, 8e-4, 1e-3, 1e-3])
    cfg = RLConfig(learning_rate=1e-3, warmup_iters=4, max_iters=14, min_lr=1e-4)
    # 10 decaying iters: half way (it 9) is the mean of the two rates; it 14 and past it is min_lr
    got = [learning_rate(cfg, it) for it in (3, 4, 9, 14, 20)]
    assert got == pytest.approx([8e-4, 1e-3, 5.5e-4, 1e-4, 1e-4])
    with pytest.raises(ValueError, match="min_lr"):
        RLConfig(learning_rate=1e-3, min_lr=2e-3)


def test_a_few_steps_learn_the_reward(start):
    summary = rl(cfg_for(start, max_iters=12, learning_rate=1e-2), log=quiet)
    assert summary["iters"] == 12
    rewards = [r["many_a"] for r in records(start / "rl")]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.15, rewards
    train, held_out = read_rewards(str(start / "rl"))  # plot.py --rewards draws them
    assert [v for _, v in train["many_a"]] == rewards and held_out == {}
    draw_rewards({str(start / "rl"): (train, held_out)}).savefig(start / "rl.png")
    assert (start / "rl.png").stat().st_size > 1000


def test_resume_equals_the_uninterrupted_run(start):
    rl(cfg_for(start, max_iters=4, out_dir=str(start / "whole")), log=quiet)
    rl(cfg_for(start, max_iters=2, out_dir=str(start / "half")), log=quiet)
    rl(cfg_for(start, max_iters=4, out_dir=str(start / "half"), init_from="resume"), {"max_iters": 4}, log=quiet)
    whole, half = load_checkpoint(str(start / "whole" / "ckpt.pt")), load_checkpoint(str(start / "half" / "ckpt.pt"))
    assert whole["iter_num"] == half["iter_num"] == 4
    for key, value in whole["model"].items():
        assert torch.equal(value, half["model"][key]), key
    assert [r["reward"] for r in records(start / "whole")][2:] == [r["reward"] for r in records(start / "half")][2:]


def test_the_printed_resume_command_continues_the_run_with_its_own_settings(start):
    """The command Ctrl-C prints (python rl.py --init_from=resume --out_dir=DIR --reward_file=FILE: a resume takes
    no file of code from the checkpoint) resumes with the run's batch, samples, learning rate and reward file,
    not rl.py's defaults; a key given on that command line still applies."""
    import shlex

    from configurator import parse_args
    from nanogpt.training.resume import resume_command
    rl(cfg_for(start, max_iters=4, out_dir=str(start / "whole")), log=quiet)
    rl(cfg_for(start, max_iters=2, out_dir=str(start / "half")), log=quiet)
    printed = shlex.split(resume_command("rl.py", cfg_for(start, out_dir=str(start / "half")), 1))
    assert printed[:2] == ["python", "rl.py"] and f"--reward_file={start / 'many_a.py'}" in printed
    lines = []
    rl(*parse_args(RLConfig, printed[2:] + ["--max_iters=4"]), log=lines.append)
    assert "override: max_iters = 4 (was 2)" in lines and any("one process x 4 prompts x 4 samples" in line for line in lines)
    whole, half = load_checkpoint(str(start / "whole" / "ckpt.pt")), load_checkpoint(str(start / "half" / "ckpt.pt"))
    assert half["config"]["learning_rate"] == QUICK["learning_rate"] and half["config"]["init_from"] == "resume"
    for key, value in whole["model"].items():
        assert torch.equal(value, half["model"][key]), key


def test_the_summary_counts_this_runs_iterations_and_its_time(start, capsys):
    import rl as program
    args = [f"--{k}={v}" for k, v in QUICK.items()] + [
        f"--init_from={start / 'sft'}", f"--out_dir={start / 'rl'}", f"--prompts=FILE:{start / 'prompts.txt'}",
        f"--reward_file={start / 'many_a.py'}"]
    program.main(args + ["--max_iters=2"])
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 2 iters in ")
    program.main(["--init_from=resume", f"--out_dir={start / 'rl'}", "--max_iters=5"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.match(r"done: 3 iters in \d+\.\d s \(5 in all\); checkpoint ", last), last


def test_the_checkpoint_serves_as_a_chat_model(start):
    rl(cfg_for(start, max_iters=1, eval_interval=1), log=quiet)
    out = run_script(["chat.py", f"--out_dir={start / 'rl'}", "-p", "say ab", "--max_new_tokens=4"])
    assert out.returncode == 0, out.stderr


def test_a_checkpoint_without_a_chat_template_is_refused(start):
    ckpt = torch.load(start / "sft" / "ckpt.pt")
    ckpt["tokenizer"] = {"tokenizer": "char", "chars": CHARS + list("wxzq"), "vocab_size": len(CHARS) + 4}
    torch.save(ckpt, start / "sft" / "ckpt.pt")
    with pytest.raises(UserError, match="no chat template"):
        rl(cfg_for(start), log=quiet)


def test_prompts_longer_than_the_context_are_refused(start):
    (start / "prompts.txt").write_text("say " + "ab" * 20 + "\n")
    with pytest.raises(UserError, match=r"'say abab.*passes the model's context of 32"):
        rl(cfg_for(start), log=quiet)


def test_a_batch_that_does_not_fit_is_refused(start):
    with pytest.raises(UserError, match="an RL step of 100000 prompts x 1000 samples needs about"):
        rl(cfg_for(start, batch_size=100_000, samples=1000), log=quiet)


def test_a_bad_reward_stops_the_run_with_nothing_saved_from_that_step(start):
    # NaN from the 17th answer on: the second step's (4 prompts x 4 samples a step)
    (start / "many_a.py").write_text(REWARD_FILE + "\ncalls = [0]\n\n@reward('nan_later')\n"
                                     "def nan_later(request, answer):\n    calls[0] += 1\n"
                                     "    return float('nan') if calls[0] > 16 else 0.5\n")
    with pytest.raises(UserError, match=r"reward 'nan_later' returned nan, not a number in \[0, 1\], on the request 'say"):
        rl(cfg_for(start, reward="many_a,nan_later", max_iters=5, eval_interval=1), log=quiet)
    saved = load_checkpoint(str(start / "rl" / "ckpt.pt"))
    assert saved["iter_num"] == 1 and len(records(start / "rl")) == 1  # the step that completed, not the failed one


def test_bad_input_is_one_line(start):
    out = run_script(["rl.py", f"--init_from={start / 'sft'}", f"--out_dir={start / 'rl'}", "--reward=acrostc",
                      f"--prompts=FILE:{start / 'prompts.txt'}", "--eval_keys=0"])
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: unknown reward 'acrostc' (did you mean 'acrostic'?); the rewards are acrostic, form, guard, rhyme, tone")
    out = run_script(["rl.py", "--init_from=resume", f"--out_dir={start / 'nothing'}"])
    assert out.returncode == 2 and "not found" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_two_processes_under_torchrun_train_what_one_process_of_both_batches_does(start):
    """Each rank samples its own prompts (batch_size each) with the seeds one process of twice the batch gives
    them, and the loss is normalised by every rank's tokens: the weights after 3 iters are one process's."""
    cfg = cfg_for(start, max_iters=3, batch_size=2, eval_interval=3)
    args = [f"--{k}={v}" for k, v in vars(cfg).items() if k in QUICK or k in ("init_from", "prompts", "reward_file",
                                                                                 "max_iters")]
    ddp = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "rl.py", *args,
                      f"--out_dir={start / 'ddp'}"], timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "2 processes x 2 prompts x 4 samples per iter" in ddp.stdout
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's workers: the same order of sums
    try:
        rl(cfg_for(start, max_iters=3, batch_size=4, eval_interval=3, out_dir=str(start / "one")), log=quiet)
    finally:
        torch.set_num_threads(threads)
    one, two = (load_checkpoint(str(start / name / "ckpt.pt")) for name in ("one", "ddp"))
    assert one["iter_num"] == two["iter_num"] == 3 and len(two["rl"]["rng"]) == 2
    for key, value in one["model"].items():
        torch.testing.assert_close(two["model"][key], value, atol=1e-6, rtol=0)
    assert [r["reward"] for r in records(start / "one")] == pytest.approx([r["reward"] for r in records(start / "ddp")])


def test_every_value_train_py_refuses_for_a_shared_key_rl_py_refuses_too():
    """One rule per setting: rl.py's grad_clip=-1 once stepped away from the reward (torch's clip with a negative
    norm flips the gradient), beta1=2 was a traceback and seed=-1 was taken, where train.py refuses each."""
    from dataclasses import fields

    from nanogpt.training.train_config import TrainConfig
    shared = {f.name for f in fields(RLConfig)} & {f.name for f in fields(TrainConfig)}
    numeric = sorted(k for k in shared if isinstance(getattr(RLConfig(), k), (int, float)) and k != "wandb_log")
    assert {"grad_clip", "beta1", "beta2", "seed", "learning_rate", "weight_decay", "batch_size"} <= set(numeric)
    refused = 0
    for key in numeric:
        for value in (-1, -0.5, 0, 1, 1.5, 2, 2 ** 64):
            try:
                TrainConfig(**{key: value})
            except ValueError:
                with pytest.raises(ValueError, match=key):
                    RLConfig(**{key: value})
                refused += 1
    assert refused >= 15


def test_a_checkpoint_whose_optimizer_is_one_group_resumes_as_the_uninterrupted_run(start):
    """rl.py builds its AdamW as train.py does (matrices decayed, gains and biases not: two groups); a run saved
    with every parameter in one group, as rl.py once wrote it, resumes to the same weights: each parameter's
    moments reach it whatever group held them."""
    rl(cfg_for(start, max_iters=4, out_dir=str(start / "whole")), log=quiet)
    rl(cfg_for(start, max_iters=2, out_dir=str(start / "half")), log=quiet)
    path = start / "half" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    model = tiny_model()
    model.load_state_dict(ckpt["model"])
    groups = ckpt["optimizer"]["param_groups"]
    assert len(groups) == 2 and sorted(g["weight_decay"] for g in groups) == [0.0, QUICK.get("weight_decay", 0.0)]
    in_groups = [p for g in groups for p in g["params"]]  # each index: its parameter in the two groups' order
    two = dict(zip(in_groups, [p for p in model.parameters() if p.dim() >= 2] + [p for p in model.parameters()
                                                                                 if p.dim() < 2]))
    order = {id(p): i for i, p in enumerate(model.parameters())}
    moments = {order[id(two[i])]: s for i, s in ckpt["optimizer"]["state"].items()}
    ckpt["optimizer"] = {"state": dict(sorted(moments.items())),  # in the parameters' order, as AdamW saved it
                         "param_groups": [{**groups[0], "params": sorted(order.values())}]}
    torch.save(ckpt, path)
    rl(cfg_for(start, max_iters=4, out_dir=str(start / "half"), init_from="resume"), {"max_iters": 4}, log=quiet)
    whole, half = load_checkpoint(str(start / "whole" / "ckpt.pt")), load_checkpoint(str(path))
    for key, value in whole["model"].items():
        assert torch.equal(value, half["model"][key]), key
