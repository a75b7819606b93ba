"""A service spec refuses at submit what no replica could serve: an unknown model name,
a `draft` without its checkpoint path, a malformed method argument; `draft:/PATH` and
`self:K` are accepted (the path is checked by `argosy serve` on the replica's node)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from argosy.server.service_spec import ServiceSpec


def _refusal(**fields: object) -> str:
    with pytest.raises(ValidationError) as err:
        ServiceSpec(name="chat", **fields)
    return str(err.value)


@pytest.mark.parametrize(
    "spec",
    [
        "draft:/srv/drafts/smol",
        "self",
        "self:3",
        "early-exit:2",
        "off",
        "auto",
        "ngram",
        "prompt-lookup",
    ],
)
def test_a_method_with_the_argument_it_needs_is_accepted(spec: str) -> None:
    assert ServiceSpec(name="chat", speculative=spec).speculative == spec


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("draft", "'draft' needs the absolute path of a checkpoint"),
        ("draft:", "'draft' needs the absolute path of a checkpoint"),
        ("draft:relative/dir", "'draft' needs the absolute path of a checkpoint"),
        ("self:x", "'self:x': the depth is a whole number of layers"),
        ("self:0", "'self:0': the depth is a whole number of layers"),
        ("ngram:5", "'ngram' takes no argument"),
        ("off:x", "'off' takes no argument"),
        ("bogus", "known: "),
        ("DRAFT:/x", "'DRAFT' is not a method name"),
    ],
)
def test_a_method_without_its_argument_is_refused_with_the_reason(spec: str, want: str) -> None:
    assert want in _refusal(speculative=spec)


def test_an_unknown_model_name_is_refused_listing_the_catalog() -> None:
    message = _refusal(model="nosuch")
    assert "unknown model 'nosuch'" in message and "smollm2-135m" in message


@pytest.mark.parametrize("model", ["smollm2-135m", "/srv/models/llama", "./ckpt", "~/ckpt"])
def test_a_catalog_name_or_a_path_is_accepted(model: str) -> None:
    assert ServiceSpec(name="chat", model=model).model == model
