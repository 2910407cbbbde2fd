"""A researcher's and an admin's day in the portal, in headless Chromium.

The tests run in order on one platform (module scope) and share alice's browser
tab: she signs in, submits a job with a mistake and sees it marked on its line,
fixes it, watches it wait behind her own big job, stops that one from a second
tab, and sees the first go RUNNING then SUCCEEDED without the page reloading.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from libs.common.protocol import ssh
from tests.browser.conftest import PASSWORD, SUPERVISION, Rest, shot

_playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: `make test` installs "
                                  "the test extra (pip install -e '.[test]')")
expect, PlaywrightTimeout = _playwright.expect, _playwright.TimeoutError

pytestmark = pytest.mark.timeout(300)

TIMEOUT_MS = 60_000  # a loaded CI machine starts tasks slowly

# Fills the `default` VC (2 nodes x 8 one-CPU cells), so the next job there waits.
BLOCKER = """protocolVersion: 2
name: blocker
type: job
taskRoles:
  big:
    instances: 2
    resourcePerInstance: {cpu: 8, memoryMB: 256, gpu: 0}
    commands:
      - sleep 600
defaults:
  virtualCluster: default
"""

# Line 8 holds the mistake (instances must be a positive integer). It runs 4 s: long
# enough for a loaded machine's page to show RUNNING between WAITING and SUCCEEDED.
WITH_MISTAKE = """protocolVersion: 2
name: portal-hello
type: job
parameters:
  greeting: hello-from-the-portal
taskRoles:
  main:
    instances: lots
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - sleep 4
      - echo "<% $parameters.greeting %>"
defaults:
  virtualCluster: default
"""
MISTAKE_LINE = 8
VC_LINE = 14


@pytest.fixture(scope="module")
def context(browser, platform):
    ctx = own_context(browser)
    yield ctx
    ctx.close()


SCRIPT_ERRORS: list[str] = []


def watch_errors(tab) -> None:
    """Uncaught exceptions and console errors (a CSP violation is one); an answer of the API
    with an error status is logged by Chromium too, and is expected in these tests."""
    tab.on("pageerror", lambda exc: SCRIPT_ERRORS.append(f"{tab.url}: {exc}"))
    tab.on("console", lambda msg: SCRIPT_ERRORS.append(f"{tab.url}: {msg.text}")
           if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)


@pytest.fixture(autouse=True)
def no_script_errors():
    SCRIPT_ERRORS.clear()
    yield
    assert SCRIPT_ERRORS == []


@pytest.fixture(scope="module")
def page(context):
    """Alice's tab, kept across the tests of this module."""
    tab = context.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())
    watch_errors(tab)
    yield tab


@pytest.fixture(scope="module")
def url(rest: Rest) -> str:
    return rest.url


@pytest.fixture(scope="module")
def blocker(rest: Rest, users) -> str:
    job = rest.submit(BLOCKER, token=users["alice"])
    rest.wait_state(job, {"RUNNING"})
    return job


UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea, button')]
    .filter((el) => el.offsetParent !== null && el.type !== 'hidden')
    .filter((el) => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')
                      || (el.tagName === 'BUTTON' && el.textContent.trim()) || el.title))
    .map((el) => el.outerHTML.slice(0, 120))"""


def assert_labelled(tab) -> None:
    """Every visible control has a name a screen reader can say."""
    unlabelled = tab.evaluate(UNLABELLED)
    assert unlabelled == [], unlabelled


def own_context(browser):
    """A browser context of its own (the module's shared one is made so too): signed in to
    nobody, whatever another context's tests left in their storage. The caller closes it."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    return ctx


def sign_in(tab, url: str, username: str, *, remember: bool = False) -> None:
    tab.goto(url + "/")
    tab.get_by_label("User name").fill(username)
    tab.get_by_label("Password", exact=True).fill(PASSWORD)
    if remember:
        tab.get_by_label("Keep me signed in on this browser").check()
    tab.get_by_role("button", name="Sign in", exact=True).click()
    tab.wait_for_selector("#page-title:has-text('Cluster at a glance')")


def test_sign_in_shows_name_vcs_and_role(page, url, users):
    page.goto(url + "/")
    page.wait_for_selector("text=Sign in to PAI")
    assert_labelled(page)
    shot(page, "01-login")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password", exact=True).fill("not-her-password")
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_selector("[role=alert]:has-text('wrong username or password')")

    sign_in(page, url, "alice", remember=True)
    assert page.locator("#who-name").inner_text() == "alice"
    assert "default" in page.locator("#who-vcs").inner_text()
    assert page.locator("#who-role").is_hidden()  # not an admin
    assert page.locator("#nav-admin").is_hidden()
    page.wait_for_selector("#h-vcs")
    assert page.locator(".card h3", has_text="default").count() == 1
    assert_labelled(page)
    shot(page, "02-home")
    # Keyboard: after a navigation focus is on the page's title, so Tab goes on into the
    # content (not back through the top bar), and Enter follows a link.
    assert page.evaluate("document.activeElement.id") == "page-title"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.getAttribute('href')") == "#/jobs?state=WAITING"
    page.keyboard.press("Enter")
    page.wait_for_selector("#page-title:has-text('Jobs')")
    assert page.locator("#f-state").input_value() == "WAITING"


def test_a_mistake_is_marked_on_its_line_before_and_after_submit(page, url, rest, blocker):
    page.goto(url + "/#/submit")
    editor = page.locator("#job-text")
    editor.fill(WITH_MISTAKE)
    # The parameters field follows the YAML's parameters block.
    assert page.locator("#param-rows .pair-value").first.input_value() == "hello-from-the-portal"

    page.get_by_role("button", name="Check").click()
    marked = page.locator(f".gutter .ln.err[data-line='{MISTAKE_LINE}']")
    marked.wait_for()
    assert page.locator(".gutter .ln.err").count() == 1
    assert_labelled(page)
    item = page.locator("#job-errors li").first
    assert f"line {MISTAKE_LINE}" in item.inner_text()
    assert "instances" in item.inner_text()
    shot(page, "03-submit-error-marked")

    page.get_by_role("button", name="Submit", exact=True).click()  # refused the same way
    marked.wait_for()
    assert "portal-hello" not in page.url

    # A mistake found after parsing (no such VC) is marked on its line too.
    fixed = WITH_MISTAKE.replace("instances: lots", "instances: 1")
    editor.fill(fixed.replace("virtualCluster: default", "virtualCluster: nowhere"))
    page.get_by_role("button", name="Check").click()
    page.locator(f".gutter .ln.err[data-line='{VC_LINE}']").wait_for()
    assert "nowhere" in page.locator("#job-errors li").first.inner_text()
    # The line comes from the server, as for any client.
    refused = rest.refusal("/api/v2/jobs?dryRun=true", fixed.replace("virtualCluster: default", "virtualCluster: nowhere"))
    assert [e.get("line") for e in refused["details"]["errors"]] == [VC_LINE], refused

    editor.fill(fixed)
    page.get_by_role("button", name="Check").click()
    page.wait_for_selector(".ok-box:has-text('valid')")
    assert page.locator(".gutter .ln.err").count() == 0
    assert rest.status("/api/v2/jobs/alice~portal-hello") == 404  # checking stored nothing


def test_job_waits_with_its_reason_then_runs_and_succeeds_without_reload(page, url, rest, blocker, context):
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r".*#/jobs/alice~portal-hello$"))
    page.wait_for_selector("#waiting-reason")
    reason = page.locator("#waiting-reason").inner_text()
    assert "default" in reason, reason  # names the VC it waits in
    shot(page, "04-job-waiting")
    # Every state the title shows from now on, and a mark a reload would wipe.
    page.evaluate("""() => {
        window.__stillTheSamePage = true;
        window.__seen = [document.querySelector('h1 .badge').dataset.state];
        new MutationObserver(() => {
            const badge = document.querySelector('h1 .badge');
            const state = badge && badge.dataset.state;
            if (state && window.__seen[window.__seen.length - 1] !== state) window.__seen.push(state);
        }).observe(document.getElementById('main'), {subtree: true, childList: true});
    }""")

    # Stop the running blocker from a second tab (signed in through "keep me signed in").
    other = context.new_page()
    other.on("dialog", lambda dialog: dialog.accept())
    watch_errors(other)
    # Meanwhile the VC's queue shows it, first, with its reason.
    other.goto(f"{url}/#/vcs/default")
    first = other.locator("#queue tbody tr").first
    first.wait_for()
    assert "alice~portal-hello" in first.inner_text() and "waiting in VC default" in first.inner_text()
    shot(other, "11-virtual-cluster-queue")
    other.goto(f"{url}/#/jobs/{blocker}")
    other.wait_for_selector("h1 .badge[data-state=RUNNING]")
    other.get_by_role("button", name="Stop", exact=True).click()
    other.wait_for_selector("h1 .badge[data-state=STOPPED]")
    shot(other, "05-job-stopped")
    other.close()

    page.wait_for_selector("h1 .badge[data-state=SUCCEEDED]", timeout=90_000)
    seen = page.evaluate("window.__seen")
    assert page.evaluate("window.__stillTheSamePage") is True
    assert seen[0] == "WAITING" and seen[-1] == "SUCCEEDED" and "RUNNING" in seen, seen
    # Its log, with the parameter rendered.
    page.wait_for_selector("#log:has-text('hello-from-the-portal')")
    assert_labelled(page)
    shot(page, "06-job-succeeded-with-log")


def test_clone_and_upload_fill_the_editor(page, url, tmp_path):
    page.goto(f"{url}/#/jobs/alice~portal-hello")
    page.get_by_role("button", name="Clone").click()
    page.wait_for_url(re.compile(r".*#/submit\?clone=.*"))
    # (the CSP forbids wait_for_function's eval)
    expect(page.locator("#job-text")).to_have_value(re.compile("portal-hello-clone"))
    text = page.locator("#job-text").input_value()
    assert "greeting" in text and "name: portal-hello-clone" in text

    job_file = tmp_path / "job.json"
    job_file.write_text('{"protocolVersion": 2, "name": "uploaded", "type": "job", "taskRoles": {"main": '
                        '{"instances": 1, "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 0}, '
                        '"commands": ["true"]}}, "defaults": {"virtualCluster": "default"}}')
    page.set_input_files("#upload", str(job_file))
    expect(page.locator("#job-text")).to_have_value(re.compile('"name": "uploaded"'))
    page.get_by_role("button", name="Check").click()  # sent as JSON
    page.wait_for_selector(".ok-box:has-text('alice~uploaded')")


WITH_SECRET = """protocolVersion: 2
name: uses-a-secret
type: job
taskRoles:
  main:
    instances: 1
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - K='<% $secrets.apiKey %>'; test "${K#s3cret-}" = "value-42" && echo "the key arrived as $K"
defaults:
  virtualCluster: default
"""


def test_a_secret_field_reaches_the_task_and_is_never_shown(page, url, rest):
    page.goto(f"{url}/#/submit")
    page.locator("#job-text").fill(WITH_SECRET)
    page.get_by_role("button", name="Add secret").click()
    page.get_by_label("secret 1 name").fill("apiKey")
    page.get_by_label("secret 1 value").fill("s3cret-value-42")
    assert "s3cret-value" not in page.locator("#job-text").input_value()  # never in the editor
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r".*#/jobs/alice~uses-a-secret$"))
    page.wait_for_selector("h1 .badge[data-state=SUCCEEDED]", timeout=90_000)  # the task had the value
    page.wait_for_selector("#log:has-text('the key arrived')")
    assert "s3cret-value" not in page.locator("#log").inner_text()  # masked in what the task printed
    page.locator("#config-box summary").click()
    page.wait_for_selector("#config:has-text('secrets')")
    assert "s3cret-value" not in page.locator("#config").inner_text()
    assert "s3cret-value" not in page.content()


def test_a_failed_job_shows_reason_and_solution(page, url, rest, users):
    job = rest.submit(BLOCKER.replace("blocker", "fails").replace("instances: 2", "instances: 1")
                      .replace("cpu: 8", "cpu: 1").replace("sleep 600", "exit 3"), token=users["alice"])
    rest.wait_state(job, {"FAILED"})
    page.goto(f"{url}/#/jobs/{job}")
    failure = page.locator("#failure")
    failure.wait_for()
    text = failure.inner_text()
    assert "Why it failed" in text and "Exit code" in text
    assert "Reason:" in text, text
    assert "What to do:" in text, text
    shot(page, "07-job-failed")


def test_another_user_sees_no_stop_button(browser, url, rest, users):
    running = rest.submit(BLOCKER.replace("blocker", "long").replace("instances: 2", "instances: 1")
                          .replace("cpu: 8", "cpu: 1"), token=users["alice"])
    rest.wait_state(running, {"RUNNING"})
    ctx = own_context(browser)
    try:
        tab = ctx.new_page()
        watch_errors(tab)
        sign_in(tab, url, "bob")
        tab.goto(f"{url}/#/jobs/{running}")
        tab.wait_for_selector("h1 .badge[data-state=RUNNING]")
        tab.wait_for_selector("text=are for alice and admins")
        assert tab.get_by_role("button", name="Stop", exact=True).count() == 0
        shot(tab, "08-other-users-job")
        tab.goto(f"{url}/#/jobs?username=alice")
        tab.wait_for_selector(f"tr[data-job='{running}']")
        assert tab.locator(f"tr[data-job='{running}'] input[type=checkbox]").count() == 0
        assert_labelled(tab)
        bob_token = tab.evaluate("sessionStorage.getItem('pai.token')")
        tab.get_by_role("button", name="Sign out").click()
        tab.wait_for_selector("text=Sign in to PAI")
        assert tab.evaluate("sessionStorage.getItem('pai.token') || localStorage.getItem('pai.token')") is None
        assert rest.status("/api/v2/users/me", token=bob_token) == 401  # signing out revoked the token
    finally:
        ctx.close()
    rest.call("PUT", f"/api/v2/jobs/{running}/executionType", {"value": "STOP"}, token=users["alice"])


def test_job_list_filters_sorts_and_bulk_stops(page, url, rest, users):
    jobs = [rest.submit(BLOCKER.replace("blocker", f"bulk-{i}").replace("instances: 2", "instances: 1")
                        .replace("cpu: 8", "cpu: 1"), token=users["alice"]) for i in range(2)]
    page.goto(f"{url}/#/jobs?keyword=bulk")
    for job in jobs:
        page.wait_for_selector(f"tr[data-job='{job}']")
    assert page.locator("tbody tr[data-job]").count() == 2
    page.get_by_role("button", name=re.compile("^Name")).click()  # sort by name
    page.wait_for_url(re.compile(r".*order=name.*"))
    page.get_by_label("Select every stoppable job on this page").check()
    page.get_by_role("button", name="Stop selected (2)").click()
    for job in jobs:
        page.wait_for_selector(f"tr[data-job='{job}'] .badge[data-state=STOPPED]", timeout=90_000)  # live, no reload
    shot(page, "09-jobs-list")


GPU_PERCENTS = [0.0, 35.0, 70.0, 100.0]


def store_gpu_sample(platform, node: str) -> None:
    """A monitor agent's sample of a node with four GPUs (this machine has none), as the
    agent writes it in pai_nodes, so the heat map has GPUs to show."""
    import asyncio
    import threading
    import time

    from libs.common.bus import Bus
    from libs.common.nodes import node_key
    from libs.common.subjects import Bucket
    from services.monitor.core.samples import GpuSample, NodeSample, encode_node_sample

    sample = NodeSample(node=node, at=time.time(), cpuCount=32, cpuPercent=50.0, memoryUsedBytes=64 << 30,
                        memoryTotalBytes=256 << 30,
                        gpus=[GpuSample(index=i, uuid=f"GPU-{i}", name="H100", utilizationGpuPercent=pct,
                                        memoryUsedBytes=40 << 30, memoryTotalBytes=80 << 30)
                              for i, pct in enumerate(GPU_PERCENTS)])

    async def put() -> None:
        bus = await Bus.connect(platform.nats.url, name="browser-test-agent", **platform.nats.login("monitor"))
        try:
            await (await bus.kv(Bucket.NODES)).put(node_key(node), encode_node_sample(sample))
        finally:
            await bus.close()

    # In a thread of its own: Playwright's sync API keeps this thread's event loop marked running.
    failed: list[BaseException] = []
    worker = threading.Thread(target=lambda: _capture(failed, lambda: asyncio.run(put())))
    worker.start()
    worker.join(60)
    assert not failed, failed


def _capture(failed: list, fn) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        failed.append(exc)


def test_live_updates_resume_after_rest_restarts(page, url, rest, users, platform):
    job = rest.submit(BLOCKER.replace("blocker", "outlives-rest").replace("instances: 2", "instances: 1")
                      .replace("cpu: 8", "cpu: 1"), token=users["alice"])
    page.goto(f"{url}/#/jobs?keyword=outlives")
    page.wait_for_selector(f"tr[data-job='{job}'] .badge[data-state=RUNNING]", timeout=90_000)
    page.wait_for_selector("#live.on")
    platform[0].kill_service("rest")  # kill -9: the event stream breaks mid-response
    page.wait_for_selector("#live:not(.on)")
    platform[0].start_service("rest")
    page.wait_for_selector("#live.on")  # the stream is back, from the last event it had
    rest.call("PUT", f"/api/v2/jobs/{job}/executionType", {"value": "STOP"}, token=users["alice"])
    page.wait_for_selector(f"tr[data-job='{job}'] .badge[data-state=STOPPED]", timeout=90_000)


def test_every_page_renders(page, url, rest, browser, platform):
    page.goto(f"{url}/#/vcs")
    page.wait_for_selector("#vc-research")
    shot(page, "10-virtual-clusters")
    page.goto(f"{url}/#/vcs/default")
    page.wait_for_selector("text=Queue (")
    store_gpu_sample(platform[0], "node-a")
    page.goto(f"{url}/#/cluster")
    page.wait_for_selector("#heatmap th:has-text('node-a')")
    row = page.locator("#heatmap tr", has=page.locator("th", has_text="node-a"))
    row.locator("td.heat-4").wait_for()  # 35% busy: the fourth shade of eleven
    assert row.locator("td").all_inner_texts()[:4] == ["0%", "35%", "70%", "100%"]
    assert row.locator("td.heat-10").count() >= 1
    page.wait_for_selector("#nodes th:has-text('node-c')")
    shot(page, "12-cluster")
    page.goto(f"{url}/#/alerts")
    page.wait_for_selector("text=Firing (")
    shot(page, "13-alerts")

    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="dark")
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        admin = ctx.new_page()
        watch_errors(admin)
        admin.goto(url + "/")
        admin.get_by_label("Token", exact=True).fill(rest.token)
        admin.get_by_role("button", name="Sign in with token").click()
        admin.wait_for_selector("#page-title:has-text('Cluster at a glance')")
        assert admin.locator("#who-role").is_visible()
        assert admin.evaluate("document.documentElement.dataset.theme") == "dark"
        admin.goto(f"{url}/#/admin")
        admin.wait_for_selector("#users th:has-text('alice')")
        admin.wait_for_selector("#rules li")
        assert_labelled(admin)
        shot(admin, "14-admin-dark")
        # A rule edited into something invalid: the runtime's problems are shown, nothing changes.
        first = admin.locator("#rules > li").first
        first.locator("summary").click()
        editor = first.locator("textarea")
        editor.fill(editor.input_value().replace('"reaction": "', '"reaction": "SOMETIMES_', 1))
        first.get_by_role("button", name=re.compile("^Save rule")).click()
        first.locator("ul.errors li").first.wait_for()
        assert "reaction" in first.locator("ul.errors").inner_text()
        admin.goto(f"{url}/#/")
        admin.set_viewport_size({"width": 2560, "height": 1440})  # a wall display
        admin.wait_for_selector("#h-vcs")
        shot(admin, "16-home-wall-display-dark")
        admin.set_viewport_size({"width": 1440, "height": 900})
        admin.goto(f"{url}/#/")
        admin.wait_for_selector("#h-vcs")
        shot(admin, "15-home-admin-dark")
    finally:
        ctx.close()


def test_a_running_jobs_utilisation_charts_fill(browser, url, rest, users, platform):
    """The job page draws the monitor's samples (GET /api/v2/jobs/{id}/metrics) as they
    come: the whole job's chart and its task's gain points while it runs. CPU and memory
    only: this machine gives no GPU readings, so no GPU series is drawn."""
    job = rest.submit(BLOCKER.replace("blocker", "charted").replace("instances: 2", "instances: 1")
                      .replace("cpu: 8", "cpu: 1").replace("sleep 600", "while true; do :; done"), token=users["alice"])
    ctx = own_context(browser)
    tab = ctx.new_page()
    watch_errors(tab)
    try:
        sign_in(tab, url, "alice")
        rest.wait_state(job, {"RUNNING"})
        tab.goto(f"{url}/#/jobs/{job}")
        tab.wait_for_selector("#utilisation-title")
        try:
            tab.wait_for_function("() => Number(document.querySelector('#chart-job')?.dataset.points) >= 2",
                                  timeout=60_000)
        except PlaywrightTimeout:
            answer = rest.call("GET", f"/api/v2/jobs/{job}/metrics", token=users["alice"])
            raise AssertionError(
                f"no chart after 60 s; the page says {tab.locator('#metrics-status').inner_text()!r}; "
                f"the API {str(answer)[:600]}; the platform said (restarts included): {SUPERVISION or 'nothing'}; "
                f"the monitor's {platform[0]._log_tail('monitor')}") from None
        first = int(tab.locator("#chart-job").get_attribute("data-points"))
        # Still filling, without a reload: more points a few samples later.
        tab.wait_for_function(f"() => Number(document.querySelector('#chart-job').dataset.points) > {first}", timeout=60_000)
        assert tab.locator("#chart-big-0 canvas").count() == 1  # the task's own chart
        assert tab.locator("#chart-job canvas").count() == 1
        legend = tab.locator("#chart-job .u-legend").inner_text()
        assert "CPU %" in legend and "memory GiB" in legend and "GPU %" not in legend
        assert tab.locator("#gpu-idle").is_hidden()  # holds no GPU
        shot(tab, "17-job-utilisation")
    finally:
        rest.call("PUT", f"/api/v2/jobs/{job}/executionType", {"value": "STOP"}, token=users["alice"])
        ctx.close()


def test_ssh_keys_are_added_listed_and_deleted_in_the_profile(browser, url, rest, users):
    """Alice's own page (her name in the top bar): she adds a key, sees it listed (the API
    has it too), sees a bad one refused naming the field, and deletes hers."""
    key = ssh.generate_key_pair("alice@laptop")[1]
    ctx = own_context(browser)
    tab = ctx.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())
    watch_errors(tab)
    try:
        sign_in(tab, url, "alice")
        tab.locator("#who-name").click()
        tab.wait_for_selector("#keys-title:has-text('SSH keys')")
        tab.get_by_label("Title").fill("laptop")
        tab.get_by_label("Public key").fill(key)
        tab.get_by_role("button", name="Add key").click()
        row = tab.locator("#ssh-key-list tr[data-key='laptop']")
        row.wait_for()
        assert "alice@laptop" in row.inner_text()
        assert [k["value"] for k in rest.call("GET", "/api/v2/users/me/ssh-keys", token=users["alice"])["sshKeys"]] == [key]
        assert_labelled(tab)
        shot(tab, "18-profile-ssh-keys")
        tab.get_by_label("Title").fill("bad")
        tab.get_by_label("Public key").fill(f'command="sh" {key}')
        tab.get_by_role("button", name="Add key").click()
        tab.wait_for_selector("[role=alert]:has-text('value: must be one OpenSSH public key')")
        row.get_by_role("button", name="delete key laptop").click()
        tab.wait_for_selector("#no-ssh-keys")
        assert rest.call("GET", "/api/v2/users/me/ssh-keys", token=users["alice"])["sshKeys"] == []
    finally:
        ctx.close()


SSH_JOB = BLOCKER.replace("blocker", "sshable").replace("instances: 2", "instances: 1").replace("cpu: 8", "cpu: 1") + """\
extras:
  com.microsoft.pai.runtimeplugin:
    - plugin: ssh
      parameters: {jobssh: true}
"""


def test_a_running_job_with_the_ssh_plugin_shows_its_owner_the_ssh_command(browser, url, rest, users):
    job = rest.submit(SSH_JOB, token=users["alice"])
    ctx = own_context(browser)
    tab = ctx.new_page()
    watch_errors(tab)
    try:
        sign_in(tab, url, "alice")
        rest.wait_state(job, {"RUNNING"})
        expected = rest.call("GET", f"/api/v2/jobs/{job}/ssh", token=users["alice"])["containers"][0]["sshCommand"]
        tab.goto(f"{url}/#/jobs/{job}")
        command = tab.locator("#ssh li[data-task='big-0'] code.ssh-command")
        command.wait_for()
        assert command.inner_text() == expected and expected.startswith("ssh -i ")
        assert tab.locator("#ssh-key-save").is_visible()
        assert_labelled(tab)
        shot(tab, "19-job-ssh")
    finally:
        rest.call("PUT", f"/api/v2/jobs/{job}/executionType", {"value": "STOP"}, token=users["alice"])
        ctx.close()


def test_a_terminal_opens_in_a_running_task_and_answers_what_is_typed(browser, url, rest, users):
    """The job page's Terminal button opens a shell in the running task (xterm.js, over a
    WebSocket through rest and the bus: the browser reaches no node): alice types a
    command, reads its answer from inside the task, closes the terminal, and the session
    is in the job's events."""
    job = rest.submit(BLOCKER.replace("blocker", "terminal").replace("instances: 2", "instances: 1")
                      .replace("cpu: 8", "cpu: 1"), token=users["alice"])
    ctx = own_context(browser)
    tab = ctx.new_page()
    watch_errors(tab)
    try:
        sign_in(tab, url, "alice")
        rest.wait_state(job, {"RUNNING"})
        tab.goto(f"{url}/#/jobs/{job}")
        tab.locator("button[data-terminal='big-0']").click()
        expect(tab.locator("#terminal-status")).to_have_text("connected to big[0]")
        tab.keyboard.type("echo answer-$((20 + 22)) from $PAI_CURRENT_TASK_ROLE_NAME-$PAI_TASK_INDEX")
        tab.keyboard.press("Enter")
        tab.wait_for_function("() => document.querySelector('#terminal-screen .xterm-rows')?.innerText"
                              ".includes('answer-42 from big-0')")
        assert tab.locator("#terminal-screen .xterm-rows > div").count() > 10  # xterm laid it out (its styles applied)
        assert_labelled(tab)
        shot(tab, "22-job-terminal")
        tab.locator("#terminal-close").click()
        expect(tab.locator("#terminal")).to_be_hidden()
        deadline = 60
        reasons: set[str] = set()
        while deadline > 0 and not {"TerminalOpened", "TerminalClosed"} <= reasons:
            events = rest.call("GET", f"/api/v2/jobs/{job}/events", token=users["alice"])["data"]
            reasons = {e["reason"] for e in events if e["message"].startswith(("alice opened", "the terminal alice"))}
            tab.wait_for_timeout(250)
            deadline -= 0.25
        assert {"TerminalOpened", "TerminalClosed"} <= reasons
    finally:
        rest.call("PUT", f"/api/v2/jobs/{job}/executionType", {"value": "STOP"}, token=users["alice"])
        ctx.close()


def wait_for_tensorboard_run(rest: Rest, job: str, token: str, timeout: float = 120.0) -> None:
    """Until the job's TensorBoard answers through rest and has read the task's event
    file: its page drawn before then shows no run until its own next refresh (30 s),
    longer than a loaded machine leaves the test."""
    import gzip
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{rest.url}/api/v2/jobs/{job}/tensorboard/data/runs",
                                     headers={"Authorization": f"Bearer {token}", "Accept-Encoding": "gzip"})
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                body = answer.read()
                if answer.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
            if json.loads(body):
                return
        except urllib.error.HTTPError:  # 503 while TensorBoard starts
            pass
        assert time.monotonic() < deadline, f"{job}'s TensorBoard read no run in {timeout:.0f} s"
        time.sleep(1)


def test_the_job_page_opens_its_owners_tensorboard_through_rest(browser, url, rest, users):
    from services.launcher.backends import local
    from tests.integration.test_tensorboard import PLUGIN, WRITE, _quoted

    given = local._platform_tensorboard()
    if not given:
        pytest.skip("needs TensorBoard from PyPI beside the platform, runnable by task users (the test extra)")
    python = given["PAI_TENSORBOARD"].split()[0] if "PAI_TENSORBOARD_PYTHONPATH" in given else sys.executable
    packages = given.get("PAI_TENSORBOARD_PYTHONPATH", "")
    body = ("protocolVersion: 2\nname: tboard\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            "    resourcePerInstance: {cpu: 1, memoryMB: 1024, gpu: 0}\n    commands:\n"
            f"      - {json.dumps(f'PYTHONPATH={packages} {python} -c {_quoted(WRITE)} tb')}\n"
            "      - sleep 300\n" + PLUGIN)
    job = rest.submit(body, token=users["alice"])
    ctx = own_context(browser)
    tab = ctx.new_page()
    watch_errors(tab)
    try:
        sign_in(tab, url, "alice")
        rest.wait_state(job, {"RUNNING"})
        wait_for_tensorboard_run(rest, job, users["alice"])
        tab.goto(f"{url}/#/jobs/{job}")
        button = tab.locator("#tensorboard")
        button.wait_for()
        with ctx.expect_page() as opened:
            button.click()
        board = opened.value
        # TensorBoard's own page, through rest (the owner's token as the tab's cookie): its chart of the job's scalar.
        board.wait_for_selector("text=loss", timeout=TIMEOUT_MS)
        assert board.url.endswith(f"/api/v2/jobs/{job}/tensorboard/") or "/tensorboard/#" in board.url
        shot(board, "23-job-tensorboard")
        assert rest.status(f"/api/v2/jobs/{job}/tensorboard/data/runs", token=users["bob"]) == 403
    finally:
        rest.call("PUT", f"/api/v2/jobs/{job}/executionType", {"value": "STOP"}, token=users["alice"])
        ctx.close()
