"""The live dashboard in a real headless browser (issue 19 §3): Debian's
``chromium`` driven by ``selenium`` through ``chromium-driver`` (``.ci/run``
installs both; with ``MESHIO_REQUIRE_BROWSER=1``, as there, a missing one
fails the test instead of skipping it).  The page loads and shows a mesh of
4, shows the restart after a worker is SIGKILLed under a supervisor, and
shows the stacks of a stalled actor when its button is pressed; everything
is waited for in the page (``WebDriverWait``), nothing slept.

``MESHIO_UPDATE_SCREENSHOT=1`` also writes the page, as the test leaves it,
to ``docs/img/dashboard.png`` (the documentation's screenshot)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait
from supervision_helpers import W, supervised

import meshio
from meshio import Actor, Channel, Port, endpoint

GUARD = 30.0
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "dashboard.png"

pytestmark = pytest.mark.skipif(
    (CHROMIUM is None or DRIVER is None) and not os.environ.get("MESHIO_REQUIRE_BROWSER"),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
           "chromium-driver)")


class Stuck(Actor):
    """Stalls on purpose: ``hold`` awaits an event only ``release`` sets."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    @endpoint
    async def hold(self, started: Port[int]) -> None:
        started.send(meshio.current_rank().rank)
        await self.released.wait()

    @endpoint(concurrent=True)
    async def release(self) -> None:
        self.released.set()


def open_browser() -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1050"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(DRIVER or "chromedriver"))


def wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, GUARD)


def shows_a_mesh_of_4(driver: WebDriver, url: str) -> None:
    driver.get(url)
    assert driver.title == "meshio dashboard"
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "status"), "live"))
    wait(driver).until(ec.text_to_be_present_in_element(
        (By.CSS_SELECTOR, 'li.proc-mesh[data-name="procs"] .size'), "4 processes (procs=4)"))
    assert len(driver.find_elements(By.CSS_SELECTOR, "#processes tr.proc")) == 4
    meshes = driver.find_elements(By.CSS_SELECTOR, 'li.proc-mesh[data-name="procs"] li.actor-mesh')
    assert [m.get_attribute("data-name") for m in meshes] == ["stuck", "w"]
    assert "supervisor" in driver.find_element(By.ID, "tree").text
    assert driver.find_elements(By.CSS_SELECTOR, 'tr.endpoint[data-endpoint="W.echo"]')
    assert driver.find_element(By.CSS_SELECTOR, "#hosts tr.host").text
    assert driver.find_element(By.ID, "no-events").is_displayed()


def shows_the_restart(driver: WebDriver, old_pid: int) -> None:
    restart = wait(driver).until(ec.visibility_of_element_located(
        (By.CSS_SELECTOR, "#feed li.ev-restart")))
    assert "procs rank 2" in restart.text
    failure = driver.find_element(By.CSS_SELECTOR, "#feed li.ev-failure")
    assert f"procs rank 2 (pid {old_pid}" in failure.text
    wait(driver).until(ec.text_to_be_present_in_element(
        (By.CSS_SELECTOR, '#processes tr.proc[data-rank="2"] td.restarts'), "1"))


def shows_the_stacks(driver: WebDriver) -> str:
    driver.find_element(By.ID, "stacks-button").click()
    wait(driver).until(ec.text_to_be_present_in_element((By.ID, "stacks"), "Stuck.hold"))
    text: str = driver.find_element(By.ID, "stacks").text
    return text


@pytest.mark.timeout(180)  # a browser to start besides four processes, on a loaded machine
async def test_the_dashboard_in_a_browser(tmp_path: Path) -> None:
    async with supervised(4) as s:
        workers = await s.procs.spawn("w", W, 1)
        stuck = await s.procs.spawn("stuck", Stuck)
        for rank in range(4):
            assert await workers.slice(procs=rank).echo.call_one(rank) == (rank, rank)
        async with meshio.serve_dashboard() as server:
            driver = await asyncio.to_thread(open_browser)
            try:
                await asyncio.to_thread(shows_a_mesh_of_4, driver, server.url)
                os.kill(s.old[2], signal.SIGKILL)
                await asyncio.to_thread(shows_the_restart, driver, s.old[2])
                port, started = Channel[int].open()
                held = asyncio.ensure_future(stuck.slice(procs=1).hold.call_one(port))
                try:
                    async with asyncio.timeout(GUARD):
                        assert await started.recv() == 1
                    text = await asyncio.to_thread(shows_the_stacks, driver)
                    assert "stuck rank 1: in Stuck.hold at test_dashboard_browser.py:" in text
                    assert "stuck ranks 0,2-3: idle" in text
                    shot = tmp_path / "dashboard.png"
                    assert await asyncio.to_thread(driver.save_screenshot, str(shot))
                    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
                    if os.environ.get("MESHIO_UPDATE_SCREENSHOT"):
                        SCREENSHOT.parent.mkdir(exist_ok=True)
                        shutil.copyfile(shot, SCREENSHOT)
                    await stuck.slice(procs=1).release.call_one()
                    async with asyncio.timeout(GUARD):
                        assert await held is None
                finally:
                    held.cancel()
            finally:
                await asyncio.to_thread(driver.quit)
