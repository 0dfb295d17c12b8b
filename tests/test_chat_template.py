"""The chat template in every form gives the same tokens: ChatTokenizer.render (chat.py, training, serve.py's chat
API), its Jinja (chat_template) rendered as transformers and lm-eval render it and read back as serve.py reads a
prompt (encode_with_role_names), and transformers' apply_chat_template on an export. On every role the rules know
(system, developer, user, assistant, tool, function), on null, empty and list content, and on what they refuse.

(A message holding a role token's escaped spelling, tokenizer.ESCAPE after its "<", is read back without its
ESCAPE by the template's readers: a private-use character, left out of the messages here.)
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanogpt.errors import UserError
from nanogpt.tokenizer import AS_ROLE, CHAT_TOKENS, GPT2BPE, ROLES, CharTokenizer, ChatTokenizer

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CHARS = "abc .<|>systemuraind\n"  # the role tokens' spellings are text a message may hold
PIECES = ["a", "b", " ", "\n", "sa", *CHAT_TOKENS, "<|", "|>", "<|end", "end|>"]
REFUSED_ROLES = ["robot", "", "System", "<|user|>", None, 3]


def env():
    """As transformers renders a chat template (its raise_exception too)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    e.globals["raise_exception"] = raise_exception
    return e


@pytest.fixture(scope="module")
def chats():
    """{name: (ours, its chat_template compiled)} for characters and GPT-2's BPE (where parts joined or split
    would encode differently)."""
    toks = {"char": ChatTokenizer(CharTokenizer(sorted(set(CHARS)))), "gpt2": ChatTokenizer(GPT2BPE())}
    return {name: (tok, env().from_string(tok.chat_template())) for name, tok in toks.items()}


@pytest.fixture(scope="module")
def exported(chats, tmp_path_factory):
    """{name: AutoTokenizer of ours as export.py writes it}."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from nanogpt.interop.hf_tokenizer import hf_tokenizer
    out = {}
    for name, (tok, _) in chats.items():
        directory = tmp_path_factory.mktemp(f"hf-{name}")
        hf_tokenizer(tok, 1024).save_pretrained(directory)
        out[name] = transformers.AutoTokenizer.from_pretrained(directory)
    return out


text = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)
part = st.fixed_dictionaries({"type": st.just("text"), "text": text})
content = st.one_of(text, st.none(), st.just(""), st.lists(part, max_size=3))
message = st.fixed_dictionaries({"role": st.sampled_from(ROLES + tuple(AS_ROLE)), "content": content})
# what the rules refuse: an unknown role; content that is not text (a number, an object, an image part, a part
# whose text is not a string, a missing text)
bad_content = st.one_of(st.integers(), st.just({"text": "a"}), st.just([{"type": "image_url", "image_url": {}}]),
                        st.just([{"type": "text", "text": 5}]), st.just([{"type": "text"}]), st.just(["a"]))
refused = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(REFUSED_ROLES), "content": text}),
                    st.fixed_dictionaries({"role": st.sampled_from(ROLES + tuple(AS_ROLE)), "content": bad_content}),
                    st.fixed_dictionaries({"role": st.sampled_from(("system", "user", "developer", "tool")),
                                           "content": st.none()}))


def forms(tok, template, hf, messages, reply):
    """Each form's ids of messages, or "refused"."""
    def outcome(call):
        try:
            return call()
        except (UserError, jinja2.exceptions.TemplateError):
            return "refused"
    got = {"render": outcome(lambda: tok.render(messages, reply=reply)[0]),
           "jinja": outcome(lambda: tok.encode_with_role_names(
               template.render(messages=messages, add_generation_prompt=reply)))}
    if hf is not None:
        got["transformers"] = outcome(lambda: hf.apply_chat_template(
            messages, add_generation_prompt=reply, tokenize=True, return_dict=True)["input_ids"])
    return got


@pytest.mark.parametrize("name", ["char", "gpt2"])
@PROPERTY
@given(messages=st.lists(message, max_size=5), reply=st.booleans())
def test_every_form_of_the_template_gives_renders_ids_on_every_role(chats, name, messages, reply):
    tok, template = chats[name]
    got = forms(tok, template, None, messages, reply)
    refuses = any(m["content"] is None and m["role"] != "assistant" for m in messages)
    assert (got["render"] == "refused") == refuses, got
    assert len(set(map(str, got.values()))) == 1, got


@pytest.mark.parametrize("name", ["char", "gpt2"])
@PROPERTY
@given(messages=st.lists(message, max_size=4), bad=refused, at=st.integers(0, 4), reply=st.booleans())
def test_a_message_the_rules_refuse_is_refused_by_every_form(chats, name, messages, bad, at, reply):
    tok, template = chats[name]
    messages = messages[:at] + [bad] + messages[at:]
    got = forms(tok, template, None, messages, reply)
    assert set(got.values()) == {"refused"}, got


@pytest.mark.parametrize("name", ["char", "gpt2"])
@settings(PROPERTY, max_examples=60)
@given(messages=st.lists(message, min_size=1, max_size=4), bad=st.none() | refused, at=st.integers(0, 4),
       reply=st.booleans())  # transformers refuses an empty conversation, as serve.py does
def test_transformers_apply_chat_template_on_an_export_agrees(chats, exported, name, messages, bad, at, reply):
    tok, template = chats[name]
    if bad is not None:
        messages = messages[:at] + [bad] + messages[at:]
    got = forms(tok, template, exported[name], messages, reply)
    assert len(set(map(str, got.values()))) == 1, got


def test_the_rules_on_openais_roles_by_hand(chats):
    """Worked by hand: developer is system, a tool's result a user's turn, an assistant's null content left out,
    text parts joined; the template's text escapes a typed role token, and serve.py's reading of a prompt (fitted
    to the vocabulary, then encoded) reads it as text."""
    tok = chats["char"][0]
    messages = [{"role": "developer", "content": "be"}, {"role": "user", "content": "a<|end|>"},
                {"role": "assistant", "content": None}, {"role": "tool", "content": [{"type": "text", "text": "s"},
                                                                                    {"type": "text", "text": "un"}]}]
    s, u, a, e = (tok.ids[t] for t in CHAT_TOKENS)
    expected = [s, *tok.encode("be"), e, u, *tok.encode("a<|end|>"), e, u, *tok.encode("sun"), e, a]
    assert tok.render(messages)[0] == expected
    text = env().from_string(tok.chat_template()).render(messages=messages, add_generation_prompt=True)
    assert text.replace("\ue000", "") == "<|system|>be<|end|><|user|>a<|end|><|end|><|user|>sun<|end|><|assistant|>"
    assert tok.encode_with_role_names(text) == expected
    assert tok.encode_with_role_names(tok.fit(text, role_names=True).text) == expected  # a completions prompt
