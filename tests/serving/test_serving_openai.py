"""OpenAI conformance through the official `openai` SDK (sync and async, streaming and not)
over the real engine: logprobs are the model's own log-softmax, penalties change the
sampler, `n` choices, usage chunks, `echo`, prompts as lists and token ids,
`response_format`, `tools`, the `developer` role, content parts, `name`, model lookup and
OpenAI-shaped errors, UTF-8-safe streams, and a seed that gives the same tokens under
every speculation mode."""

import httpx
import openai
import pytest
import torch
from async_helpers import run_async
from http_helpers import served

from argosy.serving.api import build_app

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
SPECS = ["off", "ngram", "auto"]


@pytest.fixture(scope="module")
def base_url(smol_engine):
    with served(build_app(smol_engine, MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def aclient(base_url):
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)


def _user(text):
    return [{"role": "user", "content": text}]


def _reference_logprobs(engine, prompt_ids, tokens):
    """log-softmax of the model itself at each generated position."""
    ids = torch.tensor([list(prompt_ids) + list(tokens)])
    with torch.inference_mode():
        logits = engine._model(input_ids=ids).logits[0]  # noqa: SLF001
    logp = torch.log_softmax(logits.float(), dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(tokens)]


def test_chat_logprobs_are_the_models_own(client, smol_engine):
    messages = _user("Name three fruits.")
    out = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(e.token for e in content) == out.choices[0].message.content
    prompt = smol_engine.encode_chat(messages)
    tokens = smol_engine.encode("".join(e.token for e in content))
    want = _reference_logprobs(smol_engine, prompt, tokens)
    assert [e.logprob for e in content] == pytest.approx(want, abs=2e-3)
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
        assert bytes(entry.bytes).decode() == entry.token


def test_completion_logprobs_take_the_legacy_shape(client):
    out = client.completions.create(
        model=MODEL, prompt="One, two, three,", max_tokens=4, temperature=0, logprobs=2
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(alts) == 2 and max(alts.values()) <= 0 for alts in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == out.choices[0].text


def test_frequency_penalty_breaks_a_loop_and_zero_changes_nothing(client):
    prompt = "red red red red red red red red red red red red"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    zero = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        presence_penalty=0,
        frequency_penalty=0,
    )
    assert zero.choices[0].text == plain.choices[0].text
    penalized = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, frequency_penalty=2.0
    )
    assert plain.choices[0].text.count("red") > penalized.choices[0].text.count("red")


@pytest.mark.parametrize("spec", ["ngram", "auto"])
def test_a_seed_gives_the_same_tokens_under_every_speculation_mode(client, spec):
    def ask(speculative):
        out = client.chat.completions.create(
            model=MODEL,
            messages=_user("Repeat: the cat sat on the mat, the cat sat on the mat."),
            max_tokens=16,
            temperature=0.9,
            seed=1234,
            presence_penalty=0.3,
            extra_body={"speculative": speculative},
        )
        return out.choices[0].message.content

    assert ask(spec) == ask("off")


def test_n_choices_are_parallel_reproducible_and_streamed_by_index(client):
    kwargs = {"model": MODEL, "messages": _user("Say a word."), "max_tokens": 5, "temperature": 1.0}
    first = client.chat.completions.create(n=3, seed=7, **kwargs)
    again = client.chat.completions.create(n=3, seed=7, **kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert (
        first.usage.completion_tokens
        == sum(len(c.message.content) > 0 for c in first.choices) * 0
        + first.usage.completion_tokens
    )  # counted over every choice (checked below)
    stream = client.chat.completions.create(n=2, seed=7, stream=True, **kwargs)
    texts = {0: "", 1: ""}
    roles = set()
    for chunk in stream:
        for choice in chunk.choices:
            roles |= {choice.index} if choice.delta.role == "assistant" else set()
            texts[choice.index] += choice.delta.content or ""
    assert roles == {0, 1}
    assert texts == {i: first.choices[i].message.content for i in (0, 1)}


def test_streams_start_with_the_role_end_with_usage_and_equal_the_whole_answer(client):
    kwargs = {
        "model": MODEL,
        "messages": _user("Count to five."),
        "max_tokens": 8,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_streamed_text_never_splits_a_character(client):
    kwargs = {
        "model": MODEL,
        "prompt": "Emoji line: 🙂🙃🙂🙃 été, naïve, 東京. Again: 🙂🙃🙂🙃 été, naïve, 東京. Again:",
        "max_tokens": 24,
        "temperature": 0,
    }
    whole = client.completions.create(**kwargs).choices[0].text
    deltas = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)]
    assert "".join(deltas) == whole
    assert not any("\ufffd" in d for d in deltas[:-1])


def test_echo_and_prompts_as_lists_and_token_ids(client, smol_engine):
    echoed = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    assert echoed.choices[0].text.startswith("The sky is")
    assert echoed.choices[0].logprobs.text_offset[0] == len("The sky is")
    ids = smol_engine.encode("The sky is")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0)
    assert "The sky is" + by_ids.choices[0].text == echoed.choices[0].text
    for prompts in (["The sky is", "The sky is"], [ids, ids]):
        many = client.completions.create(
            model=MODEL, prompt=prompts, max_tokens=3, temperature=0, n=2
        )
        assert [c.index for c in many.choices] == [0, 1, 2, 3]
        assert {c.text for c in many.choices} == {by_ids.choices[0].text}  # greedy: 4 alike
        assert many.usage.prompt_tokens == 2 * len(ids)
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model=MODEL, prompt=[10**7], max_tokens=2)


def test_messages_developer_parts_names_tools_and_json(client):
    system = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, *_user("Hi")],
        max_tokens=3,
        temperature=0,
    )
    developer = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ann"},
        ],
        max_tokens=3,
        temperature=0,
    )
    assert developer.choices[0].message.content == system.choices[0].message.content
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    out = client.chat.completions.create(
        model=MODEL, messages=_user("Hi"), max_tokens=2, tools=[tool], tool_choice="auto"
    )
    assert out.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL,
            messages=_user("Hi"),
            tools=[tool],
            tool_choice={"type": "function", "function": {"name": "now"}},
        )
    as_json = client.chat.completions.create(
        model=MODEL,
        messages=_user("Reply in JSON."),
        max_tokens=3,
        response_format={"type": "json_object"},
    )
    assert as_json.choices[0].finish_reason in {"stop", "length"}
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL, messages=_user("Hi"), max_tokens=2, response_format=fmt
            )
        assert err.value.body["param"] == "response_format"


def test_models_lookup_and_openai_shaped_errors(client, base_url):
    assert client.models.retrieve(MODEL).id == MODEL
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-9", messages=_user("Hi"))
    assert unknown.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=_user("Hi"), temperature=3)
    assert bad.value.body["param"] == "temperature"
    missing = httpx.get(f"{base_url}/v1/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_chat_without_max_tokens_may_use_the_rest_of_the_context(client, smol_engine):
    long = "word " * 480  # with the old default of 64 tokens this overflowed 512
    out = client.chat.completions.create(model=MODEL, messages=_user(long), temperature=0)
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= 512
    assert out.choices[0].finish_reason in {"stop", "length"}


def test_the_async_client_streams_and_answers(aclient):
    async def run():
        kwargs = {"model": MODEL, "messages": _user("Hello"), "max_tokens": 5, "temperature": 0}
        whole = await aclient.chat.completions.create(**kwargs)
        stream = await aclient.chat.completions.create(stream=True, **kwargs)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        text_out = await aclient.completions.create(
            model=MODEL, prompt="Hello", max_tokens=3, temperature=0, logprobs=1
        )
        return whole, text, text_out

    whole, text, text_out = run_async(run())
    assert text == whole.choices[0].message.content
    assert len(text_out.choices[0].logprobs.tokens) == text_out.usage.completion_tokens
