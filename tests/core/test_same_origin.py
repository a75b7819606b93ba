"""The Host and Origin checks shared by the control plane and `argosy serve`."""

from __future__ import annotations

import pytest

from argosy.core.same_origin import cross_site_reason, host_allowed, host_name, host_names


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "LocalHost.:80", "127.0.0.1", "127.0.0.1:8000",
     "[::1]:8000", "[::1]", "10.1.2.3:9", "[fd00::1]", None, "llm.internal:8000"],
)  # fmt: skip
def test_loopback_addresses_and_configured_names_are_allowed(host: str | None) -> None:
    assert host_allowed(host, {"llm.internal"})


@pytest.mark.parametrize(
    "host",
    ["rebind.attacker.example:8000", "localhost.attacker.example", "127.0.0.1.nip.io",
     "attacker@127.0.0.1", "127.0.0.1/x", "[evil]:80", "", " ", "local host", "::1",
     "llm.internal.attacker.example", "localhost:80:80"],
)  # fmt: skip
def test_other_names_and_malformed_hosts_are_refused(host: str) -> None:
    assert not host_allowed(host, {"llm.internal"})


def test_host_names_reads_a_list() -> None:
    assert host_names(" a.example, B.example:8000  c.example.,,") == {
        "a.example",
        "b.example",
        "c.example",
    }
    assert host_name("[::1]:80") == "::1"


def test_cross_site_checks_safe_methods_only_when_asked() -> None:
    cross = {"host": "localhost:8000", "sec-fetch-site": "cross-site"}
    assert cross_site_reason("GET", cross, "http") is None  # the control plane's rule
    assert cross_site_reason("GET", cross, "http", safe_methods_too=True)
    typed = {"host": "localhost:8000", "sec-fetch-site": "none"}
    assert cross_site_reason("GET", typed, "http", safe_methods_too=True) is None
    assert cross_site_reason("POST", typed, "http", safe_methods_too=True)
    same = {"host": "localhost:8000", "origin": "http://localhost:8000"}
    assert cross_site_reason("POST", same, "http", safe_methods_too=True) is None
    other = {"host": "localhost:8000", "origin": "http://localhost:8001"}
    assert cross_site_reason("GET", other, "http", safe_methods_too=True)
