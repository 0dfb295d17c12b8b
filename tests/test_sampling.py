"""The sampling settings every program shares (generate.Sampling), OpenAI's penalties and logit bias, and
the rule for text outside a vocabulary (tokenizer.CharTokenizer.fit) in sample.py and chat.py."""
from trace import TraceConfig

import numpy as np
import pytest
import torch

from chat import ChatConfig
from configurator import parse_args
from model import GPT, GPTConfig
from nanogpt.checkpoint import model_args
from nanogpt.generate import Penalties, Sampling, check_sampling, sample_next, stream
from nanogpt.tokenizer import CHAT_TOKENS, CharTokenizer
from nanogpt.training.train_config import TrainConfig
from sample import SampleConfig
from test_model_options import perturbed


def penalized_by_hand(logits, generated, presence, frequency, bias):
    """OpenAI's formula in numpy: mu[j] - c[j] * frequency - (c[j] > 0) * presence + bias[j], c[j] the times
    token j was generated."""
    c = np.bincount(generated, minlength=logits.shape[-1]).astype(np.float64) if len(generated) else \
        np.zeros(logits.shape[-1])
    dense = np.zeros(logits.shape[-1])
    for token, b in bias.items():
        dense[token] = b
    return logits - c * frequency - (c > 0) * presence + dense


def test_penalties_are_openais_formula_worked_in_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 7)).astype(np.float32)
    generated = [[1, 1, 3, 1], [0, 6, 6, 4]]
    penalties = Penalties(2, 7, "cpu", presence_penalty=0.7, frequency_penalty=0.3, logit_bias={2: -100, 5: 1.5})
    for step in range(4):
        penalties.add(torch.tensor([generated[0][step], generated[1][step]]))
    got = penalties(torch.from_numpy(logits)).numpy()
    for row, history in enumerate(generated):
        want = penalized_by_hand(logits[row].astype(np.float64), history, 0.7, 0.3, {2: -100, 5: 1.5})
        np.testing.assert_allclose(got[row], want, rtol=1e-6, atol=1e-5)
    assert got[0, 1] == pytest.approx(logits[0, 1] - 3 * 0.3 - 0.7)  # three times: one presence, three frequencies


def greedy_penalized_by_hand(model, prompt, n, presence, frequency, bias):
    """Greedy decoding on the model's full (uncached) forwards, the logits penalized in numpy over the tokens
    generated so far (never the prompt's)."""
    seq, generated = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(torch.tensor([seq[-model.config.block_size:]]))
            mu = penalized_by_hand(logits[0, -1].double().numpy(), generated, presence, frequency, bias)
            generated.append(int(mu.argmax()))
            seq.append(generated[-1])
    return generated


def test_cached_greedy_with_penalties_equals_the_uncached_numpy_reference(tiny_config):
    """The prompt repeats token 7: a sampler that counted the prompt's tokens would penalize it from the start."""
    model = perturbed(tiny_config)
    prompt = [7, 7, 7, 3]
    settings = dict(presence_penalty=1.5, frequency_penalty=0.8, logit_bias={11: 2.0, 0: -100})
    got = [t.item() for t in stream(model, torch.tensor([prompt]), 12, temperature=0.0, **settings)]
    want = greedy_penalized_by_hand(model, prompt, 12, 1.5, 0.8, {11: 2.0, 0: -100})
    plain = [t.item() for t in stream(model, torch.tensor([prompt]), 12, temperature=0.0)]
    assert got == want and got != plain  # the penalties changed the text, as the reference says
    again = [t.item() for t in stream(model, torch.tensor([prompt]), 12, temperature=0.0, **settings)]
    assert again == got  # greedy with penalties is still deterministic


def test_sampled_penalized_generation_cached_equals_uncached(tiny_config):
    model = perturbed(tiny_config)
    idx = torch.randint(0, 64, (3, 4), generator=torch.Generator().manual_seed(1))
    settings = dict(temperature=1.0, top_k=20, presence_penalty=-0.5, frequency_penalty=1.0, logit_bias={5: 3.0})
    runs = [[t.tolist() for t in stream(model, idx, 10, generator=[torch.Generator().manual_seed(i) for i in range(3)],
                                        use_cache=cache, **settings)] for cache in (True, False)]
    assert runs[0] == runs[1]


def test_logit_bias_bans_and_forces_tokens():
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]])
    ban = Penalties(1, 4, "cpu", logit_bias={1: -100})
    assert sample_next(logits, 0.0, penalties=ban).item() == 3
    force = Penalties(1, 4, "cpu", logit_bias={0: 100})
    draws = {sample_next(logits, 1.0, generator=torch.Generator().manual_seed(s), penalties=force).item()
             for s in range(50)}
    assert draws == {0}
    with pytest.raises(ValueError, match=r"logit_bias has token id 4, outside the vocabulary \[0, 4\)"):
        Penalties(1, 4, "cpu", logit_bias={4: 1.0})


@pytest.mark.parametrize("bad, match", [
    (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty=-2.01), r"frequency_penalty must be in \[-2, 2\]"),
    (dict(logit_bias={3: 100.5}), r"logit_bias of token 3 is 100.5; a bias must be in \[-100, 100\]"),
    (dict(logit_bias={-1: 1.0}), "logit_bias has key -1"),
])
def test_out_of_range_penalties_and_biases_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        check_sampling(1, 1.0, None, None, **bad)
    with pytest.raises(ValueError, match=match):
        Sampling(**bad)


def test_sample_and_chat_take_the_penalties_as_keys():
    cfg, _ = parse_args(SampleConfig, ["--presence_penalty=0.5", "--frequency_penalty=-1",
                                       "--logit_bias={'198': -100, 7: 2}"])
    assert (cfg.presence_penalty, cfg.frequency_penalty, cfg.logit_bias) == (0.5, -1.0, {198: -100.0, 7: 2.0})
    assert cfg.settings() == dict(temperature=0.8, top_k=None, top_p=None, presence_penalty=0.5,
                                  frequency_penalty=-1.0, logit_bias={198: -100.0, 7: 2.0})
    cfg, _ = parse_args(ChatConfig, ["--frequency_penalty=1.5"])
    assert cfg.frequency_penalty == 1.5


def test_every_program_has_one_set_of_sampling_defaults():
    """sample.py, chat.py and trace.py take Sampling's keys and defaults; top_k keeps every token by default,
    as the server and OpenAI's API (whose requests have no top_k)."""
    shared = Sampling()
    for cls in (SampleConfig, ChatConfig, TraceConfig):
        assert issubclass(cls, Sampling)
        assert {k: getattr(cls(), k) for k in vars(shared)} == vars(shared)
    assert shared.top_k is None


def test_one_seed_check_for_every_program():
    for cls in (Sampling, SampleConfig, ChatConfig, TraceConfig, TrainConfig):
        for seed in (-1, 1 << 64):
            with pytest.raises(ValueError, match=rf"^seed must be in \[0, 2\^64\), got {seed}$"):
                cls(seed=seed)
    assert SampleConfig(seed=(1 << 64) - 1).seed == (1 << 64) - 1


# --- text outside the vocabulary ------------------------------------------------------------------------

SHAKESPEARE_CHARS = sorted(set("\n !&',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))


def test_text_outside_a_latin_vocabulary_is_converted_where_it_can_be_else_left_out():
    fitted = CharTokenizer(SHAKESPEARE_CHARS).fit("Café — 2 naïve ＡＢ!")
    assert fitted.text == "Cafe   naive AB!"
    assert fitted.converted == [("é", "e"), ("ï", "i"), ("Ａ", "A"), ("Ｂ", "B")]
    assert fitted.dropped == ["—", "2"]
    assert fitted.note("the prompt") == ("note: the prompt: 4 characters written in the vocabulary's form (é as e, "
                                         "ï as i, Ａ as A, Ｂ as B); 2 characters outside the vocabulary left out "
                                         "('—' '2')")
    assert CharTokenizer(SHAKESPEARE_CHARS).fit("ROMEO:").note() == ""
    assert CharTokenizer(SHAKESPEARE_CHARS).fit("2024").text == "\n"  # nothing left: a line break starts the text


def test_simplified_chinese_is_written_in_a_traditional_vocabularys_characters():
    pytest.importorskip("opencc")
    tang = CharTokenizer("藏頭詩：春江花月牀床")
    assert tang.script == "s2t"
    fitted = tang.fit("藏头诗：春江花月 ok")
    assert fitted.text == "藏頭詩：春江花月"
    assert fitted.converted == [("头", "頭"), ("诗", "詩")] and fitted.dropped == [" ", "o", "k"]
    assert tang.fit("床").text == "床"  # in the vocabulary: itself, though OpenCC would write 牀
    assert CharTokenizer("藏頭詩：春江花月牀").fit("床").text == "牀"  # outside: the form the vocabulary has
    both = CharTokenizer("藏頭詩征徵峰峯回迴却卻")  # the Tang poems write each pair; OpenCC turns the first of each
    assert both.fit("征峰回却").text == "征峰回却" and both.fit("征峰回却").note() == ""
    assert CharTokenizer("床").fit("床").text == "床"  # no script to write in: the character itself
    simplified = CharTokenizer("藏头诗春江花月")
    assert simplified.script == "t2s" and simplified.fit("藏頭詩").text == "藏头诗"


def test_a_character_the_vocabulary_has_stays_itself_beside_one_that_is_converted():
    """Mixed text (some characters outside the vocabulary) goes through OpenCC, which writes 床 as 牀 and 征 as 徵
    in context: a character the vocabulary has stays as it is there too, and only the missing 头 is converted."""
    pytest.importorskip("opencc")
    tang = CharTokenizer("藏頭詩：春江花月牀床")
    fitted = tang.fit("床头")
    assert fitted.text == "床頭" and fitted.converted == [("头", "頭")]
    both = CharTokenizer("藏頭詩征徵峰峯回迴却卻")
    fitted = both.fit("征峰回却头")
    assert fitted.text == "征峰回却頭" and fitted.converted == [("头", "頭")]


def save_char_checkpoint(path, chars, chat=False):
    torch.manual_seed(0)
    vocab = len(chars) + (len(CHAT_TOKENS) if chat else 0)
    model = GPT(GPTConfig(block_size=32, vocab_size=vocab, n_layer=1, n_head=2, n_embd=16))
    meta = {"tokenizer": "char", "chars": list(chars)}
    if chat:
        meta.update(chat=list(CHAT_TOKENS), vocab_size=vocab)
    path.mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "tokenizer": meta},
               path / "ckpt.pt")
    return path


def test_sample_py_writes_a_prompt_outside_the_vocabulary_with_a_note(tmp_path, capsys):
    import sample
    out = save_char_checkpoint(tmp_path / "out", SHAKESPEARE_CHARS)
    sample.main([f"--out_dir={out}", "--start=Café 1999 — ROMEO:", "--num_samples=1", "--max_new_tokens=5",
                 "--device=cpu"])
    captured = capsys.readouterr()
    assert captured.out.startswith("Cafe   ROMEO:")
    assert "note: the prompt: one character written in the vocabulary's form (é as e); 5 characters outside " \
           "the vocabulary left out ('1' '9' '—')" in captured.err


def test_chat_py_answers_simplified_chinese_and_english_to_a_tang_model(tmp_path, capsys):
    pytest.importorskip("opencc")
    import chat
    out = save_char_checkpoint(tmp_path / "sft", "\n，。藏頭詩：春江花月夜", chat=True)
    chat.main([f"--out_dir={out}", "-p", "藏头诗：春江花月 please", "--max_new_tokens=4", "--device=cpu"])
    err = capsys.readouterr().err
    assert "note: your message: 2 characters written in the vocabulary's form (头 as 頭, 诗 as 詩); 7 characters " \
           "outside the vocabulary left out (' ' 'p' 'l' 'e' 'a' 's')" in err


def test_the_playgrounds_controls_start_at_samplings_defaults():
    """The page sends its controls' values; empty ones are left out (the server's default, Sampling's)."""
    import re

    from conftest import ROOT
    page = open(f"{ROOT}/nanogpt/playground.html", encoding="utf-8").read()
    value = {name: (re.search(rf'<input id="{name}"[^>]*>', page).group(0)) for name in ("temperature", "top_k", "top_p")}
    shared = Sampling()
    assert f'value="{shared.temperature}"' in value["temperature"]
    assert "value=" not in value["top_k"] and shared.top_k is None  # empty: every token
    assert 'value="1"' in value["top_p"] and shared.top_p is None  # 1 is no nucleus (openai_api.check_settings)


def test_help_lists_the_sampling_keys_and_a_typo_names_the_nearest(capsys):
    from configurator import UserError, help_text
    text = help_text(SampleConfig)
    sampling = text.split("sampling:\n")[1]
    assert "--presence_penalty=0.0" in sampling and "--logit_bias={}" in sampling and "--top_k=None" in sampling
    with pytest.raises(UserError, match="unknown key 'presence_penalt' \\(did you mean 'presence_penalty'\\?\\)"):
        parse_args(ChatConfig, ["--presence_penalt=1"])
