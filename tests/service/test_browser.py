"""The review flow in a real headless Chromium against a real uvicorn server: sign in, open
the most severe case, see the flagged step with its screenshot and scores, label it, watch it
leave the queue. Screenshots are kept in ``runs/test-artifacts/`` (or $VIGIL_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from streams.records import LabelRecord, decode
from tests.service.conftest import Service
from tests.service.helpers import (
    ART_PROMPT,
    ART_REWARDS,
    art_trigger,
    attributed_trigger,
    serving,
    trigger,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("VIGIL_TEST_ARTIFACTS", ROOT / "runs" / "test-artifacts"))
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def live_server(service: Service) -> Iterator[str]:
    """The app under uvicorn on a loopback port of its own, lifespan and scheduler included."""
    with serving(lambda base: service.app(public_url=base)) as base:
        yield base


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="vigil-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,1600",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=ChromeService(executable_path=CHROMEDRIVER),
                              options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_review_flow_in_chromium(live_server: str, browser: WebDriver, service: Service) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=live_server, headers=service.auth("producer")) as api:
        for event in (trigger("traj-minor", 0, severity="warning"),
                      trigger("traj-gui", 2, n_steps=4, screenshot=True,
                              summary="uploads ~/.ssh/id_rsa to a paste site")):
            assert api.post("/api/v1/events", json=event).status_code == 202
    wait = WebDriverWait(browser, 20)

    browser.get(live_server + "/")
    wait.until(ec.url_contains("/login"))
    browser.find_element(By.ID, "token").send_keys(service.tokens["reviewer"])
    browser.find_element(By.ID, "sign-in").click()

    rows = wait.until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, "#queue tbody tr")))
    assert [r.get_attribute("data-page-id") for r in rows] == ["2", "1"]  # critical first
    assert "uploads ~/.ssh/id_rsa" in rows[0].text and "critical" in rows[0].text.lower()
    rows[0].find_element(By.TAG_NAME, "a").click()

    flagged = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section.step.flagged")))
    assert flagged.get_attribute("data-step-id") == "s2"
    steps = browser.find_elements(By.CSS_SELECTOR, "section.step")
    assert [s.get_attribute("data-step-id") for s in steps] == ["s0", "s1", "s2", "s3"]
    shot = flagged.find_element(By.CSS_SELECTOR, "img.screenshot")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth",
                                  shot) == 48  # the PNG from the trajectory really rendered
    scores = flagged.find_element(By.CSS_SELECTOR, "table.scores").text
    assert "L0" in scores and "0.910" in scores and "L2" in scores
    assert "sends ~/.ssh to a paste site" in flagged.find_element(By.CLASS_NAME, "rubric").text
    background = flagged.value_of_css_property("background-color")
    assert background != steps[0].value_of_css_property("background-color")  # highlighted
    browser.execute_script("arguments[0].scrollIntoView()", flagged)
    browser.save_screenshot(str(ARTIFACTS / "review_case.png"))

    browser.find_element(By.ID, "acknowledge").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "case-status"), "acknowledged"))
    browser.find_element(By.ID, "harmful-yes").click()
    browser.find_element(By.ID, "category").send_keys("data exfiltration")
    browser.find_element(By.ID, "note").send_keys("key leaves the machine")
    browser.find_element(By.ID, "save-verdict").click()

    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, ".flash"),
                                                "Case 2 labelled harmful"))
    remaining = browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr")
    assert [r.get_attribute("data-page-id") for r in remaining] == ["1"]  # it left the queue
    browser.save_screenshot(str(ARTIFACTS / "review_queue_after_label.png"))

    [label] = [decode(m.value, LabelRecord)
               for m in wait_for(lambda: service.bus.read_all("vigil.labels"))]
    assert (label.trajectory_id, label.step_id, label.label, label.category, label.reviewer) == (
        "traj-gui", "s2", 1, "data exfiltration", "reviewer-1")

    browser.get(live_server + "/recall")
    plot = wait.until(ec.presence_of_element_located((By.ID, "recall-plot")))
    wait.until(lambda d: d.execute_script("return arguments[0].naturalWidth", plot) == 900)
    browser.save_screenshot(str(ARTIFACTS / "review_recall.png"))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_harm_attribution_on_the_case_page_in_chromium(
    live_server: str, browser: WebDriver, service: Service
) -> None:
    """The attribution section reads in a real browser: bars drawn, the harmful turn
    highlighted, its link lands on the step it names."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=live_server, headers=service.auth("producer")) as api:
        assert api.post("/api/v1/events", json=attributed_trigger()).status_code == 202
    wait = WebDriverWait(browser, 20)
    browser.get(live_server + "/login?next=/cases/1")
    browser.find_element(By.ID, "token").send_keys(service.tokens["reviewer"])
    browser.find_element(By.ID, "sign-in").click()

    section = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".card.attribution")))
    assert "Harm attribution (MPO credit assignment)" in section.text
    rows = section.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 11
    harmful = section.find_element(By.CSS_SELECTOR, "tr.harmful")
    assert harmful.get_attribute("data-turn") == "8" and "Uploading" in harmful.text
    cell = harmful.find_elements(By.TAG_NAME, "td")[0]
    other = rows[0].find_elements(By.TAG_NAME, "td")[0]
    assert cell.value_of_css_property("background-color") != other.value_of_css_property(
        "background-color")  # highlighted
    bar = harmful.find_element(By.CSS_SELECTOR, ".abar .pos")
    assert bar.size["width"] > 10 and bar.value_of_css_property("background-color") == (
        "rgba(164, 22, 26, 1)")  # drawn by CSS alone (script-src 'none')
    browser.execute_script("arguments[0].scrollIntoView()", section)
    browser.save_screenshot(str(ARTIFACTS / "review_case_attribution.png"))

    harmful.find_element(By.CSS_SELECTOR, 'a[href="#step-m9"]').click()
    wait.until(ec.url_contains("#step-m9"))
    step = browser.find_element(By.ID, "step-m9")
    assert "moved toward harm most: δ +0.450" in step.text
    browser.save_screenshot(str(ARTIFACTS / "review_case_attribution_step.png"))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_generated_image_on_the_case_page_in_chromium(
    live_server: str, browser: WebDriver, service: Service
) -> None:
    """An ART endpoint's case: its thumbnail really renders, beside its prompt and the score
    of every reward model."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=live_server, headers=service.auth("producer")) as api:
        assert api.post("/api/v1/events", json=art_trigger()).status_code == 202
    wait = WebDriverWait(browser, 20)
    browser.get(live_server + "/login?next=/cases/1")
    browser.find_element(By.ID, "token").send_keys(service.tokens["reviewer"])
    browser.find_element(By.ID, "sign-in").click()

    flagged = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section.step.flagged")))
    assert flagged.get_attribute("data-step-id") == "v3-e2"
    media = flagged.find_element(By.CSS_SELECTOR, ".media")
    thumb = media.find_element(By.CSS_SELECTOR, "img.thumbnail")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth",
                                  thumb) == 32  # the endpoint's PNG really rendered
    assert thumb.size["width"] > 100  # scaled up to be seen
    assert media.find_element(By.CSS_SELECTOR, "pre.prompt").text == ART_PROMPT
    rewards = media.find_element(By.CSS_SELECTOR, "table.rewards").text
    for head, value in ART_REWARDS[2].items():
        assert f"{head} {value:.3f}" in rewards
    assert "R, the trainer's scalar 0.704" in rewards
    assert len(browser.find_elements(By.CSS_SELECTOR, "section.step img.thumbnail")) == 3
    browser.execute_script("arguments[0].scrollIntoView()", flagged)
    browser.save_screenshot(str(ARTIFACTS / "review_case_generated_image.png"))
