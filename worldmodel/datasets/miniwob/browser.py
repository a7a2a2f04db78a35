"""The headless Chromium that MiniWoB++ episodes are played in.

:class:`Browser` is MiniWoB's gymnasium environment on one Selenium-driven
Chromium started with this project's flags (``CHROMIUM_FLAGS``), reused across
episodes and tasks (:meth:`Browser.switch_task` loads another task without a
restart). :meth:`Browser.capture_final` reads the page an episode ended on from
under MiniWoB's "START" cover. :func:`browser_paths` finds Chromium and
chromedriver (arguments, ``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER``,
then Debian's paths).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
from miniwob.constants import TASK_HEIGHT, TASK_WIDTH
from miniwob.dom import DOMElement
from miniwob.environment import MiniWoBEnvironment
from miniwob.fields import get_field_extractor
from miniwob.screenshot import get_screenshot, pil_to_numpy_array
from miniwob.selenium_instance import DEFAULT_BASE_URL, SeleniumInstance
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=500,400",
)


class HeadlessInstance(SeleniumInstance):  # type: ignore[misc]
    """MiniWoB's Selenium instance, started on a given Chromium with this project's flags."""

    def __init__(self, *, chromium: str, chromedriver: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chromium = chromium
        self.chromedriver = chromedriver

    def create_driver(self) -> None:
        options = webdriver.ChromeOptions()
        options.binary_location = self.chromium
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        self.driver = webdriver.Chrome(
            service=ChromeService(executable_path=self.chromedriver), options=options
        )
        try:
            self.open(self.url)
        except Exception:
            self.driver.quit()
            raise

    def open(self, url: str) -> None:
        """Load a task page and wait for MiniWoB's sync screen."""
        self.url = url
        self.driver.get(url)
        WebDriverWait(self.driver, 10).until(
            expected_conditions.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID))
        )
        self.inner_width, self.inner_height = self.driver.execute_script(
            "return [window.innerWidth, window.innerHeight];"
        )
        if self.inner_width < TASK_WIDTH or self.inner_height < TASK_HEIGHT:
            raise RuntimeError(
                f"Chromium's viewport {self.inner_width}x{self.inner_height} is smaller "
                f"than a MiniWoB task ({TASK_WIDTH}x{TASK_HEIGHT}); check --window-size"
            )


class Browser(MiniWoBEnvironment):  # type: ignore[misc]
    """The MiniWoB gymnasium environment on one headless Chromium, reused across tasks."""

    instance: HeadlessInstance
    subdomain: str

    def __init__(self, task: str, *, chromium: str, chromedriver: str) -> None:
        self._chromium = chromium
        self._chromedriver = chromedriver
        super().__init__(subdomain=task, render_mode=None)

    def _hard_reset_instance(self) -> None:
        if getattr(self, "instance", None) is not None:
            self.instance.close()
        self.instance = HeadlessInstance(
            index=0,
            chromium=self._chromium,
            chromedriver=self._chromedriver,
            **self.instance_kwargs,
        )
        self.instance.start()

    @property
    def driver(self) -> webdriver.Chrome:
        return self.instance.driver

    def switch_task(self, task: str) -> None:
        """Load another task in the same browser (no restart)."""
        if task == self.subdomain:
            return
        self.subdomain = task
        self.instance_kwargs["subdomain"] = task
        self.instance.field_extractor = get_field_extractor(task)
        self.instance.open(urllib.parse.urljoin(DEFAULT_BASE_URL, f"{task}.html"))

    def capture_final(self) -> tuple[DOMElement, np.ndarray]:
        """DOM and screenshot of the page an episode ended on (START cover lifted for the shot)."""
        info = self.driver.execute_script(
            "var c = document.getElementById('sync-task-cover');"
            "if (c) c.style.display = 'none';"
            "WOB_EPISODE_ID -= 1;"
            "try { return core.getDOMInfo(); } finally { WOB_EPISODE_ID += 1; }"
        )
        try:
            shot = self._screenshot()
        finally:
            self.driver.execute_script(
                "var c = document.getElementById('sync-task-cover');"
                "if (c) c.style.display = 'block';"
            )
        return DOMElement(info), shot

    def _screenshot(self) -> np.ndarray:
        i = self.instance
        image = get_screenshot(i.driver, i.inner_width, i.inner_height, TASK_WIDTH, TASK_HEIGHT)
        return pil_to_numpy_array(image)

    def js(self, script: str) -> Any:
        return self.driver.execute_script(script)


def browser_paths(chromium: str | None, chromedriver: str | None) -> tuple[str, str]:
    chromium = chromium or os.environ.get("MINIWOB_CHROME_BINARY") or CHROMIUM
    chromedriver = chromedriver or os.environ.get("MINIWOB_CHROMEDRIVER") or CHROMEDRIVER
    for what, path in (("Chromium", chromium), ("chromedriver", chromedriver)):
        if not Path(path).exists():
            raise FileNotFoundError(
                f"{what} not found at {path}; install Debian's chromium and chromium-driver "
                "or pass its path"
            )
    return chromium, chromedriver
