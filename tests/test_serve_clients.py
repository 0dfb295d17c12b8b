"""serve.py driven by the clients users point at an OpenAI-compatible endpoint, each configured as its docs
say: openai (sync and async), litellm, llm, langchain-openai and Node's openai SDK, through what they send on
their own (typed fields as null, developer role, neutral tools and response_format, streaming with usage).
Each answer is checked against the text generate.py decodes for the same conversation alone."""
import asyncio
import json
import os
import shutil
import subprocess

import pytest
import torch

from model import GPTConfig
from nanogpt.generate import generate
from nanogpt.tokenizer import CharTokenizer, ChatTokenizer
from test_generate import sharp

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from serve import Service, running  # noqa: E402  (needs starlette)
from test_serve import CHARS  # noqa: E402

MODEL = "tiny-chat"
N = 12  # tokens per answer: greedy, so every client must get the same text
DEVELOPER = [{"role": "developer", "content": "Speak."}, {"role": "user", "content": "All:"}]
AGENT = [{"role": "user", "content": "First"},
         {"role": "assistant", "content": None,
          "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "Citizen"}]


@pytest.fixture(autouse=True)
def our_tiktoken_cache():
    """litellm points TIKTOKEN_CACHE_DIR at its own bundled files when it first counts tokens: ours is put back
    after each test, or a GPT-2 test run after this file in the same worker looks for r50k_base there, offline."""
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    yield
    if saved is None:
        os.environ.pop("TIKTOKEN_CACHE_DIR", None)
    else:
        os.environ["TIKTOKEN_CACHE_DIR"] = saved


@pytest.fixture(scope="module")
def chat_server():
    """(base URL of /v1, Service) of a tiny random chat model (role tokens after the characters)."""
    tok = ChatTokenizer(CharTokenizer(CHARS))
    model = sharp(GPTConfig(block_size=64, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32)).float().eval()
    with torch.no_grad():  # the role tokens' logits 0, below the best character's: every answer is N characters
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
        model.lm_head.weight[len(CHARS):] = 0
    service = Service(model, tok, MODEL, torch.device("cpu"), torch.float32, max_batch=2, max_queue=8)
    with running(service.app()) as url:
        yield url + "/v1", service


def reply(service, messages, n=N):
    """The greedy reply generate.py decodes (uncached) after the template's prompt for messages as this
    server reads them: developer as system, a tool's result as a user's turn, a tool call left out."""
    roles = {"developer": "system", "tool": "user"}
    turns = [{"role": roles.get(m["role"], m["role"]), "content": m["content"]} for m in messages
             if m["content"] is not None]
    tok = service.tokenizer
    ids = tok.render(turns)[0]
    out = generate(service.model, torch.tensor([ids]), n, temperature=0.0, use_cache=False)[0, len(ids):].tolist()
    assert max(out) < len(CHARS), out  # characters only (chat_server)
    return tok.decode(out)


@pytest.fixture
def client(chat_server):
    return openai.OpenAI(base_url=chat_server[0], api_key="none", max_retries=0, timeout=30)


# what typed SDKs send for fields left unset, and what OpenAI documents as "off"
NEUTRAL = dict(tools=None, tool_choice="none", parallel_tool_calls=False, response_format={"type": "text"},
               store=False, metadata={"run": "test"}, user="u-1", service_tier="auto", modalities=["text"],
               reasoning_effort=None, prediction=None, audio=None, functions=None, function_call=None)


def test_the_openai_client_with_neutral_parameters_and_the_developer_role(chat_server, client):
    url, service = chat_server
    r = client.chat.completions.create(model=MODEL, messages=DEVELOPER, max_tokens=N, temperature=0, **NEUTRAL)
    assert r.choices[0].message.content == reply(service, DEVELOPER) and r.choices[0].message.role == "assistant"
    want = reply(service, DEVELOPER)
    stop = want[len(want) // 2]  # parse() wants an answer that ended ("stop"), not one cut at max_tokens
    parsed = client.chat.completions.parse(model=MODEL, messages=DEVELOPER, max_completion_tokens=N, temperature=0,
                                           response_format={"type": "text"}, stop=[stop])
    assert parsed.choices[0].message.content == want[:want.index(stop)]
    assert parsed.choices[0].finish_reason == "stop"
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.chat is True


def test_the_openai_client_replays_an_agents_history(chat_server, client):
    r = client.chat.completions.create(model=MODEL, messages=AGENT, max_tokens=N, temperature=0)
    assert r.choices[0].message.content == reply(chat_server[1], AGENT)


def test_the_openai_client_streams_with_usage(chat_server, client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=DEVELOPER, max_tokens=N, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}, **NEUTRAL))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply(chat_server[1], DEVELOPER)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= len(text) > 0


def test_sampled_chat_top_logprobs_are_the_models_best_and_not_the_chosen_token(chat_server, client):
    """The chat API's top_logprobs are the k most likely tokens alone (OpenAI's; the completions API adds the
    chosen one): sampled at temperature 2, where many chosen tokens are not the most likely, top_logprobs=1
    gives each token's one best alternative, the argmax of the model's own forward."""
    service = chat_server[1]
    messages = [{"role": "user", "content": "All:"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=2.0, seed=3,
                                       logprobs=True, top_logprobs=1)
    content = r.choices[0].logprobs.content
    prompt = service.tokenizer.render(messages)[0]
    ids = prompt + service.tokenizer.encode("".join(t.token for t in content))
    with torch.no_grad():
        logp = torch.log_softmax(service.model(torch.tensor([ids]))[0][0].double(), -1)  # (T, V)
    for k, entry in enumerate(content):
        row = logp[len(prompt) - 1 + k]
        assert [t.token for t in entry.top_logprobs] == [CHARS[row.argmax()]], k
        assert entry.top_logprobs[0].logprob == pytest.approx(row.max().item(), abs=1e-4)
    assert sum(entry.token != entry.top_logprobs[0].token for entry in content) >= 5  # chosen, not the best


def test_usage_counts_the_prompt_once_whatever_n(chat_server, client):
    """n=3 answers to one prompt: prompt_tokens is the prompt's length (as OpenAI's), completion_tokens the
    three answers' N tokens each."""
    messages = [{"role": "user", "content": "All:"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=1.0, seed=3, n=3)
    assert r.usage.prompt_tokens == len(chat_server[1].tokenizer.render(messages)[0])
    assert [c.finish_reason for c in r.choices] == ["length"] * 3 and r.usage.completion_tokens == 3 * N
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@pytest.mark.parametrize("args, param", [
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]), "tools"),
    (dict(response_format={"type": "json_object"}), "response_format"),
])
def test_the_openai_client_is_told_what_is_not_supported(client, args, param):
    with pytest.raises(openai.BadRequestError, match="is not supported") as e:
        client.chat.completions.create(model=MODEL, messages=DEVELOPER, max_tokens=N, **args)
    assert e.value.body["param"] == param and e.value.body["code"] == "unsupported_value"


def test_the_sdks_parse_with_a_pydantic_schema_is_told_structured_output_is_not_supported(client):
    import pydantic

    class Answer(pydantic.BaseModel):
        text: str
    with pytest.raises(openai.BadRequestError, match="no structured output"):
        client.chat.completions.parse(model=MODEL, messages=DEVELOPER, max_tokens=N, response_format=Answer)


def test_the_async_openai_client(chat_server):
    url, service = chat_server

    async def talk():
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)
        whole = await client.chat.completions.create(model=MODEL, messages=DEVELOPER, max_tokens=N, temperature=0,
                                                     **NEUTRAL)
        stream = await client.chat.completions.create(model=MODEL, messages=AGENT, max_tokens=N, temperature=0,
                                                      stream=True, stream_options={"include_usage": True})
        pieces = [c async for c in stream]
        model = await client.models.retrieve(MODEL)
        await client.close()
        return whole, pieces, model
    whole, pieces, model = asyncio.run(talk())
    assert whole.choices[0].message.content == reply(service, DEVELOPER)
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == reply(service, AGENT)
    assert pieces[-1].usage is not None and model.id == MODEL


def test_litellm(chat_server):
    litellm = pytest.importorskip("litellm")
    url, service = chat_server
    args = dict(model=f"openai/{MODEL}", api_base=url, api_key="none", messages=DEVELOPER, max_tokens=N,
                temperature=0)
    r = litellm.completion(**args)
    assert r.choices[0].message.content == reply(service, DEVELOPER)
    chunks = list(litellm.completion(**args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply(service, DEVELOPER)


def test_llm(chat_server, tmp_path, monkeypatch):
    """llm's own way to an OpenAI-compatible server: extra-openai-models.yaml in its user directory."""
    llm = pytest.importorskip("llm")
    url, service = chat_server
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: tiny\n  model_name: {MODEL}\n  api_base: {url}\n")
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    model = llm.get_model("tiny")
    response = model.prompt("All:", system="Speak.", temperature=0, max_tokens=N)
    assert response.text() == reply(service, [{"role": "system", "content": "Speak."},
                                              {"role": "user", "content": "All:"}])
    streamed = "".join(model.prompt("All:", system="Speak.", temperature=0, max_tokens=N, stream=True))
    assert streamed == response.text()


def test_langchain_openai(chat_server):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    url, service = chat_server
    chat = ChatOpenAI(base_url=url, api_key="none", model=MODEL, temperature=0, max_tokens=N, max_retries=0,
                      stream_usage=True)
    messages = [SystemMessage("Speak."), HumanMessage("All:")]
    want = reply(service, [{"role": "system", "content": "Speak."}, {"role": "user", "content": "All:"}])
    assert chat.invoke(messages).content == want
    chunks = list(chat.stream(messages))
    assert "".join(c.content for c in chunks) == want and sum(c.usage_metadata is not None for c in chunks) >= 1
    history = [HumanMessage("First"), AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "call_1"}]),
               ToolMessage("Citizen", tool_call_id="call_1")]
    assert chat.invoke(history).content == reply(service, [
        {"role": "user", "content": "First"}, {"role": "user", "content": "Citizen"}])
    with pytest.raises(openai.BadRequestError, match="cannot call tools"):
        chat.bind_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]).invoke(
            messages)
    with pytest.raises(openai.BadRequestError, match="is not supported"):
        chat.with_structured_output({"title": "A", "type": "object", "properties": {"t": {"type": "string"}}},
                                    method="json_schema").invoke(messages)


NODE_SCRIPT = r"""
const OpenAI = require("openai");
const client = new OpenAI({ baseURL: process.argv[2], apiKey: "none", maxRetries: 0 });
(async () => {
  const messages = JSON.parse(process.argv[3]);
  const whole = await client.chat.completions.create({ model: "tiny-chat", messages, max_tokens: 12,
                                                       temperature: 0, tools: null, response_format: { type: "text" } });
  let streamed = "", usage = null;
  const stream = await client.chat.completions.create({ model: "tiny-chat", messages, max_tokens: 12, temperature: 0,
                                                        stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    if (chunk.choices.length) streamed += chunk.choices[0].delta.content || "";
    if (chunk.usage) usage = chunk.usage;
  }
  const model = await client.models.retrieve("tiny-chat");
  let refused = null;
  try {
    await client.chat.completions.create({ model: "tiny-chat", messages, tools: [{ type: "function",
                                           function: { name: "f", parameters: { type: "object" } } }] });
  } catch (e) { refused = { status: e.status, param: e.param, message: e.message }; }
  console.log(JSON.stringify({ whole: whole.choices[0].message.content, streamed, usage, id: model.id, refused }));
})().catch((e) => { console.error(String(e)); process.exit(1); });
"""


def node_with_openai():
    """The environment in which node finds the openai package (npm install -g openai), or None."""
    if not shutil.which("node") or not shutil.which("npm"):
        return None
    root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "NODE_PATH": root}
    found = subprocess.run(["node", "-e", "require('openai')"], env=env, capture_output=True)
    return env if found.returncode == 0 else None


def test_nodes_openai_sdk(chat_server, tmp_path):
    env = node_with_openai()
    if env is None:
        pytest.skip("needs node and Node's openai package (npm install -g openai)")
    url, service = chat_server
    script = tmp_path / "client.js"
    script.write_text(NODE_SCRIPT)
    run = subprocess.run(["node", str(script), url, json.dumps(DEVELOPER)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["whole"] == out["streamed"] == reply(service, DEVELOPER)
    assert out["id"] == MODEL and out["usage"]["completion_tokens"] > 0
    assert out["refused"]["status"] == 400 and out["refused"]["param"] == "tools"
