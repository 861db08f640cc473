"""The playground page (GET /) in headless Chromium driven by Selenium: a
prompt typed and sent, the streamed answer appears and equals the API's
answer for the same request, the live figures fill in from /metrics, and a
screenshot is kept as a test artifact (build/artifacts/playground.png)."""
import shutil

import pytest


selenium = pytest.importorskip("selenium", reason="selenium (pip) is installed by make deps")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from harness import BUILD, NAME, Server


@pytest.fixture
def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("chromium and chromium-driver (Debian) are installed by make deps")
    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800"):
        opts.add_argument(a)
    opts.binary_location = chromium
    d = webdriver.Chrome(service=Service(driver), options=opts)
    yield d
    d.quit()


def test_playground_chat(browser, model):
    check_playground(browser, model, "playground.png")


def test_playground_chat_gemma(browser, gemma):
    """The same on Gemma 3 270M (what `make run` serves): a real answer in
    English, the one the API gives."""
    shown = check_playground(browser, gemma, "playground-gemma.png")
    assert sum(c.isalpha() for c in shown) > len(shown) / 2, shown


def check_playground(browser, model, shot):
    """Sends a prompt from the page; returns the answer it showed."""
    s = Server(model)
    try:
        browser.get(s.base + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text == NAME)
        browser.execute_script("document.getElementById('temperature').value = '0';"
                               "document.getElementById('max_tokens').value = '24';")
        browser.find_element(By.ID, "prompt").send_keys("Tell me a story.")
        browser.find_element(By.ID, "send").click()
        done = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant[data-done='1'] .text"))
        shown = browser.execute_script("return arguments[0].textContent", done[0])
        want = s.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Tell me a story."}],
                                                  max_tokens=24, temperature=0, top_p=0.95)
        assert shown == want.choices[0].message.content and shown
        assert browser.find_element(By.ID, "err").text == ""
        wait.until(lambda d: d.find_element(By.ID, "running").text not in ("-", "NaN"))
        art = BUILD / "artifacts"
        art.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(art / shot))
        assert (art / shot).stat().st_size > 5000
        return shown
    finally:
        assert s.stop() == 0
