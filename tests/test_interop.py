"""Interchange with Hugging Face's GPT-2: load its weights, export ours, same logits and tokens."""
import os

import numpy as np
import pytest
import torch

from conftest import run_script
from nanogpt.interop.hf import from_pretrained

transformers = pytest.importorskip("transformers")


def randomize(model, seed=0):
    """Every parameter random: biases and norm gains too (both inits leave them 0 and 1, which hides bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif p.dim() == 1:  # norm gains
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.15 * noise)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A small GPT2LMHeadModel, every parameter random, saved as a local Hugging Face directory."""
    config = transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = randomize(transformers.GPT2LMHeadModel(config).eval())
    path = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2_tiny_dir(tmp_path_factory):
    """GPT-2's vocabulary at a tiny width: stands in for gpt2 (no download here)."""
    config = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    path = tmp_path_factory.mktemp("hf") / "gpt2-tiny"
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def hf_greedy(model, idx, n):
    for _ in range(n):
        logits = model(idx).logits
        idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return idx


def test_from_pretrained_matches_hugging_face_logits_and_greedy_tokens(hf_dir):
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    ours = from_pretrained(str(hf_dir)).eval()  # nanoGPT's GPT.from_pretrained, now in hf.py
    assert ours.config.activation == "gelu_tanh" and ours.config.vocab_size == 300
    idx = torch.randint(0, 300, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)
        expected = hf_greedy(hf, idx[:, :4], 12)
    assert torch.equal(ours.generate(idx[:, :4], 12, temperature=0), expected)


def trained_then_randomized(tmp_path, char_dataset, **options):
    """A checkpoint as train.py writes it, its every parameter then made random; returns (out_dir, model)."""
    from nanogpt.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
    from train import TrainConfig, train
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), dataset=str(char_dataset), n_layer=2, n_head=2, n_embd=32,
                      block_size=16, batch_size=4, gradient_accumulation_steps=1, eval_iters=2, max_iters=3,
                      eval_interval=3, device="cpu", **options)
    train(cfg, log=lambda *a: None)
    path = str(tmp_path / "out" / "ckpt.pt")
    ckpt = load_checkpoint(path)
    model = randomize(model_from_checkpoint(ckpt, path).eval())
    ckpt["model"] = model.state_dict()
    save_checkpoint(ckpt, path)
    return tmp_path / "out", model


@pytest.mark.parametrize("options", [dict(bias=True), dict(bias=False), dict(bias=True, tie_weights=False)],
                         ids=["bias", "no-bias", "untied"])
def test_export_round_trips_through_hugging_face(tmp_path, char_dataset, options):
    out, ours = trained_then_randomized(tmp_path, char_dataset, **options)
    result = run_script(["export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf'}"])
    assert result.returncode == 0, result.stderr
    assert os.path.exists(tmp_path / "hf" / "model.safetensors")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        np.testing.assert_allclose(hf(idx).logits.numpy(), ours(idx)[0].numpy(), atol=1e-5)
    # a char vocabulary has no end-of-text token: none is claimed
    assert hf.config.bos_token_id is None and hf.config.eos_token_id is None


def test_exported_model_writes_the_same_greedy_text_as_sample_py(tmp_path, char_dataset):
    """End to end: sample.py --temperature=0 and Hugging Face's generate on the exported directory."""
    import json
    out, _ = trained_then_randomized(tmp_path, char_dataset, bias=True)
    assert run_script(["export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf'}"]).returncode == 0
    prompt, n = "Speak", 12
    sampled = run_script(["sample.py", f"--out_dir={out}", f"--start={prompt}", "--temperature=0", "--num_samples=1",
                          f"--max_new_tokens={n}", "--device=cpu"])
    assert sampled.returncode == 0, sampled.stderr
    chars = json.loads((char_dataset / "meta.json").read_text(encoding="utf-8"))["chars"]
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor([[chars.index(c) for c in prompt]])
    with torch.no_grad():
        tokens = hf.generate(idx, max_new_tokens=n, do_sample=False, pad_token_id=0)[0].tolist()
    assert sampled.stdout.split("\n---------------")[0] == "".join(chars[t] for t in tokens)


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_an_exported_model_samples_with_the_tokenizer_it_was_trained_on(tmp_path, tokenizer):
    """export then sample.py --init_from=HF_DIR: the same text as sampling the checkpoint, without the dataset."""
    import shutil

    from conftest import CORPUS
    from data.prepare import prepare
    (tmp_path / "in.txt").write_text(CORPUS)
    prepare(str(tmp_path / "in.txt"), tokenizer, str(tmp_path / "data"), log=lambda *a: None, vocab_size=300)
    out, _ = trained_then_randomized(tmp_path, tmp_path / "data")
    exported = run_script(["export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf'}"])
    assert exported.returncode == 0, exported.stderr
    shutil.rmtree(tmp_path / "data")
    args = ["sample.py", "--start=Speak", "--temperature=0", "--num_samples=1", "--max_new_tokens=12", "--device=cpu"]
    from_checkpoint = run_script(args + [f"--out_dir={out}"])
    from_export = run_script(args + [f"--init_from={tmp_path / 'hf'}"])
    assert from_export.returncode == 0, from_export.stderr
    assert from_export.stdout == from_checkpoint.stdout and from_export.stdout.startswith("Speak")


def test_export_refuses_other_architectures(tmp_path, char_dataset):
    from train import TrainConfig, train
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), dataset=str(char_dataset), n_layer=1, n_head=2, n_embd=32,
                      block_size=16, batch_size=4, gradient_accumulation_steps=1, eval_iters=1, max_iters=1,
                      eval_interval=1, device="cpu", pos_emb="rope", norm="rmsnorm")
    train(cfg, log=lambda *a: None)
    result = run_script(["export.py", f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert result.returncode == 2
    assert "cannot export: activation=gelu with RoPE (Llama and Qwen3 use SwiGLU)" in result.stderr
    assert not os.path.exists(tmp_path / "hf")


def test_finetune_and_sample_from_pretrained_weights(tmp_path, hf_dir, gpt2_tiny_dir):
    from conftest import CORPUS
    from data.prepare import prepare
    (tmp_path / "in.txt").write_text(CORPUS)
    prepare(str(tmp_path / "in.txt"), "gpt2", str(tmp_path / "data"), log=lambda *a: None)
    args = ["train.py", "config/finetune_shakespeare.py", f"--init_from={gpt2_tiny_dir}",
            f"--dataset={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--block_size=32",
            "--max_iters=2", "--eval_interval=2", "--eval_iters=2", "--gradient_accumulation_steps=2"]
    result = run_script(args)
    assert result.returncode == 0, result.stderr
    sampled = run_script(["sample.py", f"--out_dir={tmp_path / 'out'}", "--num_samples=1", "--max_new_tokens=5",
                          "--start=Hello"])
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("Hello")
    # a model whose vocabulary is smaller than the dataset's is refused
    refused = run_script(["train.py", f"--init_from={hf_dir}", f"--dataset={tmp_path / 'data'}",
                          f"--out_dir={tmp_path / 'other'}", "--device=cpu", "--block_size=32"])
    assert refused.returncode == 2 and "vocabulary" in refused.stderr


def test_sample_from_pretrained_weights(hf_dir, gpt2_tiny_dir):
    args = ["sample.py", "--num_samples=1", "--max_new_tokens=5", "--start=Hello", "--temperature=0"]
    sampled = run_script(args + [f"--init_from={gpt2_tiny_dir}"])
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("Hello")
    refused = run_script(args + [f"--init_from={hf_dir}"])  # 300 tokens cannot hold GPT-2 BPE ids
    assert refused.returncode == 2 and "vocabulary of 300 tokens" in refused.stderr


NO_NETWORK = {"HF_ENDPOINT": "https://hub.invalid", "HF_HUB_OFFLINE": "", "HTTPS_PROXY": "", "https_proxy": "",
              "ALL_PROXY": "", "all_proxy": ""}  # .invalid never resolves (RFC 2606): no network, at once


def test_gpt2_offline_and_not_cached_is_one_line_at_once_naming_both_ways_out(tmp_path):
    env = {**NO_NETWORK, "HF_HOME": str(tmp_path / "empty-cache")}
    result = run_script(["sample.py", "--init_from=gpt2", "--num_samples=1", "--max_new_tokens=2"], env=env)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr  # no retry warnings before it
    assert "cannot load GPT-2 weights 'gpt2'" in errors[0]
    assert "--init_from=DIR" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0]


def test_gpt2_offline_loads_from_hugging_faces_cache(tmp_path, gpt2_tiny_dir):
    """Weights downloaded before (Hugging Face's cache layout) load without the network and without retries."""
    snapshot = tmp_path / "hf" / "hub" / "models--gpt2" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_bytes((gpt2_tiny_dir / name).read_bytes())
    (tmp_path / "hf" / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hf" / "hub" / "models--gpt2" / "refs" / "main").write_text("0123abcd")
    args = ["sample.py", "--init_from=gpt2", "--num_samples=1", "--max_new_tokens=3", "--start=Hello",
            "--temperature=0", "--device=cpu"]
    cached = run_script(args, env={**NO_NETWORK, "HF_HOME": str(tmp_path / "hf")})
    local = run_script(args[:1] + [f"--init_from={gpt2_tiny_dir}"] + args[2:])
    assert cached.returncode == 0 and "Retrying" not in cached.stderr, cached.stderr
    assert cached.stdout == local.stdout and cached.stdout.startswith("Hello")


def test_a_hugging_face_directory_of_pickled_weights_is_refused(tmp_path):
    config = transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(tmp_path / "pickled")
    (tmp_path / "pickled" / "model.safetensors").unlink()  # as older transformers saved: a pickle
    torch.save(model.state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    result = run_script(["sample.py", f"--init_from={tmp_path / 'pickled'}", "--num_samples=1", "--max_new_tokens=2"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "holds its weights as a pickle (pytorch_model.bin), which can run code" in result.stderr


def test_safetensors_of_garbage_bytes_are_one_line(hf_dir, tmp_path):
    import shutil
    garbage = tmp_path / "garbage"
    shutil.copytree(hf_dir, garbage)
    (garbage / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(5000))
    result = run_script(["sample.py", f"--init_from={garbage}", "--max_new_tokens=2", "--device=cpu"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1 and "model.safetensors is not a readable safetensors file" in errors[0]


@pytest.mark.parametrize("claim", [dict(n_layer=2000, n_embd=8192), dict(n_embd=8192, n_head=4)],
                         ids=["2000 layers", "8192 wide"])
def test_a_config_json_claiming_more_than_its_weights_is_refused_before_building(hf_dir, tmp_path, monkeypatch, claim):
    """config.json against the safetensors header: neither transformers nor we build a model of the claimed size."""
    import json
    import shutil

    from configurator import UserError
    from nanogpt.interop import hf
    from nanogpt.interop.hf import load_pretrained
    claimed = tmp_path / "claimed"
    shutil.copytree(hf_dir, claimed)
    config = json.loads((claimed / "config.json").read_text())
    (claimed / "config.json").write_text(json.dumps({**config, **claim}))

    def must_not_run(*args, **kwargs):
        raise AssertionError("a model was built from config.json's claimed sizes")
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", must_not_run)
    monkeypatch.setattr(hf, "GPT", must_not_run)
    expected = ("config.json claims n_layer=2000 but the weights hold 2 blocks" if "n_layer" in claim else
                r"weights do not match its config.json \(transformer.wte.weight has shape \(300, 48\), config.json "
                r"make it \(300, 8192\)")
    with pytest.raises(UserError, match=expected):
        load_pretrained(str(claimed))
