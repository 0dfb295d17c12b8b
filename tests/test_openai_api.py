"""openai_api.py without a server: requests read into settings, pieces shaped into OpenAI's responses and events."""
import asyncio
import json
import re

import pytest

from nanogpt.openai_api import CHAT, BadRequest, collect, error_body, events, json_object, parse_chat, parse_completion


async def listed(pieces):
    for piece in pieces:
        yield piece


def piece(index, text, finish_reason=None, tokens=0):
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason, "error": None,
            "tokens": tokens}


def test_a_completion_request_is_read_into_its_settings():
    req = parse_completion({"model": "m", "prompt": ["a", [1, 2]], "max_tokens": 5, "temperature": 0, "n": 2,
                            "stop": "x", "seed": 3, "top_p": 1, "stream": True,
                            "stream_options": {"include_usage": True}}, "m")
    assert (req.prompts, req.max_tokens, req.temperature, req.n, req.stops, req.seed) == (["a", [1, 2]], 5, 0.0, 2,
                                                                                          ["x"], 3)
    assert req.top_p is None and req.stream and req.include_usage and req.logprobs is None and not req.echo


def test_a_wrong_argument_is_openais_error_object():
    with pytest.raises(BadRequest) as e:
        parse_completion({"prompt": "a", "max_tokns": 5}, "m")
    assert error_body(e.value) == {"error": {"message": "unrecognized request argument: max_tokns (did you mean "
                                             "'max_tokens'?)", "type": "invalid_request_error", "param": "max_tokns",
                                             "code": None}}
    with pytest.raises(BadRequest, match="the body is a JSON list"):
        json_object(b"[1]")


def test_chat_pieces_collect_into_a_response_and_stream_as_chunks():
    req = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": 2}, "m", 64)
    assert req.prompts == [[{"role": "user", "content": "hi"}]] and req.max_tokens == 64
    pieces = [piece(0, "He"), piece(1, "Yo", "stop", 1), piece(0, "y", "length", 2)]
    usage = {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 0}
    whole = asyncio.run(collect(listed(pieces), {"id": "x"}, dict(usage), 2, CHAT))
    assert [c["message"]["content"] for c in whole["choices"]] == ["Hey", "Yo"]
    assert [c["finish_reason"] for c in whole["choices"]] == ["length", "stop"]
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}

    async def streamed():
        return [e async for e in events(listed(pieces), {"id": "x"}, dict(usage), True, CHAT)]
    sent = asyncio.run(streamed())
    assert sent[-1] == "data: [DONE]\n\n" and all(e.startswith("data: {") and e.endswith("\n\n") for e in sent[:-1])
    chunks = [json.loads(e[len("data: "):]) for e in sent[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [{"role": "assistant", "content": "He"},
                                                              {"role": "assistant", "content": "Yo"},
                                                              {"content": "y"}]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("neutral", [
    {"tools": None}, {"tools": []}, {"tool_choice": "none"}, {"tool_choice": "auto"}, {"parallel_tool_calls": False},
    {"parallel_tool_calls": True}, {"functions": None}, {"function_call": "none"},
    {"response_format": {"type": "text"}}, {"response_format": None}, {"store": False}, {"store": True},
    {"metadata": {"run": "7"}}, {"user": "u-1"}, {"safety_identifier": "s"}, {"prompt_cache_key": "k"},
    {"service_tier": "auto"}, {"service_tier": "default"}, {"stream_options": {"include_obfuscation": False}},
    {"modalities": ["text"]}, {"audio": None}, {"reasoning_effort": None}, {"reasoning_effort": "none"},
    {"verbosity": "medium"}, {"web_search_options": None}, {"prediction": {"type": "content", "content": "x"}},
    {"moderation": None}, {"prompt_cache_retention": None},
], ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_documented_chat_parameters_at_their_neutral_values_are_taken(neutral):
    """What the SDKs, LangChain and typed clients send on their own: OpenAI's documented parameters at values
    (or null) that ask nothing this server cannot do."""
    req = parse_chat({"messages": MESSAGES, **neutral}, "m", 64)
    assert req.prompts == [MESSAGES] and req.max_tokens == 64


@pytest.mark.parametrize("name, value, match", [
    ("tools", [{"type": "function", "function": {"name": "f"}}], "cannot call tools"),
    ("tool_choice", "required", "cannot call tools"),
    ("tool_choice", {"type": "function", "function": {"name": "f"}}, "cannot call tools"),
    ("response_format", {"type": "json_object"}, "cannot constrain the output to JSON"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "no structured output"),
    ("modalities", ["text", "audio"], "text only"),
    ("audio", {"voice": "alloy", "format": "wav"}, "no audio"),
    ("reasoning_effort", "high", "do not reason"),
    ("service_tier", "flex", "one service tier"),
    ("parallel_tool_calls", 1, "true or false"),
    ("web_search_options", {}, "cannot search the web"),
])
def test_a_value_this_server_cannot_honour_is_refused_as_not_supported(name, value, match):
    with pytest.raises(BadRequest, match=f"^{name}=.* is not supported: .*{match}") as e:
        parse_chat({"messages": MESSAGES, name: value}, "m", 64)
    assert (e.value.param, e.value.status, e.value.code) == (name, 400, "unsupported_value")


@pytest.mark.parametrize("body, match", [
    ({"tool": None}, "unrecognized request argument: tool (did you mean 'tools'?)"),
    ({"store": "yes"}, "store must be true or false"),
    ({"metadata": "x"}, "metadata must be an object"),
    ({"stream_options": {"include_usge": True}}, "unrecognized request argument: stream_options.include_usge"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
    ({"top_logprobs": 2, "logprobs": False}, "top_logprobs needs logprobs"),
])
def test_unknown_names_and_wrong_types_are_still_refused(body, match):
    with pytest.raises(BadRequest, match=re.escape(match)):
        parse_chat({"messages": MESSAGES, **body}, "m", 64)


def test_top_logprobs_with_logprobs_is_taken():
    assert parse_chat({"messages": MESSAGES, "logprobs": True, "top_logprobs": 3}, "m", 64).logprobs == 3
    assert parse_chat({"messages": MESSAGES, "logprobs": True}, "m", 64).logprobs == 0
    assert parse_chat({"messages": MESSAGES, "top_logprobs": None}, "m", 64).logprobs is None


def test_openais_other_roles_enter_the_prompt_as_the_templates():
    """developer is system; a tool's result is read as a user's turn; an assistant's tool call (content null)
    said nothing the model reads and is left out."""
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                       "function": {"name": "w", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Sunny."},
                {"role": "assistant", "content": [{"type": "text", "text": "It is "}, {"type": "text", "text": "sunny."}]}]
    assert parse_chat({"messages": messages}, "m", 64).prompts[0] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "user", "content": "Sunny."}, {"role": "assistant", "content": "It is sunny."}]


@pytest.mark.parametrize("content", [[{"type": "text", "text": 5}], [{"type": "text", "text": {"a": 1}}],
                                     [{"type": "text"}], None])
def test_a_content_part_whose_text_is_not_a_string_is_a_400(content):
    with pytest.raises(BadRequest, match="messages\\[0\\].content") as e:
        parse_chat({"messages": [{"role": "user", "content": content}]}, "m", 64)
    assert e.value.param == "messages"


def test_the_chat_template_writes_what_parse_messages_reads():
    """lm-eval renders /tokenizer_info's template itself: the same roles and the same left-out turns."""
    import jinja2

    from nanogpt.tokenizer import CharTokenizer, ChatTokenizer
    tok = ChatTokenizer(CharTokenizer(list("abc .")))
    messages = [{"role": "developer", "content": "a."}, {"role": "user", "content": "b"},
                {"role": "assistant", "content": None}, {"role": "tool", "content": "c"}]
    text = jinja2.Template(tok.chat_template()).render(messages=messages, add_generation_prompt=True)
    rendered = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in parse_chat({"messages": messages}, "m",
                                                                                   64).prompts[0])
    assert text == rendered + "<|assistant|>" == "<|system|>a.<|end|><|user|>b<|end|><|user|>c<|end|><|assistant|>"


def test_an_answer_holds_at_most_max_answer_values():
    """n x (echoed + generated tokens) x (1 + logprobs + 2): the size is known before any work."""
    from nanogpt.openai_api import MAX_ANSWER_VALUES, answer_values, check_answer_size
    req = parse_completion({"prompt": "x", "n": 64, "echo": True, "logprobs": 20, "max_tokens": 0}, "m")
    assert answer_values(req, [2000]) == 64 * 2000 * 23 > MAX_ANSWER_VALUES
    with pytest.raises(BadRequest, match="2,944,000 tokens and log-probabilities") as e:
        check_answer_size(req, [2000])
    assert e.value.param == "n"
    lm_eval_batch = parse_completion({"prompt": [[1]] * 16, "echo": True, "logprobs": 1, "max_tokens": 0}, "m")
    check_answer_size(lm_eval_batch, [1024] * 16)  # lm-eval's loglikelihood batches fit


@pytest.mark.parametrize("body, param, match", [
    (b'{"prompt": "ab\\ud800", "echo": true}', "prompt", "prompt holds '\\ud800', a lone surrogate"),
    (b'{"prompt": "a", "\\ud800": 1}', "\\ud800", "\\ud800 holds '\\ud800', a lone surrogate"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages", "messages holds '\\udfff'"),
    (b'{"prompt": "a", "logit_bias": {"' + b"9" * 5000 + b'": 1}}', "logit_bias",
     "logit_bias has a key of 5,000 digits; its keys are token ids"),
    (b'{"prompt": "a", "logit_bias": {"5": 1' + b"0" * 400 + b'}}', "logit_bias",
     "logit_bias of token 5 must be a number in [-100, 100], got an integer of 401 digits")],
    ids=["surrogate-in-prompt", "surrogate-as-name", "surrogate-in-messages", "key-of-5000-digits", "huge-bias"])
def test_text_utf8_cannot_write_and_numbers_python_cannot_read_are_a_400(body, param, match):
    """JSON's "\\ud800" parses as a lone surrogate, which no answer (nor error object) can encode; int() refuses a
    key of more than 4,300 digits. Each is a 400 naming the parameter, in an error object that is itself text."""
    with pytest.raises(BadRequest) as e:
        parse_completion(json_object(body), "m")
    assert e.value.status == 400 and e.value.param == param and match in str(e.value), str(e.value)
    json.dumps(error_body(e.value), ensure_ascii=False).encode("utf-8")  # as serve.py sends it


def test_a_surrogate_pair_is_one_character_and_taken():
    assert json_object(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}
