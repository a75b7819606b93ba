"""From a validated OpenAI body to the engine requests that answer it (a `Job`).

`completion_prompts` and `chat_prompts` check what can be checked before tokenizing
(prompt size, `response_format`, the proposer), tokenize on the tokenizer threads, check
each prompt against the context and the vocabulary (token-id prompts), and plan one
`GenerationRequest` per choice: `n` choices per prompt, choice `i` of a list of `P` prompts
at index `p * n + j` as OpenAI numbers them. A seeded request seeds choice `i` with
`seed + i`, so the same request gives the same choices, whatever the speculation. A
request's `speculative` picks among the proposers the service offers
(`speculative_choices`), never a path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from argosy.serving.errors_http import ApiError
from argosy.serving.schema import ChatBody, CompletionBody
from argosy.serving.shapes import Shape
from argosy.serving.types import GenerationRequest

_SEED_MOD = 2**64


@dataclass
class Job:
    """The engine requests of one HTTP request and how to shape their answer."""

    requests: list[GenerationRequest]
    stops: list[str]
    shape: Shape
    prompt_tokens: int
    prefix: dict[int, str] = field(default_factory=dict)
    """Text a choice starts with (`echo`: its prompt)."""

    def finish(self, choices: Sequence[Any]) -> dict[str, Any]:
        """The whole answer of `choices` (`streaming.Choice`s)."""
        for choice in choices:
            choice.text = self.prefix.get(choice.index, "") + choice.text
        return self.shape.full(choices, self.prompt_tokens)


async def completion_prompts(server: Any, body: CompletionBody) -> Job:
    """`/v1/completions`: text, texts, token ids or lists of token ids."""
    prompts = body.prompts()
    server.check_prompt(sum(len(p) for p in prompts if isinstance(p, str)), "prompt")
    speculative = request_speculative(server.engine, body.speculative)
    ids = await server.tokenize(_encode_all, server.engine, prompts)
    _check_vocabulary(server.engine, ids)
    context = server.context()
    requests: list[GenerationRequest] = []
    prefix: dict[int, str] = {}
    texts = await server.tokenize(_texts, server.engine, prompts, ids) if body.echo else []
    for p, prompt_ids in enumerate(ids):
        max_tokens = body.max_tokens_for(len(prompt_ids), context)
        _check_length(len(prompt_ids), max_tokens, context, "prompt")
        for j in range(body.n):
            index = p * body.n + j
            params = body.sampling(max_tokens, body.logprobs)
            requests.append(_request(prompt_ids, params, speculative, index))
            if body.echo:
                prefix[index] = texts[p]
    shape = Shape(server.name, "text", logprobs=body.logprobs is not None)
    for index, text in prefix.items():
        shape.offset_from(index, len(text))
    prompt_tokens = sum(len(i) for i in ids)
    return Job(requests, body.stop_strings(), shape, prompt_tokens, prefix)


async def chat_prompts(server: Any, body: ChatBody) -> Job:
    """`/v1/chat/completions`: the messages through the model's chat template."""
    server.check_prompt(body.prompt_chars(), "messages")
    _check_response_format(body)
    speculative = request_speculative(server.engine, body.speculative)
    tools = body.template_tools()
    args = (body.template_messages(),) if tools is None else (body.template_messages(), tools)
    ids = list(await server.tokenize(server.engine.encode_chat, *args))
    context = server.context()
    max_tokens = body.max_tokens_for(len(ids), context)
    _check_length(len(ids), max_tokens, context, "messages")
    params = body.sampling(max_tokens, body.top_count())
    requests = [_request(ids, params, speculative, j) for j in range(body.n)]
    shape = Shape(server.name, "chat", logprobs=body.logprobs)
    return Job(requests, body.stop_strings(), shape, len(ids))


def _request(ids: list[int], params: Any, speculative: str | None, index: int) -> GenerationRequest:
    if params.seed is not None and index:
        from dataclasses import replace

        params = replace(params, seed=(params.seed + index) % _SEED_MOD)
    return GenerationRequest(tuple(ids), params, speculative)


def _encode_all(engine: Any, prompts: Sequence[str | list[int]]) -> list[list[int]]:
    return [engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def _texts(engine: Any, prompts: Sequence[str | list[int]], ids: list[list[int]]) -> list[str]:
    return [
        p if isinstance(p, str) else engine.decode(i) for p, i in zip(prompts, ids, strict=True)
    ]


def _check_vocabulary(engine: Any, ids: list[list[int]]) -> None:
    vocab = getattr(engine, "vocab_size", None)
    for prompt_ids in ids:
        if not prompt_ids:
            raise ApiError(400, "prompt: is empty once tokenized", "prompt")
        bad = [t for t in prompt_ids if t < 0 or (vocab and t >= vocab)]
        if bad:
            message = f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab})"
            raise ApiError(400, message, "prompt")


def _check_length(prompt: int, max_tokens: int, context: int, field_name: str) -> None:
    if prompt + max_tokens > context:
        message = (
            f"{field_name} is {prompt} tokens; with max_tokens {max_tokens} it exceeds {context}"
        )
        raise ApiError(400, message, field_name, "context_length_exceeded")


_MODEL_FREE = ("auto", "ngram")
"""Proposers that load nothing and hold no model: offered by every service that speculates."""


def speculative_choices(configured: str) -> list[str]:
    """The proposers a request may name on a service started with `--speculative
    configured`: `off`; unless that is `off`, also `auto` and `ngram` (they load nothing)
    and the service's own proposer (`self`, `draft`), which runs with the service's own
    depth or checkpoint. Never another model: a request that could name one could make the
    worker load any directory it can read, outside the memory budget."""
    from argosy.serving.speculative import OFF, PROPOSERS, split_spec

    name, _ = split_spec(configured)
    if name == OFF:
        return [OFF]
    own = PROPOSERS.canonical(name)
    return [OFF, *_MODEL_FREE, *([] if own in _MODEL_FREE else [own])]


def request_speculative(engine: Any, requested: str | None) -> str | None:
    """The proposer spec a request runs with: None (the service's own setting), `off`, a
    model-free proposer, or the service's own spec in full when the request names its
    proposer. A request names a proposer only, never a path or argument (`draft:PATH`,
    `self:K`), and only one of `speculative_choices`: else a 400 listing them."""
    if requested is None:
        return None
    from argosy.serving.speculative import OFF, PROPOSERS, split_spec

    configured = str(getattr(getattr(engine, "config", None), "speculative", OFF))
    choices = speculative_choices(configured)
    offered = ", ".join(choices)
    name, arg = split_spec(requested)
    shown = name[:40]
    if arg is not None:
        message = (
            f"speculative '{shown}:...': a request names a proposer only, never a path or "
            f"an argument; this service offers: {offered}"
        )
        raise ApiError(400, message, "speculative")
    canonical = name if name == OFF or name not in PROPOSERS else PROPOSERS.canonical(name)
    if canonical not in choices:
        message = f"speculative '{shown}' is not offered by this service; choose one of: {offered}"
        raise ApiError(400, message, "speculative")
    own, _ = split_spec(configured)
    if canonical != OFF and own != OFF and canonical == PROPOSERS.canonical(own):
        return configured  # the service's proposer with its own depth or checkpoint
    return canonical


def _check_response_format(body: ChatBody) -> None:
    kind = body.response_format.type if body.response_format else "text"
    if kind == "json_schema":
        message = "response_format json_schema is not served (text and json_object are)"
        raise ApiError(400, message, "response_format")
    if kind == "json_object" and not any("json" in m.text().lower() for m in body.messages):
        message = "response_format json_object needs the word JSON in the messages"
        raise ApiError(400, message, "response_format")
