"""openai_api.py without a server: requests read into settings, pieces shaped into OpenAI's responses and events."""
import asyncio
import json

import pytest

from nanogpt.openai_api import (CHAT, BadRequest, collect, error_body, events, json_object, parse_chat,
                                parse_completion)


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
