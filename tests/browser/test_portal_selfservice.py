"""Self-service in the portal, in headless Chromium, on one platform for the module: a
job built with the submit page's form (no YAML written) runs; a user adds an SSH key
and creates a token on their profile page, and the token works; an admin changes a
group's VCs and a storage's grants on the admin page, and the member's next submission
follows (refused, then let into the new VC, refused again once it is taken away).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from libs.common.protocol import ssh
from tests.browser.conftest import Rest, shot
from tests.browser.test_portal import SCRIPT_ERRORS, TIMEOUT_MS, assert_labelled, own_context, sign_in, watch_errors

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: `make test` installs the "
                             "test extra (pip install -e '.[test]')").expect

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def no_script_errors():
    SCRIPT_ERRORS.clear()
    yield
    assert SCRIPT_ERRORS == []


@pytest.fixture
def tab(browser):
    ctx = own_context(browser)
    page = ctx.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    watch_errors(page)
    yield page
    ctx.close()


def test_the_form_builds_a_two_role_job_that_runs(tab, rest: Rest, users):
    sign_in(tab, rest.url, "alice")
    tab.goto(f"{rest.url}/#/submit")
    tab.get_by_role("button", name="Form", exact=True).click()
    tab.locator("#job-form").wait_for()
    # The example the page starts from is in the form: one role, its command.
    assert tab.locator("#form-name").input_value() == "hello"
    assert "echo" in tab.locator("#role-0-command").input_value()

    tab.locator("#form-name").fill("formed")
    tab.locator("#form-vc").select_option("default")
    tab.locator("#job-form:not([aria-busy])").wait_for()  # the VC's skus drawn: the form is drawn again
    tab.locator("#role-0-name").fill("server")
    tab.locator("#role-0-command").fill('echo "server $PAI_TASK_ROLE_TASK_COUNT_worker workers"')
    tab.get_by_role("button", name="Add a port to role 1").click()
    tab.get_by_label("role 1 port 1 label").fill("api")
    tab.get_by_role("button", name="Add a task role").click()
    tab.locator("#role-1-name").fill("worker")
    tab.locator("#role-1-instances").fill("2")
    tab.locator("#role-1-sku").select_option("cpu")  # resources per sku: 2 cpu cells each
    tab.locator("#role-1-sku-count").fill("2")
    tab.locator("#role-1-command").fill("echo worker $PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX\nsleep 1")
    tab.locator("#role-1-retries").fill("1")
    tab.locator("#form-job-retries").fill("1")
    tab.locator("#form-ssh").check()

    made = yaml.safe_load(tab.locator("#form-yaml").inner_text())
    assert list(made["taskRoles"]) == ["server", "worker"]
    assert made["taskRoles"]["server"]["resourcePerInstance"]["ports"] == {"api": 1}
    assert made["taskRoles"]["worker"]["instances"] == 2
    assert made["taskRoles"]["worker"]["resourcePerInstance"] == {"cpu": 2, "memoryMB": 2048, "gpu": 0}
    assert made["taskRoles"]["worker"]["taskRetryCount"] == 1
    assert made["extras"]["hivedScheduler"]["taskRoles"]["worker"] == {"skuType": "cpu"}
    assert made["extras"]["com.microsoft.pai.runtimeplugin"] == [{"plugin": "ssh", "parameters": {"jobssh": True}}]
    assert made["jobRetryCount"] == 1 and made["defaults"] == {"virtualCluster": "default"}
    assert_labelled(tab)
    shot(tab, "40-submit-form")

    # To the editor and back: the editor holds the form's YAML; a field only the editor
    # shows is kept through the form and named there; the form shows what the editor says.
    tab.get_by_role("button", name="YAML editor").click()
    editor = tab.locator("#job-text")
    assert yaml.safe_load(editor.input_value()) == made
    editor.fill(editor.input_value().replace("\n  worker:\n", "\n  worker:\n    completion: {minSucceededInstances: 2}\n", 1)
                .replace("instances: 2", "instances: 3", 1))
    tab.get_by_role("button", name="Form", exact=True).click()
    expect(tab.locator("#role-1-instances")).to_have_value("3")  # the form is drawn again from the editor
    assert "taskRoles.worker.completion" in tab.locator("#form-unshown").inner_text()
    tab.locator("#role-1-instances").fill("2")
    made = yaml.safe_load(tab.locator("#form-yaml").inner_text())
    worker = made["taskRoles"]["worker"]
    assert worker["completion"] == {"minSucceededInstances": 2} and worker["instances"] == 2

    # Export as YAML: the file is what the editor holds.
    with tab.expect_download() as download:
        tab.get_by_role("button", name="Export as YAML").click()
    assert download.value.suggested_filename == "formed.yaml"
    assert yaml.safe_load(open(download.value.path()).read()) == made

    # Save as template: a private marketplace item holding the job as the form made it.
    tab.get_by_role("button", name="Save as template").click()
    tab.locator("#tpl-name").fill("formed-template")
    tab.locator("#tpl-tags").fill("two-roles, cpu")
    tab.get_by_role("button", name="Save template").click()
    item_id = tab.locator("#template-link").get_attribute("href").rsplit("/", 1)[1]
    item = rest.call("GET", f"/api/v2/marketplace/items/{item_id}", token=users["alice"])
    assert item["owner"] == "alice" and item["visibility"] == "private" and sorted(item["tags"]) == ["cpu", "two-roles"]
    assert yaml.safe_load(item["protocol"]) == made

    tab.get_by_role("button", name="Submit", exact=True).click()
    tab.wait_for_selector("#page-title:has-text('formed'), .error-box")
    assert tab.locator(".error-box").count() == 0, tab.locator(".error-box").all_inner_texts()
    assert rest.wait_state("alice~formed", {"SUCCEEDED", "FAILED"}, timeout=90) == "SUCCEEDED"
    roles = rest.call("GET", "/api/v2/jobs/alice~formed", token=users["alice"])["taskRoles"]
    assert {r: len(v["taskStatuses"]) for r, v in roles.items()} == {"server": 1, "worker": 2}
    req = urllib.request.Request(rest.url + "/api/v2/jobs/alice~formed/logs?taskRole=server&taskIndex=0",
                                 headers={"Authorization": f"Bearer {users['alice']}"})
    with urllib.request.urlopen(req, timeout=30) as res:
        log = res.read().decode()
    assert "server 2 workers" in log
    # The job page exports the job as submitted.
    with tab.expect_download() as download:
        tab.get_by_role("button", name="Export as YAML").click()
    assert yaml.safe_load(open(download.value.path()).read())["taskRoles"]["worker"]["instances"] == 2

    # A document the form cannot show stays in the editor, saying why.
    tab.goto(f"{rest.url}/#/submit")
    tab.locator("#job-text").fill("taskRoles: [1, 2]\n")
    tab.get_by_role("button", name="Form", exact=True).click()
    tab.wait_for_selector("#mode-note:has-text('taskRoles is not a mapping')")
    assert tab.locator("#job-text").is_visible() and tab.locator("#job-form").is_hidden()


JOB_FILES = sorted((Path(__file__).parents[1] / "fixtures" / "jobs" / "openpai_shapes").glob("*.yaml"))
ROUND_TRIP = """async ([text, role]) => {
  const m = await import('/portal/js/jobform.js');
  const doc = m.parseJob(text);
  const untouched = m.writeForm(doc, m.readForm(doc));
  const form = m.readForm(doc);
  const first = form.roles.find((r) => r.key === role);
  first.name = 'renamed'; first.instances = '3';
  const changed = m.writeForm(doc, form);
  return { doc, untouched, changed, unshown: m.unshown(doc), unshownAfter: m.unshown(changed) };
}"""


def test_the_form_keeps_what_it_does_not_change_in_openpai_shaped_files(tab, rest: Rest):
    """The form's model over job files in the shapes of OpenPAI's examples and marketplace: read
    and written back untouched, each file is the same document; with one role renamed and its
    instances changed, only that changes, and what the form does not show stays."""
    tab.goto(rest.url + "/")
    assert len(JOB_FILES) >= 7
    for path in JOB_FILES:
        text = path.read_text()
        first = next(iter(yaml.safe_load(text)["taskRoles"]))
        got = tab.evaluate(ROUND_TRIP, [text, first])
        assert got["doc"] == yaml.safe_load(text), path.name  # js-yaml reads it as PyYAML does
        assert got["untouched"] == got["doc"], path.name
        expected = yaml.safe_load(text)
        roles = expected["taskRoles"]
        expected["taskRoles"] = {("renamed" if k == first else k): v for k, v in roles.items()}
        expected["taskRoles"]["renamed"]["instances"] = 3
        hived = expected.get("extras", {}).get("hivedScheduler", {}).get("taskRoles", {})
        if first in hived:
            expected["extras"]["hivedScheduler"]["taskRoles"] = {("renamed" if k == first else k): v for k, v in hived.items()}
        assert got["changed"] == expected, path.name
        assert [p.replace(f"taskRoles.{first}.", "taskRoles.renamed.") for p in got["unshown"]] == got["unshownAfter"], path.name


def test_a_user_adds_an_ssh_key_and_creates_a_token_that_works(tab, rest: Rest, users):
    key = ssh.generate_key_pair("bob@laptop")[1]
    sign_in(tab, rest.url, "bob")
    tab.locator("#who-name").click()
    tab.wait_for_selector("#keys-title")
    tab.get_by_label("Title").fill("laptop")
    tab.get_by_label("Public key").fill(key)
    tab.get_by_role("button", name="Add key").click()
    tab.locator("#ssh-key-list tr[data-key='laptop']").wait_for()
    assert [k["value"] for k in rest.call("GET", "/api/v2/users/me/ssh-keys", token=users["bob"])["sshKeys"]] == [key]

    tab.locator("#token-description").fill("my-script")
    tab.get_by_role("button", name="Create token").click()
    token = tab.locator("#new-token-value").inner_text()
    row = tab.locator("#token-list tr", has=tab.locator("th", has_text="my-script"))
    row.wait_for()
    assert rest.call("GET", "/api/v2/users/me", token=token)["username"] == "bob"

    tab.locator("#me-email").fill("bob@example.com")
    tab.get_by_role("button", name="Save email").click()
    tab.wait_for_selector("#account-msg:has-text('bob@example.com')")
    assert rest.call("GET", "/api/v2/users/me", token=users["bob"])["email"] == "bob@example.com"
    assert "default" in tab.locator("#my-vcs").inner_text()
    assert_labelled(tab)
    shot(tab, "41-profile")

    row.get_by_role("button", name="revoke token my-script").click()
    row.wait_for(state="detached")
    assert rest.status("/api/v2/users/me", token=token) == 401


def _submits(rest: Rest, token: str, vc: str, name: str) -> int:
    """The status of bob's submission of a small job to `vc` (202 or the refusal's)."""
    body = (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            f"    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}\n    commands: [\"true\"]\n"
            f"defaults:\n  virtualCluster: {vc}\n")
    req = urllib.request.Request(rest.url + "/api/v2/jobs", data=body.encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_an_admin_changes_a_groups_vcs_and_the_members_next_submission_follows(browser, rest: Rest, users):
    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="dark")
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        admin = ctx.new_page()
        admin.on("dialog", lambda dialog: dialog.accept())
        watch_errors(admin)
        admin.goto(rest.url + "/")
        admin.get_by_label("Token", exact=True).fill(rest.token)
        admin.get_by_role("button", name="Sign in with token").click()
        admin.wait_for_selector("#page-title:has-text('Cluster at a glance')")
        admin.goto(f"{rest.url}/#/admin")
        admin.wait_for_selector("#users tr[data-user='bob']")

        # A group with no VC yet, an external name for the directory's group; bob joins it.
        admin.get_by_role("button", name="Add a group").click()
        admin.locator("#eg-name").fill("team")
        admin.locator("#eg-description").fill("the research team")
        admin.locator("#eg-external").fill("sg-team")
        admin.get_by_role("button", name="Save group").click()
        admin.wait_for_selector("#groups tr[data-group='team']")
        admin.get_by_role("button", name="edit user bob").click()
        admin.locator("#eu-groups-team").check()
        admin.get_by_role("button", name="Save user").click()
        admin.wait_for_selector("#users tr[data-user='bob'] >> text=team")
        assert "team" in rest.call("GET", "/api/v2/users/bob")["grouplist"]
        assert _submits(rest, users["bob"], "research", "before") == 403

        # The group gains the VC: bob's next submission there is let in.
        admin.get_by_role("button", name="edit group team").click()
        admin.locator("#eg-vcs-research").check()
        admin.get_by_role("button", name="Save group").click()
        admin.wait_for_selector("#groups tr[data-group='team'] td.vcs:has-text('research')")
        assert rest.call("GET", "/api/v2/groups/team")["externalName"] == "sg-team"
        assert _submits(rest, users["bob"], "research", "granted") == 202

        # A storage declared and granted to the group from the same page.
        admin.get_by_role("button", name="Add a storage").click()
        admin.locator("#es-name").fill("team-data")
        admin.locator("#es-data-path").fill("/srv/pai-storage/team-data")
        admin.locator("#es-groups-team").check()
        admin.get_by_role("button", name="Save storage").click()
        admin.wait_for_selector("#storages tr[data-storage='team-data'] td.grants:has-text('team'), #storage-editor .error-box")
        assert admin.locator("#storage-editor .error-box").count() == 0, admin.locator("#storage-editor .error-box").inner_text()
        assert rest.call("GET", "/api/v2/groups/team")["extension"]["acls"]["storageConfigs"] == ["team-data"]
        assert [s["name"] for s in rest.call("GET", "/api/v2/storages", token=users["bob"])["storages"]] == ["team-data"]
        assert_labelled(admin)
        shot(admin, "42-admin-users-groups-storages-dark")

        # The VC taken away again: refused.
        admin.get_by_role("button", name="edit group team").click()
        admin.locator("#eg-vcs-research").uncheck()
        shot(admin, "43-admin-group-editor-dark")
        admin.get_by_role("button", name="Save group").click()
        admin.wait_for_selector("#groups tr[data-group='team'] td.vcs:not(:has-text('research'))")
        assert _submits(rest, users["bob"], "research", "after") == 403
        rest.call("PUT", "/api/v2/jobs/bob~granted/executionType", {"value": "STOP"})
    finally:
        ctx.close()
