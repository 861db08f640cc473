"""The playground page (GET /) in headless Chromium driven by Selenium: a
prompt typed and sent, the streamed answer appears and equals the API's
answer for the same request, the live figures fill in from /metrics, and a
screenshot is kept as a test artifact (build/artifacts/playground.png)."""
import shutil

import openai
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


def test_gateway_page(browser, tmp_path, models):
    """llm-router's page (GET /) at a gateway with keys: with the key typed in, it lists every model and
    adapter behind the endpoint with its deployment; a chat with the second model streams the answer the API
    gives; the charts of generated tokens/s, time to first token and the cache hit rate fill in from the
    router's /metrics (the same prompt twice: the second from the pod's cache)."""
    import json
    import subprocess
    from harness import Router, tool, wait_for
    base = models("tiny", "Q8_0")
    ad = tmp_path / "ad.gguf"
    subprocess.run([tool("llm-mkmodel"), "--lora-of", str(base), "--rank", "4", "-o", str(ad)], check=True,
                   capture_output=True)
    a, b = Server(base, "--model_name", "base-m"), Server(base, "--model_name", "tuned-m", "--lora", f"ad={ad}")
    table = tmp_path / "routes.json"
    table.write_text(json.dumps({"routes": [{"name": "base", "models": ["base-m"], "backends": [a.base]},
                                            {"name": "tuned", "models": ["tuned-m"], "backends": [b.base]}]}))
    (tmp_path / "keys").write_text("sk-page tenant=P\n")
    r = Router("--routes", table, "--api-keys-file", tmp_path / "keys")
    try:
        wait_for(lambda: r.metrics().get(("llm_router_routes", ())) == 2, 30, "both routes")
        browser.get(r.base + "/")
        wait = WebDriverWait(browser, 60)
        key = browser.find_element(By.ID, "key")
        key.send_keys("sk-page")
        browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", key)
        rows = lambda d: [tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td"))  # noqa: E731
                          for tr in d.find_elements(By.CSS_SELECTOR, "#models tr")]
        wait.until(lambda d: sorted(rows(d)) == [("ad", "tuned"), ("base-m", "base"), ("tuned-m", "tuned")])
        browser.execute_script("document.getElementById('model').value = 'tuned-m';"
                               "document.getElementById('temperature').value = '0';"
                               "document.getElementById('max_tokens').value = '12';")
        prompt = "Tell me a story about a rabbit and a fox who met by the river one morning."
        for n in (1, 2):
            browser.find_element(By.ID, "prompt").send_keys(prompt)
            browser.find_element(By.ID, "send").click()
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".assistant[data-done='1']")) == n)
        shown = browser.execute_script("return document.querySelector(\".assistant[data-done='1']\").textContent")
        # the figures of the page's own two turns (read before the API's request below adds its own)
        wait.until(lambda d: d.find_element(By.ID, "tps").text not in ("-", "NaN") and
                   d.find_element(By.ID, "hit").text.endswith("%") and d.find_element(By.ID, "ttft").text != "-")
        # the second turn's prefix was cached (the figure follows the router's scrapes: waited for, not read once)
        wait.until(lambda d: float(d.find_element(By.ID, "hit").text[:-1]) > 0)
        oa = openai.OpenAI(base_url=r.base + "/v1", api_key="sk-page", max_retries=0)
        want = oa.chat.completions.create(model="tuned-m", messages=[{"role": "user", "content": prompt}], max_tokens=12,
                                          temperature=0)
        assert shown == want.choices[0].message.content and shown
        assert browser.find_element(By.ID, "err").text == ""
        points = lambda d: (d.find_element(By.CSS_SELECTOR, "#c_tps polyline").get_attribute("points") or "").split()  # noqa: E731
        wait.until(lambda d: len(points(d)) >= 2)  # a line: two polls' rates at least
        art = BUILD / "artifacts"
        art.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(art / "gateway.png"))
    finally:
        assert r.stop() == 0
        a.stop()
        b.stop()
