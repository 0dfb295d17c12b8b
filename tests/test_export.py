"""export.py beyond GPT-2: Llama and Qwen3 directories that transformers runs as ours does, read back by
--init_from=DIR; the options no architecture expresses and the targets export must not write, refused."""
import json
import os

import numpy as np
import pytest
import torch

from conftest import run_script
from test_interop import randomize, trained_then_randomized

transformers = pytest.importorskip("transformers")

MODERN = dict(pos_emb="rope", norm="rmsnorm", activation="swiglu", bias=False, rope_base=500.0, norm_eps=1e-6)
ARCHITECTURES = {
    "llama": dict(MODERN),
    "llama-gqa-untied": dict(MODERN, n_kv_head=1, tie_weights=False),
    "llama-biases": dict(MODERN, bias=True),
    "qwen3-gqa": dict(MODERN, qk_norm=True, n_kv_head=1),
}


def sample(args):
    result = run_script(["sample.py", "--start=Speak", "--temperature=0", "--num_samples=1", "--max_new_tokens=12",
                         "--device=cpu"] + args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("options", ARCHITECTURES.values(), ids=ARCHITECTURES.keys())
def test_transformers_computes_our_logits_and_greedy_tokens(tmp_path, char_dataset, options):
    """Every parameter random (norm gains and biases too): RoPE's pairing, the GQA split, the gate and up
    rows and the untied head each change the logits if written wrong."""
    import export
    from model import GPT, GPTConfig
    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    meta = read_meta(str(char_dataset))
    ours = randomize(GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=32, vocab_size=len(meta["chars"]),
                                   **options))).eval()
    kind = "qwen3" if options.get("qk_norm") else "llama"
    export.write_hf(ours, tokenizer_from_meta(meta), meta, str(tmp_path / "hf"), kind)
    expected = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert type(hf).__name__ == expected
    idx = torch.randint(0, ours.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        np.testing.assert_allclose(hf(idx).logits.numpy(), ours(idx)[0].numpy(), atol=1e-4, rtol=0)
        theirs = hf.generate(idx[:1, :4], max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(theirs, ours.generate(idx[:1, :4], 20, temperature=0))


@pytest.mark.parametrize("options", [ARCHITECTURES["llama-gqa-untied"], ARCHITECTURES["qwen3-gqa"]],
                         ids=["llama-gqa-untied", "qwen3-gqa"])
def test_exported_greedy_text_is_sample_pys_and_the_export_reads_back(tmp_path, char_dataset, options):
    """End to end: train.py's checkpoint, export.py, transformers' generate() == sample.py --temperature=0 on
    the checkpoint == sample.py --init_from=DIR."""
    out, ours = trained_then_randomized(tmp_path, char_dataset, **options)
    exported = run_script(["export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf'}"])
    assert exported.returncode == 0, exported.stderr
    expected = "Qwen3ForCausalLM" if options.get("qk_norm") else "LlamaForCausalLM"
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [expected]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    chars = json.loads((char_dataset / "meta.json").read_text(encoding="utf-8"))["chars"]
    prompt = torch.tensor([[chars.index(c) for c in "Speak"]])
    with torch.no_grad():
        tokens = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    from_checkpoint = sample([f"--out_dir={out}"])
    assert from_checkpoint.split("\n---------------")[0] == "".join(chars[t] for t in tokens)
    assert sample([f"--init_from={tmp_path / 'hf'}"]) == from_checkpoint


def test_rope_pairs_become_halves_per_head():
    """Worked by hand: head 0 has channels 0..3, pairs (0, 1), (2, 3) -> halves (0, 2 | 1, 3); head 1 likewise."""
    from nanogpt.interop.llama import from_halves, to_halves
    rows = torch.arange(8.0)
    assert to_halves(rows, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    w = torch.randn(8, 3)
    assert torch.equal(from_halves(to_halves(w, 2), 2), w)


REFUSED = {
    "relu2": (dict(MODERN, activation="relu2"), "activation=relu2 with RoPE (Llama and Qwen3 use SwiGLU)"),
    "value-embeds": (dict(MODERN, value_embeds=1), "value_embeds=1 (no Hugging Face architecture has value embeddings)"),
    "softcap": (dict(MODERN, logit_softcap=15.0), "logit_softcap=15.0 (Gemma 2, the architecture with a final softcap"),
    "rope-layernorm": (dict(MODERN, norm="layernorm"), "norm=layernorm with RoPE"),
    "qk-norm-biases": (dict(MODERN, qk_norm=True, bias=True), "qk_norm=True with bias=True (Qwen3 has no MLP biases)"),
    "gpt2-gqa": (dict(n_kv_head=1), "n_kv_head=1"),
    "gpt2-softcap": (dict(logit_softcap=30.0), "logit_softcap=30.0 (Gemma 2"),
}


@pytest.mark.parametrize("options, reason", REFUSED.values(), ids=REFUSED.keys())
def test_an_option_no_architecture_expresses_is_named_with_recipes_that_export(options, reason):
    from model import GPTConfig
    from nanogpt.errors import UserError
    from nanogpt.interop.hf import hf_architecture
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16, **options)
    with pytest.raises(UserError) as e:
        hf_architecture(config, "ckpt.pt")
    assert reason in str(e.value) and "\n" not in str(e.value)
    assert "--pos_emb=rope --norm=rmsnorm --activation=swiglu" in str(e.value)


@pytest.mark.parametrize("options, kind", [(dict(), "gpt2"), (MODERN, "llama"), (dict(MODERN, qk_norm=True), "qwen3"),
                                           (dict(activation="relu", bias=False, tie_weights=False), "gpt2")])
def test_each_recipe_exports_as_its_architecture(options, kind):
    from model import GPTConfig
    from nanogpt.interop.hf import hf_architecture
    assert hf_architecture(GPTConfig(n_layer=1, n_head=2, n_embd=32, **options), "ckpt.pt") == kind


def test_refusal_is_one_line_and_writes_nothing(tmp_path, char_dataset):
    out, _ = trained_then_randomized(tmp_path, char_dataset, **dict(MODERN, activation="relu2"))
    result = run_script(["export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf'}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "activation=relu2 with RoPE" in result.stderr
    assert not os.path.exists(tmp_path / "hf")


@pytest.fixture
def exported(tmp_path, char_dataset):
    out, _ = trained_then_randomized(tmp_path, char_dataset, **MODERN)
    return out


def test_hf_dir_that_is_a_file_or_holds_another_model_is_refused_untouched(tmp_path, exported):
    (tmp_path / "file").write_text("mine")
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "bert"}')
    (other / "pytorch_model.bin").write_bytes(b"weights")
    for target, says in ((tmp_path / "file", "is a file, not a directory"),
                         (other, "holds files export.py does not write (pytorch_model.bin)")):
        result = run_script(["export.py", f"--out_dir={exported}", f"--hf_dir={target}"])
        assert result.returncode == 2 and says in result.stderr, result.stderr
    assert (tmp_path / "file").read_text() == "mine"
    assert sorted(os.listdir(other)) == ["config.json", "pytorch_model.bin"]
    assert (other / "config.json").read_text() == '{"model_type": "bert"}'


def test_an_earlier_export_is_replaced_whole(tmp_path, exported, char_dataset):
    """A BPE export, then a char model into the same directory: nothing of the BPE's stays (its ranks file)."""
    target = tmp_path / "hf"
    target.mkdir()
    (target / "ranks.tiktoken").write_text("stale")
    (target / "config.json").write_text("{}")
    result = run_script(["export.py", f"--out_dir={exported}", f"--hf_dir={target}"])
    assert result.returncode == 0, result.stderr
    assert "ranks.tiktoken" not in os.listdir(target)
    assert json.loads((target / "config.json").read_text())["model_type"] == "llama"
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".hf")]  # no temporary left


def test_a_checkpoint_without_its_tokenizer_is_refused(tmp_path, exported):
    from nanogpt.checkpoint import load_checkpoint, save_checkpoint
    path = str(exported / "ckpt.pt")
    ckpt = load_checkpoint(path)
    ckpt["tokenizer"] = None
    ckpt["config"]["dataset"] = str(tmp_path / "gone")
    save_checkpoint(ckpt, path)
    result = run_script(["export.py", f"--out_dir={exported}", f"--hf_dir={tmp_path / 'hf'}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "whose meta.json (or meta.pkl) is not found" in result.stderr
    assert not os.path.exists(tmp_path / "hf")


def test_a_qwen3_directory_with_trained_qk_gains_is_refused_on_reading(tmp_path, char_dataset):
    """Ours has no gain in qk_norm: a Qwen3 whose gains are not ones is not ours to compute."""
    from safetensors.torch import load_file, save_file

    import export
    from model import GPT, GPTConfig
    from nanogpt.errors import UserError
    from nanogpt.interop.hf import load_pretrained
    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    meta = read_meta(str(char_dataset))
    model = randomize(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=len(meta["chars"]),
                                    **dict(MODERN, qk_norm=True))))
    export.write_hf(model, tokenizer_from_meta(meta), meta, str(tmp_path / "hf"), "qwen3")
    back = load_pretrained(str(tmp_path / "hf"))
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.0.self_attn.k_norm.weight"] *= 2
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"model.layers.0.self_attn.k_norm.weight is not all ones"):
        load_pretrained(str(tmp_path / "hf"))
