"""The attack corpus as data (run by test_attack_corpus.py): one row per case, naming who
sends what (attack_helpers: `api` with a bearer token, `console` with a session and its
CSRF token, `raw` as written, `cookie_only`), the status that must come back, and what
the answer must say (case-insensitive; the field or the limit a refusal names).

Rows are kept one or two lines each (`fmt: off`): a table reads down, not across.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from attack_helpers import api, console, cookie_only, raw
from server_helpers import STEPS, WORKDIR

TEN_MB = 10 << 20
CAP = "limit of 1048576 bytes (max_body_bytes)"
UNKNOWN_TOKEN = "missing or unknown token"
CROSS_SITE = "cross-site request refused"
CSRF = "csrf token is missing or out of date"
ADMIN_ONLY = "needs an admin token"
NOT_YOURS = "output is for queue 'team-b' and admins"
JOB = {"name": "probe", "queue": "team-a", "script": STEPS, "workdir": WORKDIR}
SERVICE = {"name": "probe", "queue": "team-a"}
FORM = {"name": "form-probe", "queue": "team-a", "script": "steps.py", "workdir": WORKDIR}
REPORT = b'{"runs": [{"policy": "fifo", "five_factor": {}}]}'
JSON_TYPE = {"Content-Type": "application/json"}
FORM_TYPE = {"Content-Type": "application/x-www-form-urlencoded"}
OTHER_PORT = {"Origin": "http://127.0.0.1:{other_port}"}


@dataclass(frozen=True)
class Attack:
    """One case: what is sent, the status that must come back, and what it must say."""

    name: str
    send: Any  # attack_helpers.Send
    want: int | tuple[int, ...]
    says: tuple[str, ...] = ()
    """Case-insensitive substrings of the answer: the field or limit the refusal names."""
    sent: dict | None = None
    """For an input the server accepts: the body, which must be stored as sent (the case
    may then add exactly one job)."""


def case(name: str, send: Any, want: int | tuple[int, ...], *says: str, **kw: Any) -> Any:
    return pytest.param(Attack(name, send, want, says, **kw), id=name)


def job(**fields: Any) -> dict:
    return JOB | fields


def post_job(who: str = "team-a", **kw: Any) -> Any:
    return api(who, "POST", "/api/v1/jobs", **kw)


def post_raw_job(body: bytes | Iterator[bytes]) -> Any:
    """A job body sent as these bytes (a generator: streamed in chunks, no length)."""
    return api("team-a", "POST", "/api/v1/jobs", content=body, headers=JSON_TYPE)


def upload(who: str, name: str, body: bytes = REPORT) -> Any:
    return console(who, "POST", "/sim", files={"report": (name, body)})


def chunks(data: bytes, size: int = 64 << 10) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def nested(depth: int) -> bytes:
    """A job body whose `elastic` nests `depth` objects."""
    head = json.dumps(JOB).encode()[:-1] + b', "elastic": '
    return head + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


def yaml_job(extra: str) -> dict[str, str]:
    return {"yaml": f"name: x\nqueue: team-a\nscript: {STEPS}\nworkdir: {WORKDIR}\n{extra}"}


HUGE_BODY = json.dumps(job(args=["x" * 1000] * (TEN_MB // 1000))).encode()
YAML_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n" for p, k in zip("abcdefg", "bcdefgh", strict=True)
)

# fmt: off
TENANT = [
    case("submit-to-other-queue", post_job(json=job(queue="team-b")),
         403, "may submit only to queue 'team-a'"),
    case("submit-to-default-queue", post_job(json=job(queue="default")),
         403, "may submit only to queue 'team-a'"),
    case("cancel-in-other-queue", api("team-a", "POST", "/api/v1/jobs/{job_b}/cancel"),
         403, "may cancel only in queue 'team-a'"),
    case("service-in-other-queue",
         api("team-a", "POST", "/api/v1/services", json=SERVICE | {"queue": "team-b"}),
         403, "may create services only in queue 'team-a'"),
    case("delete-other-queues-service", api("team-a", "DELETE", "/api/v1/services/{service_b}"),
         403, "may delete only in queue 'team-a'"),
    case("create-queue-token-as-queue",
         api("team-a", "POST", "/api/v1/tokens", json={"queue": "team-a", "name": "more"}),
         403, ADMIN_ONLY),
    case("create-admin-token-as-queue", api("team-a", "POST", "/api/v1/tokens", json={}),
         403, ADMIN_ONLY),
    case("revoke-token-as-queue", api("team-a", "DELETE", "/api/v1/tokens/{token_b}"),
         403, ADMIN_ONLY),
    case("revoke-admin-token-as-queue", api("team-a", "DELETE", "/api/v1/tokens/{admin_token}"),
         403, ADMIN_ONLY),
    case("list-tokens-as-queue", api("team-a", "GET", "/api/v1/tokens"), 403, ADMIN_ONLY),
    case("revoke-the-servers-admin-token",
         api("admin", "DELETE", "/api/v1/tokens/{admin_token}"), 409, "cannot be revoked"),
    case("uncordon-as-queue", api("team-a", "POST", "/api/v1/nodes/{node}/uncordon"),
         403, ADMIN_ONLY),
    case("cordon-as-queue", api("team-a", "POST", "/api/v1/nodes/{node}/cordon"), 403, ADMIN_ONLY),
    case("health-verdict-as-queue",
         api("team-b", "POST", "/api/v1/nodes/{node}/health", json={"verdict": "repair"}),
         403, ADMIN_ONLY),
    case("console-uncordon-as-queue", console("team-a", "POST", "/nodes/{node}/uncordon"),
         403, ADMIN_ONLY),
    case("console-submit-to-other-queue",
         console("team-a", "POST", "/submit", data=FORM | {"queue": "team-b"}),
         403, "may submit only to queue 'team-a'"),
    case("console-cancel-in-other-queue", console("team-a", "POST", "/jobs/{job_b}/cancel"),
         403, "may cancel only in queue 'team-a'"),
    case("console-overwrite-other-queues-report", upload("team-a", "b-report.json"),
         403, "uploaded by queue 'team-b'"),
    case("console-overwrite-admins-report", upload("team-b", "admin-report.json"),
         403, "uploaded by an admin"),
    # Idempotency keys are each token's own: another queue's key is a new job of this
    # token's queue, with nothing of the other job in it (no oracle, no squatting).
    case("idempotency-key-of-other-queue",
         post_job(json=job(name="job_b"), headers={"Idempotency-Key": "job_b"}),
         201, sent=job(name="job_b")),
    # States are open to every token (docs/server.md); output is the queue's and admins'.
    case("read-other-queues-job", api("team-a", "GET", "/api/v1/jobs/{log_job}"), 200, "log-b"),
    case("read-other-queues-logs", api("team-a", "GET", "/api/v1/jobs/{log_job}/logs"),
         403, NOT_YOURS),
    case("read-other-queues-launcher-log",
         api("team-a", "GET", "/api/v1/jobs/{log_job}/logs", params={"rank": "launcher"}),
         403, NOT_YOURS),
    case("read-other-queues-service-logs",
         api("team-a", "GET", "/api/v1/services/{service_b}/logs"), 403, NOT_YOURS),
    case("console-read-other-queues-log",
         console("team-a", "GET", "/jobs/{log_job}/log", csrf="none"), 403, NOT_YOURS),
    case("read-own-queues-logs", api("team-b", "GET", "/api/v1/jobs/{log_job}/logs"),
         200, "step 2"),
    case("admin-reads-any-log", api("admin", "GET", "/api/v1/jobs/{log_job}/logs"), 200, "step 2"),
]

CSRF_TARGETS = {  # console POSTs that would change something if they got through
    "uncordon": ("/nodes/{node}/uncordon", {}),
    "submit": ("/submit", {"data": FORM}),
    "cancel": ("/jobs/{job_b}/cancel", {}),
    "sim": ("/sim", {"files": {"report": ("csrf.json", REPORT)}}),
}
ORIGINS = {  # headers a page elsewhere makes a browser send, and what the refusal says
    "origin-other-port": (OTHER_PORT, CROSS_SITE),
    "origin-other-host": ({"Origin": "http://localhost:{port}"}, CROSS_SITE),
    "origin-null": ({"Origin": "null"}, CROSS_SITE),
    "origin-https": ({"Origin": "https://127.0.0.1:{port}"}, CROSS_SITE),
    "fetch-site-cross-site": ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site is 'cross-site'"),
    "fetch-site-same-site": ({"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site is 'same-site'"),
    "htmx-other-port": (OTHER_PORT | {"HX-Request": "true"}, CROSS_SITE),
}
CSRF_TOKENS = {"missing": "none", "wrong": "x" * 43, "other-session": "team-a"}
CSRF_CASES = [
    case(f"{origin}-{target}", console("admin", "POST", path, headers=headers, **kw), 403, says)
    for origin, (headers, says) in ORIGINS.items()
    for target, (path, kw) in CSRF_TARGETS.items()
] + [
    case(f"csrf-{how}-{target}", console("admin", "POST", path, csrf=token, **kw), 403, CSRF)
    for how, token in CSRF_TOKENS.items()
    for target, (path, kw) in CSRF_TARGETS.items()
] + [
    case("login-from-other-port", raw("POST", "/login", OTHER_PORT | FORM_TYPE, b"token=x"),
         403, CROSS_SITE),
    case("logout-from-other-port", console("team-a", "POST", "/logout", headers=OTHER_PORT),
         403, CROSS_SITE),
    case("host-and-origin-spoofed-no-csrf",
         console("admin", "POST", "/nodes/{node}/uncordon", csrf="none",
                 headers={"Host": "evil.example:{port}", "Origin": "http://evil.example:{port}"}),
         403, CSRF),
    case("cookie-as-bearer",
         raw("GET", "/api/v1/jobs", {"Authorization": "Bearer {dead_session}"}),
         401, UNKNOWN_TOKEN),
    case("bearer-as-console-cookie", cookie_only("<admin>", "POST", "/nodes/{node}/uncordon"), 303),
    case("bearer-as-api-cookie",
         cookie_only("<admin>", "POST", "/api/v1/nodes/{node}/uncordon"), 401, UNKNOWN_TOKEN),
    case("api-cookie-cross-site",
         cookie_only("<admin>", "POST", "/api/v1/jobs", json=JOB,
                     headers={"Origin": "http://evil.example"}), 403, CROSS_SITE),
    case("logged-out-cookie-post",
         cookie_only("{dead_session}", "POST", "/nodes/{node}/uncordon",
                     data={"csrf": "{dead_csrf}"}), 303),
    case("logged-out-cookie-read", cookie_only("{dead_session}", "GET", "/jobs"), 303),
]

OVERSIZED = [
    case("10mb-json-body", post_raw_job(HUGE_BODY), 413, CAP),
    case("10mb-json-body-chunked", post_raw_job(chunks(HUGE_BODY)), 413, CAP),
    case("10mb-single-field", post_job(json=job(name="n" * TEN_MB)), 413, CAP),
    case("900kb-name-under-the-cap", post_job(json=job(name="n" * (900 << 10))), 422, '"name"'),
    case("100k-args", post_job(json=job(args=["a"] * 100_000)),
         422, '"args"', "at most 1000 items"),
    case("arg-over-max-arg-strlen", post_job(json=job(args=["a" * 200_000])),
         422, '"args"', "argument 0 is 200000 characters"),
    case("100k-nested-arrays", post_raw_job(b'{"name":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
         422, "nested deeper than 32 levels"),
    case("500-nested-objects-in-elastic", post_raw_job(nested(500)),
         422, "nested deeper than 32 levels"),
    case("10-nested-objects-in-elastic", post_raw_job(nested(10)), 422, '"elastic"'),
    # A request head over 64 KiB is refused before the app sees it (argosy.core.bounded_http):
    # 431 and the connection closed; a client still sending sees the reset (status 0).
    case("10mb-header", api("team-a", "GET", "/api/v1/queues", headers={"X-Big": "a" * TEN_MB}),
         (431, 0)),
    case("10mb-authorization-header",
         raw("GET", "/api/v1/jobs", {"Authorization": "Bearer " + "a" * TEN_MB}),
         (431, 0)),
    case("8kb-query-parameter",
         raw("GET", "/api/v1/jobs?name=" + "n" * 8000, {"Authorization": "Bearer <admin>"}),
         422, '"name"'),
    case("100kb-request-line",  # uvicorn refuses it before the app
         raw("GET", "/api/v1/jobs?name=" + "n" * 100_000, {"Authorization": "Bearer <admin>"}),
         400, "Invalid HTTP request"),
    case("10mb-login-token", api(None, "POST", "/login", data={"token": "t" * TEN_MB}), 413, CAP),
    case("login-token-over-200-chars", raw("POST", "/login", FORM_TYPE, b"token=" + b"t" * 300),
         422, "field 'token'"),
    case("10mb-yaml-field", console("team-a", "POST", "/submit", data={"yaml": "y" * TEN_MB}),
         413, CAP),
    case("yaml-field-over-100k-chars",
         console("team-a", "POST", "/submit", data={"yaml": "y" * 100_001}), 422, "field 'yaml'"),
    case("yaml-alias-bomb", console("team-a", "POST", "/submit", data={"yaml": YAML_BOMB}),
         422, "more than 100000 values once its aliases are expanded"),
    case("yaml-50k-nested", console("team-a", "POST", "/submit", data={"yaml": "[" * 50_000}),
         422, "nested too deeply"),
    case("sim-report-over-8mb", upload("team-a", "big.json", b" " * (9 << 20)),
         413, "sim report upload"),
    case("sim-report-100k-nested", upload("team-a", "deep.json", b"[" * 100_000 + b"]" * 100_000),
         422, "deep.json", "nested too deeply"),
]

NOT_INT = {"true": True, "float": 1.5, "text": "1", "null": None, "list": [1], "object": {"a": 1}}
NOT_STR = {"true": True, "int": 1, "float": 1.5, "null": None, "list": ["x"], "object": {"a": "x"}}
NOT_FLOAT = {"true": True, "text": "0.5", "list": [0.5], "object": {"a": 0.5}}
NOT_LIST = {"text": "x", "int": 1, "object": {"a": "x"}, "true-item": [True], "null-item": [None],
            "list-item": [["x"]]}
NOT_ELASTIC = {"int": 1, "text": "x", "list": [1], "bool-max": {"max_nnodes": True},
               "reversed": {"min_nnodes": 2, "max_nnodes": 1}}
NOT_TIDAL = {"bool-levels": {"levels": [True]}, "text-levels": {"levels": "x"},
             "empty-levels": {"levels": []}, "too-many-awake": {"levels": [1], "min_replicas": 9}}
NULLABLE = {"checkpoint_every", "memory_fraction"}
JOB_INTS = ("nproc_per_node", "nnodes", "checkpoint_every", "max_restarts", "priority")
JOB_STRS = ("name", "queue", "script", "workdir")
SERVICE_INTS = ("threads", "replicas", "port", "max_restarts", "priority")
SERVICE_STRS = ("name", "queue", "model", "engine", "speculative", "kind")


def confused(kind: str, fields: tuple[str, ...], values: dict[str, Any]) -> list[Any]:
    """Each field of a job or service given each wrong type: a 422 naming the field."""
    body, path = (JOB, "/api/v1/jobs") if kind == "job" else (SERVICE, "/api/v1/services")
    return [
        case(f"{kind}-{f}-{label}", api("team-a", "POST", path, raw_json=body | {f: v}),
             422, f'"{f}"')
        for f in fields
        for label, v in values.items()
        if not (v is None and f in NULLABLE)
    ]


TYPES = [
    *confused("job", JOB_INTS, NOT_INT),
    *confused("job", JOB_STRS, NOT_STR),
    *confused("job", ("args", "chips", "inject"), NOT_LIST),
    *confused("job", ("elastic",), NOT_ELASTIC),
    *confused("service", SERVICE_INTS, NOT_INT),
    *confused("service", SERVICE_STRS, NOT_STR),
    *confused("service", ("memory_fraction",), NOT_FLOAT),
    *confused("service", ("tidal",), NOT_TIDAL),
    case("job-nproc_per_node-true-exactly", post_job(json=job(nproc_per_node=True)),
         422, "nproc_per_node"),
    case("job-priority-1.5-exactly", post_job(json=job(priority=1.5)), 422, "priority"),
    case("job-unknown-key", post_job(json=job(nproc=2)), 422, '"nproc"', "extra"),
    case("job-body-a-list", post_job(json=[JOB]), 422, "body"),
    case("job-body-a-string", post_job(json="job"), 422, "body"),
    case("job-body-null", post_raw_job(b"null"), 422, "body"),
    case("job-body-empty", post_raw_job(b""), 422, "body", "required"),
    case("job-body-infinity", post_raw_job(b"Infinity"), 422, "body"),
    case("job-priority-nan", post_raw_job(json.dumps(job(priority=float("nan"))).encode()),
         422, "priority"),
    case("job-body-not-json", post_raw_job(b"{name: x"), 422, "JSON decode error"),
    case("job-body-not-utf8", post_raw_job(b'{"name": "\xff"}'), 422, "not UTF-8", "offset 10"),
    case("job-body-as-text-plain",
         post_job(content=json.dumps(JOB).encode(), headers={"Content-Type": "text/plain"}),
         422, "body"),
    case("console-nproc-per-node-true",
         console("team-a", "POST", "/submit", data=FORM | {"nproc_per_node": "true"}),
         422, "nproc_per_node"),
    case("token-expires-in-true",
         api("admin", "POST", "/api/v1/tokens", json={"queue": "team-a", "expires_in_s": True}),
         422, "expires_in_s"),
    case("token-name-control-chars",
         api("admin", "POST", "/api/v1/tokens", json={"queue": "team-a", "name": "a\nb"}),
         422, "name"),
]

UNICODE = [
    case("name-non-ascii", post_job(json=job(name="jöb")), 422, '"name"'),
    case("name-nul", post_job(raw_json=job(name="a\0b")), 422, '"name"'),
    case("name-lone-surrogate", post_job(raw_json=job(name="\udc80")), 422, "name", "surrogate"),
    case("args-lone-low-surrogate", post_job(raw_json=job(args=["\udc80"])),
         422, '"args"', "surrogate"),
    case("args-lone-high-surrogate", post_job(raw_json=job(args=["a\ud800"])),
         422, '"args"', "surrogate"),
    case("args-nul", post_job(raw_json=job(args=["a\0b"])), 422, "args", "NUL"),
    case("script-nul", post_job(raw_json=job(script=STEPS + "\0")), 422, "script", "NUL"),
    case("workdir-nul", post_job(raw_json=job(workdir=WORKDIR + "\0")), 422, "workdir", "NUL"),
    case("workdir-lone-surrogate", post_job(raw_json=job(workdir=WORKDIR + "/\udc80")),
         422, "workdir", "surrogate"),
    case("chips-lone-surrogate", post_job(raw_json=job(chips=["\udc80"])), 422, "chips"),
    case("queue-lone-surrogate-as-admin", post_job("admin", raw_json=job(queue="\udc80")),
         422, "queue"),
    case("inject-lone-surrogate", post_job(raw_json=job(inject=["\udc80"])), 422, "inject"),
    case("key-lone-surrogate", post_job(raw_json=JOB | {"\udc80": 1}), 422, "surrogate"),
    case("service-model-lone-surrogate",
         api("team-a", "POST", "/api/v1/services", raw_json=SERVICE | {"model": "\udc80"}),
         422, "model"),
    case("service-model-nul",
         api("team-a", "POST", "/api/v1/services", raw_json=SERVICE | {"model": "m\0"}),
         422, '"model"', "NUL"),
    case("token-name-lone-surrogate",
         api("admin", "POST", "/api/v1/tokens", raw_json={"queue": "team-a", "name": "\udc80"}),
         422, "name"),
    case("health-detail-lone-surrogate",
         api("admin", "POST", "/api/v1/nodes/{node}/health",
             raw_json={"verdict": "healthy", "detail": "\udc80"}), 422, "detail"),
    case("console-yaml-args-lone-surrogate",
         console("team-a", "POST", "/submit", data=yaml_job('args: ["\\udc80"]\n')),
         422, "args.0", "surrogate"),
    case("console-yaml-chips-lone-surrogate",
         console("team-a", "POST", "/submit", data=yaml_job('chips: ["\\udc80"]\n')),
         422, "chips.0", "surrogate"),
    case("sim-report-lone-surrogate",
         upload("team-a", "s.json", b'{"runs": [{"policy": "\\udc80", "five_factor": {}}]}'),
         422, "s.json", "runs.0.policy"),
    case("args-emoji-and-bidi-stored-as-sent",
         post_job(json=job(args=["\U0001f600", "\u202eevil", "é"])),
         201, sent=job(args=["\U0001f600", "\u202eevil", "é"])),
]

SIM_NAMES = {
    "dotdot-slash": "../x.json", "encoded-slash": "..%2fx.json", "absolute": "/tmp/x.json",
    "inner-dotdot": "a/../../x.json", "backslash": "..\\x.json", "dotdot": "..",
    "hidden-owner-file": ".b-report.json.owner", "not-json": "x.txt", "nul": "x\0.json",
    "onto-other-queues-report": "../b-report.json",
}
RAW_PATHS = {
    "static-dotdot-db": "/static/../argosy.db",
    "static-dotdot-token": "/static/../../admin.token",
    "static-encoded-dotdot": "/static/%2e%2e/%2e%2e/argosy.db",
    "static-encoded-slash": "/static/..%2f..%2fserver%2fconfig.py",
    "static-double-encoded": "/static/%252e%252e/argosy.db",
    "static-deep-passwd": "/static/../../../../../../etc/passwd",
    "static-encoded-passwd": "/static/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "api-job-encoded-dotdot": "/api/v1/jobs/..%2f..%2fadmin.token",
    "api-job-logs-dotdot": "/api/v1/jobs/%2e%2e/logs",
    "api-service-logs-dotdot": "/api/v1/services/..%2f..%2fadmin.token/logs",
    "sim-encoded-dotdot": "/sim/..%2fadmin.token",
    "sim-dotdot-json": "/sim/..%2f..%2fqueues.json",
}
TRAVERSAL = [
    case("script-climbs-out", post_job(json=job(script="../../../../etc/passwd")),
         422, "climbs out of its workdir"),
    case("script-absolute-not-runnable", post_job(json=job(script="/etc/passwd")),
         422, "neither a .py file nor executable"),
    case("script-missing", post_job(json=job(script="nope.py")), 422, "does not exist"),
    case("script-a-directory", post_job(json=job(script="/tmp")), 422, "not a regular file"),
    case("workdir-relative", post_job(json=job(workdir="relative")), 422, "is relative"),
    case("workdir-missing", post_job(json=job(workdir="/nonexistent")), 422, "is not a directory"),
    case("workdir-a-file", post_job(json=job(workdir="/etc/passwd")), 422, "is not a directory"),
    case("workdir-missing-field", post_job(json=job(workdir=None)), 422, "workdir", "required"),
    case("console-workdir-relative",
         console("team-a", "POST", "/submit", data=FORM | {"workdir": "relative"}),
         422, "absolute path"),
    *[case(f"sim-name-{label}", upload("team-a", name), 422, "report name")
      for label, name in SIM_NAMES.items()],
    *[case(f"raw-path-{label}", raw("GET", path, {"Authorization": "Bearer <admin>"}), 404)
      for label, path in RAW_PATHS.items()],
    case("console-sim-dotdot-report",
         console("team-a", "GET", "/sim/..%2fb-report.json", csrf="none"), 404),
    case("console-job-log-encoded-dotdot",
         console("team-a", "GET", "/jobs/..%2f..%2fadmin.token/log", csrf="none"), 404),
]

ENUMS = [
    case("service-engine-bogus",
         api("team-a", "POST", "/api/v1/services", json=SERVICE | {"engine": "bogus"}),
         422, "engine", "known"),
    case("service-speculative-bogus",
         api("team-a", "POST", "/api/v1/services", json=SERVICE | {"speculative": "bogus"}),
         422, "speculative"),
    case("jobs-state-filter-bogus",
         api("team-a", "GET", "/api/v1/jobs", params={"state": "bogus"}), 422, '"state"'),
    case("services-state-filter-bogus",
         api("team-a", "GET", "/api/v1/services", params={"state": "bogus"}), 422, '"state"'),
    case("console-jobs-state-bogus", console("team-a", "GET", "/jobs?state=bogus", csrf="none"),
         422, "unknown state"),
    case("health-verdict-bogus",
         api("admin", "POST", "/api/v1/nodes/{node}/health", json={"verdict": "bogus"}),
         422, "verdict"),
    case("logs-rank-bogus", api("team-b", "GET", "/api/v1/jobs/{log_job}/logs?rank=bogus"),
         422, "rank"),
    case("logs-rank-negative", api("team-b", "GET", "/api/v1/jobs/{log_job}/logs?rank=-1"),
         422, "rank"),
    case("token-expires-bogus",
         api("admin", "POST", "/api/v1/tokens", json={"queue": "team-a", "expires": "30x"}),
         422, "expires"),
    case("token-unknown-queue", api("admin", "POST", "/api/v1/tokens", json={"queue": "team-c"}),
         422, "team-c"),
    case("submit-unknown-queue-as-admin", post_job("admin", json=job(queue="team-c")),
         422, "team-c"),
    case("method-put-jobs", api("team-a", "PUT", "/api/v1/jobs", json=JOB), 405),
    case("method-delete-job", api("team-a", "DELETE", "/api/v1/jobs/{job_a}"), 405),
]

LISTINGS = {"jobs": "/api/v1/jobs", "events": "/api/v1/events", "services": "/api/v1/services",
            "job-events": "/api/v1/jobs/{job_b}/events"}
BAD_PAGES = [("cursor", "negative", -1), ("cursor", "huge", 2**62 + 1), ("cursor", "text", "abc"),
             ("cursor", "float", "1.5"), ("limit", "zero", 0), ("limit", "negative", -5),
             ("limit", "over-500", 501), ("limit", "huge", 10**30)]
PAGES = [
    case(f"{name}-{param}-{label}", api("team-a", "GET", path, params={param: value}),
         422, f'"{param}"')
    for name, path in LISTINGS.items()
    for param, label, value in BAD_PAGES
] + [
    case("jobs-cursor-at-the-end", api("team-a", "GET", "/api/v1/jobs", params={"cursor": 2**62}),
         200, '"items":[]'),
    case("logs-offset-negative", api("team-b", "GET", "/api/v1/jobs/{log_job}/logs?offset=-1"),
         422, "offset"),
    case("logs-offset-huge",
         api("team-b", "GET", "/api/v1/jobs/{log_job}/logs", params={"offset": 2**62}), 200),
    case("console-jobs-before-negative", console("team-a", "GET", "/jobs?before=-1", csrf="none"),
         422, "before"),
]

BAD_AUTH = {
    "none": None, "scheme-only": "Bearer", "scheme-space": "Bearer ",
    "two-spaces": "Bearer  x", "basic": "Basic YWRtaW46YWRtaW4=", "admin-plus-x": "Bearer <admin>x",
    "10k-chars": "Bearer " + "a" * 10_000, "non-ascii": "Bearer \u00e9\u00e9",
    "forged-id": "Bearer argosy_t000000000000_" + "A" * 43, "token-as-basic": "Basic <admin>",
}
AUTH = [
    case(f"auth-{label}-{method.lower()}",
         raw(method, "/api/v1/jobs", JSON_TYPE | ({"Authorization": value} if value else {}),
             json.dumps(JOB).encode() if method == "POST" else b""),
         401, UNKNOWN_TOKEN)
    for method in ("GET", "POST")
    for label, value in BAD_AUTH.items()
] + [
    case("auth-revoked-token", api("revoked", "GET", "/api/v1/jobs"), 401, UNKNOWN_TOKEN),
    case("auth-expired-token", post_job("expired", json=JOB), 401, UNKNOWN_TOKEN),
    case("auth-empty-header", raw("GET", "/api/v1/jobs", {"Authorization": ""}),
         401, UNKNOWN_TOKEN),
]
# fmt: on

CORPUS = TENANT + CSRF_CASES + OVERSIZED + TYPES + UNICODE + TRAVERSAL + ENUMS + PAGES + AUTH
