"""The marketplace in the portal, in headless Chromium, on a whole platform of its own.

Carol publishes a template privately and shares it with her group; Dave, in that group,
finds it by its tag, stars it from the keyboard, uses it with a parameter changed, and
the job runs and links back to the item. A public item stays out of sight of everyone
else (Erin) until an admin approves it in the review queue (dark theme). Screenshots of
each page go to the browser tier's artifacts (tests/browser/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.conftest import PASSWORD, Rest, shot
from tests.browser.test_portal import TIMEOUT_MS, assert_labelled, own_context, sign_in

pytestmark = pytest.mark.timeout(300)
expect = pytest.importorskip("playwright.sync_api",
                            reason="playwright is not installed: `make test` installs the test extra").expect

GROUP = "vision"
TEMPLATE = """protocolVersion: 2
name: greeting
type: job
parameters:
  greeting: hello
taskRoles:
  main:
    instances: 1
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - echo "<% $parameters.greeting %>"
defaults:
  virtualCluster: default
"""
ITEMS = "/api/v2/marketplace/items"
DESCRIPTION = ("# Greeting\n\nPrints **the greeting**.\n\n<script>window.hacked = 1</script>\n\n"
               "| parameter | default |\n|---|---|\n| greeting | hello |\n\n![the logo](https://example.com/logo.png)\n")


@pytest.fixture(scope="module")
def url(rest: Rest) -> str:
    return rest.url


@pytest.fixture(scope="module")
def people(rest: Rest) -> dict[str, str]:
    """Carol and Dave in the group `vision`, Erin not; their tokens."""
    rest.call("POST", "/api/v2/groups", {"groupname": GROUP})
    tokens = {}
    for name, groups in (("carol", ["default", GROUP]), ("dave", ["default", GROUP]), ("erin", ["default"])):
        rest.call("POST", "/api/v2/users", {"username": name, "password": PASSWORD, "grouplist": groups})
        tokens[name] = rest.call("POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})["token"]
    return tokens


def tab_of(ctx, errors: list[str]):
    tab = ctx.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())
    tab.on("pageerror", lambda exc: errors.append(f"{tab.url}: {exc}"))
    tab.on("console", lambda msg: errors.append(f"{tab.url}: {msg.text}")
           if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
    return tab


def mine(rest: Rest, token: str, name: str) -> dict:
    (item,) = [i for i in rest.call("GET", f"{ITEMS}?mine=true", token=token)["items"] if i["name"] == name]
    return item


def test_publish_share_find_star_use_and_run(browser, url, rest, people):
    errors: list[str] = []
    carol_ctx, dave_ctx = own_context(browser), own_context(browser)
    try:
        # Carol publishes privately.
        carol = tab_of(carol_ctx, errors)
        sign_in(carol, url, "carol")
        carol.get_by_role("link", name="Marketplace").click()
        carol.wait_for_selector("#page-title:has-text('Marketplace')")
        carol.wait_for_selector(".market-card[data-item='pytorch-ddp']")  # the built-in templates are there
        carol.get_by_role("link", name="Publish an item").click()
        carol.get_by_label("Name", exact=True).fill("Greeting template")
        carol.get_by_label("Summary", exact=True).fill("Says what you tell it to")
        carol.get_by_label("Category", exact=True).fill("demo")
        carol.get_by_label("Tags", exact=True).fill("greeting, demo")
        carol.get_by_label("Description (Markdown)").fill(DESCRIPTION)
        carol.get_by_label("Template (OpenPAI v2 YAML, with its parameters)").fill(TEMPLATE)
        assert_labelled(carol)
        shot(carol, "30-market-publish")
        carol.get_by_role("button", name="Publish").click()
        carol.wait_for_selector("#page-title:has-text('Greeting template')")
        description = carol.locator("#market-description")
        assert description.locator("strong").inner_text() == "the greeting"
        assert description.locator("table td").first.inner_text() == "greeting"
        assert "<script>" in description.inner_text() and description.locator("script").count() == 0
        assert carol.evaluate("window.hacked") is None
        # an image from elsewhere (the portal's CSP loads none) becomes a link
        assert description.locator("img").count() == 0
        assert description.get_by_role("link", name="the logo").get_attribute("href") == "https://example.com/logo.png"
        with carol.expect_download() as got:
            carol.get_by_role("button", name="Export (v2 YAML)").click()
        exported = Path(got.value.path()).read_text()
        assert "protocolVersion: 2" in exported and "contributor: carol" in exported
        item = mine(rest, people["carol"], "Greeting template")
        assert item["visibility"] == "private"
        assert rest.status(f"{ITEMS}/{item['id']}", token=people["dave"]) == 404
        # ... then shares it with her group.
        carol.get_by_role("link", name="Edit").click()
        carol.get_by_label("Members of these groups").check()
        carol.locator("#me-groups").get_by_label(GROUP).check()
        carol.get_by_role("button", name="Save").click()
        carol.wait_for_selector(f"[data-visibility='groups']:has-text('{GROUP}')")
        shot(carol, "31-market-item-shared")

        # Dave finds it by its tag and stars it with the keyboard.
        dave = tab_of(dave_ctx, errors)
        sign_in(dave, url, "dave")
        dave.goto(f"{url}/#/market")
        dave.wait_for_selector(".market-card")
        dave.get_by_label("Tag", exact=True).select_option("greeting")
        card = dave.locator(f".market-card[data-item='{item['id']}']")
        # The list is fetched again for the tag: until it comes, the unfiltered cards
        # (hers among them) are still on the page.
        expect(dave.locator(".market-card")).to_have_count(1)
        card.wait_for()
        star = card.locator("button.star")
        star.focus()
        dave.keyboard.press("Enter")
        dave.wait_for_selector(f".market-card[data-item='{item['id']}'] button.star[aria-pressed='true']")
        assert rest.call("GET", f"{ITEMS}/{item['id']}", token=people["dave"])["stars"] == 1
        assert_labelled(dave)
        shot(dave, "32-market-list-by-tag")
        card.get_by_role("link", name="Greeting template").click()
        dave.wait_for_selector("#use-form")
        assert dave.locator("#edit").count() == 0 and dave.locator("#delete").count() == 0  # not his
        dave.get_by_label("greeting", exact=True).fill("hi-from-dave")
        shot(dave, "33-market-item-use")
        dave.get_by_role("button", name="Use", exact=True).click()
        dave.wait_for_selector("#from-market")
        assert "greeting: hi-from-dave" in dave.locator("#job-text").input_value()
        assert "marketplaceItem: " + item["id"] in dave.locator("#job-text").input_value()
        shot(dave, "34-market-submit-prefilled")
        dave.locator("#submit").click()
        dave.wait_for_selector("#job-market-item")
        job = dave.url.split("#/jobs/")[1].replace("%7E", "~")
        assert rest.wait_state(job, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
        assert rest.call("GET", f"/api/v2/jobs/{job}/config", token=people["dave"])["parameters"]["greeting"] == "hi-from-dave"
        assert "hi-from-dave" in rest.call("GET", f"/api/v2/jobs/{job}/logs", token=people["dave"])
        shot(dave, "35-market-job-links-back")
        dave.locator("#job-market-item").click()
        dave.wait_for_selector("#page-title:has-text('Greeting template')")
        assert "· 1 job" in dave.locator("main p.muted").first.inner_text()
    finally:
        carol_ctx.close()
        dave_ctx.close()
    assert errors == []


def test_a_public_item_is_hidden_until_an_admin_approves_it(browser, url, rest, people):
    errors: list[str] = []
    created = rest.call("POST", ITEMS, {"name": "Public greeting", "protocol": TEMPLATE, "tags": ["greeting"],
                                        "category": "demo", "visibility": "public"}, token=people["carol"])
    assert created["approval"] == "pending"
    path = f"{ITEMS}/{created['id']}"
    assert rest.status(path, token=people["erin"]) == 404
    erin_ctx = own_context(browser)
    admin_ctx = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="dark")
    admin_ctx.set_default_timeout(TIMEOUT_MS)
    try:
        erin = tab_of(erin_ctx, errors)
        sign_in(erin, url, "erin")
        erin.goto(f"{url}/#/market?tag=greeting")
        erin.wait_for_selector("#market-count")
        assert erin.locator(f".market-card[data-item='{created['id']}']").count() == 0
        erin.goto(f"{url}/#/market/item/{created['id']}")
        erin.wait_for_selector(".error-box:has-text('no marketplace item')")

        admin = tab_of(admin_ctx, errors)
        admin.goto(url + "/")
        admin.get_by_label("Token", exact=True).fill(rest.token)
        admin.get_by_role("button", name="Sign in with token").click()
        admin.wait_for_selector("#page-title:has-text('Cluster at a glance')")
        admin.goto(f"{url}/#/market")
        admin.get_by_role("link", name="Review queue").click()
        row = admin.locator(f"#review-queue tr[data-item='{created['id']}']")
        row.wait_for()
        row.get_by_label("note for Public greeting").fill("clear and useful")
        assert_labelled(admin)
        shot(admin, "36-market-review-queue-dark")
        row.get_by_role("button", name="approve Public greeting").click()
        admin.wait_for_selector("#review-empty")
        assert rest.call("GET", path, token=people["erin"])["approval"] == "approved"

        erin.goto(f"{url}/#/market?tag=greeting")
        erin.locator(f".market-card[data-item='{created['id']}']").wait_for()
        shot(erin, "37-market-public-approved")
    finally:
        erin_ctx.close()
        admin_ctx.close()
    assert errors == []
