"""The console in a real headless Chromium against a real `argosy server` process: log in,
submit a training job, watch it run through an injected fault and resume, cancel a job,
cordon a node, upload a simulator report; a screenshot of every page. Pages of other
origins (another port, another host name) cannot make a logged-in admin's browser
change anything, and every page runs under the Content-Security-Policy."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from console_helpers import ROOT, OtherSite, login, shot

from argosy.cli.demo import FaultInjector, read_progress
from argosy.server.store import Store

pytestmark = pytest.mark.integration
TRAIN = ROOT / "examples" / "train_gpt.py"
STEPS_SCRIPT = ROOT / "tests" / "server" / "scripts" / "steps.py"


def add_service_history(home: Path) -> None:
    """A service row and its replica events, written into the server's store as another
    process would (SQLite in WAL mode), for the services page to chart."""
    store = Store(f"sqlite:///{home}/argosy.db")
    sid = store.insert_service({"name": "chat-history", "queue": "default"}, now=time.time())["id"]
    store.add_event(sid, "replica_started", "replica 0 on vm port 1")
    store.add_event(sid, "replica_ready", "replica 0 healthy")
    store.close()


def job_id_of(pg) -> str:  # noqa: ANN001
    pg.wait_for_url(re.compile(r".*/jobs/j[0-9a-f]{12}$"))
    return pg.url.rsplit("/", 1)[-1]


def wait_state(pg, state: str, timeout_ms: int = 120_000) -> None:  # noqa: ANN001
    pg.wait_for_selector(f"#job-state:text-is('{state}')", timeout=timeout_ms)


def test_login_sends_to_login_and_refuses_an_unknown_token(browser, server, admin_token):
    url, _ = server
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(url + "/jobs")
    assert "/login" in pg.url
    pg.fill("input[name=token]", "argosy_not-a-token")
    pg.click("button[type=submit]")
    assert "unknown token" in pg.inner_text(".flash.error")
    shot(pg, "login")
    pg.fill("input[name=token]", admin_token)
    pg.click("button[type=submit]")
    pg.wait_for_url(url + "/jobs")
    cookie = next(c for c in context.cookies() if c["name"] == "argosy_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    context.close()


def test_a_submitted_job_runs_through_an_injected_fault_and_resumes(page, server):
    url, home = server
    page.goto(url + "/submit")
    page.fill(
        "textarea[name=yaml]",
        f"name: console-gpt\nscript: {TRAIN}\n"
        "args: [--steps, 24, --ckpt-every, 4, --step-sleep, 0.2]\n",
    )
    page.fill("#submit-yaml input[name=workdir]", str(TRAIN.parent))
    page.click("#submit-yaml button[type=submit]")
    job_id = job_id_of(page)
    page.evaluate("window.stayedOnPage = 42")
    injector = FaultInjector(home / "runs" / job_id, job_id, rank=0, after_step=6)
    deadline = time.monotonic() + 120
    while not injector.fired:
        step, _ = read_progress(home / "runs" / job_id / "events.jsonl")
        injector.maybe_fire(step)
        assert time.monotonic() < deadline, "the job never passed step 6"
        time.sleep(0.2)
    page.wait_for_selector("#timeline tr.ev.fault:has-text('killed by signal 9')")
    resumed = "#timeline tr.ev.resume:has-text('attempt 1 resumed')"
    page.wait_for_selector(resumed)
    text = page.locator(resumed).first.inner_text()  # re-read: the timeline is re-rendered
    want_step = int(re.search(r"resumed at step (\d+)", text).group(1))
    assert want_step >= 4  # from a checkpoint, not from scratch
    wait_state(page, "succeeded")
    goodput = page.inner_text("#goodput")
    assert re.search(r"restarts\s+1", goodput), goodput
    assert page.evaluate("window.stayedOnPage") == 42  # live updates, no reload
    page.wait_for_function("document.getElementById('log').textContent.includes('step 24')")
    shot(page, "job")


def test_a_running_job_is_cancelled_from_its_page(page, server):
    url, _ = server
    page.goto(url + "/submit")
    page.fill("#submit-fields input[name=name]", "to-cancel")
    page.fill("#submit-fields input[name=script]", str(STEPS_SCRIPT))
    page.fill("#submit-fields input[name=args]", "--steps 3000 --step-s 0.2")
    page.fill("#submit-fields input[name=workdir]", str(STEPS_SCRIPT.parent))
    page.click("#submit-fields button[type=submit]")
    job_id_of(page)
    wait_state(page, "running", 60_000)
    page.once("dialog", lambda d: d.accept())
    page.click("button:has-text('Cancel job')")
    wait_state(page, "cancelled", 60_000)


def test_jobs_list_links_each_job_by_name_and_filters_by_state(page, server, admin_token):
    url, _ = server
    auth = {"Authorization": f"Bearer {admin_token}"}
    body = {"name": "list-me", "script": str(STEPS_SCRIPT), "args": ["--fail"], "workdir": "/"}
    job = httpx.post(f"{url}/api/v1/jobs", json=body, headers=auth).json()
    page.goto(url + "/jobs")
    page.wait_for_selector("#jobs a:text-is('list-me')")
    shot(page, "jobs")
    page.select_option("select[name=state]", "failed")
    page.wait_for_url(re.compile(r".*state=failed.*"))
    page.wait_for_selector("#jobs a:text-is('list-me')", timeout=60_000)  # live table
    page.wait_for_timeout(3500)  # one live refresh later the table still holds the filter
    assert all(s == "failed" for s in page.locator("#jobs .state").all_inner_texts())
    page.locator("#jobs a:text-is('list-me')").click()  # a locator: the table is re-rendered
    page.wait_for_url(f"{url}/jobs/{job['id']}")
    page.wait_for_selector("h1:has-text('list-me')")


def test_a_node_is_cordoned_and_uncordoned(page, server):
    url, _ = server
    page.goto(url + "/nodes")
    page.click("#nodes button:text-is('Cordon')")
    page.wait_for_selector("#nodes td:has-text('cordoned')")
    shot(page, "nodes")
    page.click("#nodes button:text-is('Uncordon')")
    page.wait_for_selector("#nodes button:text-is('Cordon')")
    assert page.query_selector("#nodes td:has-text('cordoned')") is None


def test_a_queue_token_sees_an_error_message_when_submitting_elsewhere(
    browser, server, admin_token
):
    url, _ = server
    auth = {"Authorization": f"Bearer {admin_token}"}
    body = {"queue": "default", "name": "team"}
    token = httpx.post(f"{url}/api/v1/tokens", json=body, headers=auth).json()["token"]
    context = browser.new_context()
    pg = context.new_page()
    login(pg, url, token)
    assert "queue default" in pg.inner_text("nav .who")
    pg.goto(url + "/submit")
    pg.fill("textarea[name=yaml]", f"name: x\nqueue: other\nscript: {STEPS_SCRIPT}\n")
    pg.fill("#submit-yaml input[name=workdir]", str(STEPS_SCRIPT.parent))
    pg.click("#submit-yaml button[type=submit]")
    message = pg.wait_for_selector("#flash .flash.error").inner_text()
    assert "may submit only to queue 'default'" in message
    assert "Traceback" not in pg.content()
    pg.goto(url + "/nodes")
    assert pg.query_selector("#nodes button") is None  # cordons need admin
    context.close()


def test_overview_queues_services_and_a_simulator_report(page, server, sim_report: Path):
    url, _ = server
    page.goto(url + "/")
    page.wait_for_selector("#chips td:has-text('cpu')")
    page.wait_for_selector(".chart .uplot canvas")
    assert "effective training time" in page.inner_text("#factors")
    shot(page, "overview")
    page.goto(url + "/queues")
    page.wait_for_selector("#queues td a:text-is('default')")
    shot(page, "queues")
    add_service_history(server[1])
    page.goto(url + "/services")
    page.wait_for_selector("#services td:text-is('chat-history')")
    page.wait_for_selector(".chart .uplot canvas")  # ready replicas over the day
    shot(page, "services")
    page.goto(url + "/sim")
    page.set_input_files("input[name=report]", str(sim_report))
    page.click("#upload button[type=submit]")
    page.wait_for_url(url + "/sim/" + sim_report.name)
    page.wait_for_selector(".chart .uplot canvas")
    policies = page.inner_text("#sim-runs")
    assert all(p in policies for p in ("fifo", "quota", "argosy")), policies
    assert "blocked whole" in page.inner_text("#sim-idle")  # where device-time idled
    backfill = page.inner_text("#sim-backfill")  # reservations: argosy's column only
    assert "workloads reserved" in backfill and "resizes per elastic job-day" in backfill
    shot(page, "sim-report")


def attack_pages(console: str, node: str, name: str) -> dict[str, str]:
    """Pages that try, with the visitor's cookies, to submit a job (`name`) and to cordon
    `node`: by auto-submitted forms and by no-cors fetches."""
    workdir = str(STEPS_SCRIPT.parent)
    job = f"name: {name}\nscript: {STEPS_SCRIPT}\nargs: ['--steps', '1']\n"
    submit = (
        f'<form method="post" action="{console}/submit">'
        f'<textarea name="yaml">{html.escape(job)}</textarea>'
        f'<input name="workdir" value="{html.escape(workdir)}"></form>'
    )
    cordon = f'<form method="post" action="{console}/nodes/{node}/cordon"></form>'
    go = "<script>document.forms[0].submit()</script>"
    body = json.dumps({"yaml": job, "workdir": workdir})
    fetches = f"""<script>
    const opts = {{method: "POST", mode: "no-cors", credentials: "include"}};
    Promise.allSettled([
      fetch("{console}/submit", {{...opts, body: new URLSearchParams({body})}}),
      fetch("{console}/nodes/{node}/cordon", opts),
    ]).then(() => {{ document.title = "sent"; }});
    </script>"""
    return {"/submit.html": submit + go, "/cordon.html": cordon + go, "/fetch.html": fetches}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["other-port", "other-host-name"])
def test_pages_of_other_origins_cannot_change_anything(page, server, admin_token, host):
    url, _ = server
    auth = {"Authorization": f"Bearer {admin_token}"}
    node = httpx.get(f"{url}/api/v1/nodes", headers=auth).json()[0]["name"]
    with OtherSite(attack_pages(url, node, f"csrf-{host}")) as site:
        for path, target in (
            ("/submit.html", "/submit"),
            ("/cordon.html", f"/nodes/{node}/cordon"),
        ):
            page.goto(site.url(host, path))
            page.wait_for_url(url + target)
            assert "cross-site request refused" in page.inner_text("body")
        page.goto(site.url(host, "/fetch.html"))
        page.wait_for_function("document.title === 'sent'")
    jobs = httpx.get(f"{url}/api/v1/jobs", params={"limit": 500}, headers=auth).json()["items"]
    assert not [j["name"] for j in jobs if j["name"].startswith("csrf-")]
    assert not [
        n["name"] for n in httpx.get(f"{url}/api/v1/nodes", headers=auth).json() if n["cordoned"]
    ]
    page.goto(url + "/nodes")
    page.wait_for_selector("#nodes button:text-is('Cordon')")  # the admin is still logged in


CSP_WATCH = """window.cspViolations = [];
document.addEventListener("securitypolicyviolation",
  e => window.cspViolations.push(e.violatedDirective + " " + e.blockedURI));"""


def test_every_page_runs_under_the_csp_without_a_violation(page, server, admin_token):
    url, _ = server
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.context.add_init_script(CSP_WATCH)
    auth = {"Authorization": f"Bearer {admin_token}"}
    body = {"name": "csp-job", "script": str(STEPS_SCRIPT), "args": ["--fail"]}
    body["workdir"] = str(STEPS_SCRIPT.parent)
    job = httpx.post(f"{url}/api/v1/jobs", json=body, headers=auth).json()
    for path in (
        "/",
        "/queues",
        "/jobs",
        "/services",
        "/nodes",
        "/sim",
        "/submit",
        f"/jobs/{job['id']}",
    ):
        response = page.goto(url + path)
        assert "script-src 'self';" in response.headers["content-security-policy"], path
        assert response.status == 200, (path, response.status, page.inner_text("body")[:300])
        page.wait_for_timeout(300)  # the page's scripts ran (charts, log stream)
        assert page.evaluate("window.cspViolations || []") == [], path
    page.goto(url + "/submit")  # a flash message and its dismiss button (console.js)
    page.fill("textarea[name=yaml]", "name: [broken\n")
    page.click("#submit-yaml button[type=submit]")
    page.click("#flash .flash.error button.dismiss")
    page.wait_for_selector("#flash .flash.error", state="detached")
    assert errors == [] and page.evaluate("window.cspViolations || []") == []
    page.evaluate(
        "const s = document.createElement('script'); s.textContent = '1'; document.head.append(s)"
    )
    page.wait_for_function("(window.cspViolations || []).length > 0")  # the watch does see one


def test_a_stale_csrf_token_is_refused_with_a_message(page, server, admin_token):
    url, _ = server
    page.goto(url + "/nodes")
    page.evaluate("document.body.setAttribute('hx-headers', '{\"X-CSRF-Token\": \"stale\"}')")
    page.click("#nodes button:text-is('Cordon')")
    message = page.wait_for_selector("#flash .flash.error").inner_text()
    assert "CSRF token is missing or out of date" in message  # htmx swapped the 403 in
    auth = {"Authorization": f"Bearer {admin_token}"}
    assert not any(n["cordoned"] for n in httpx.get(f"{url}/api/v1/nodes", headers=auth).json())
