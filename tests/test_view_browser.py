"""agentrl view's pages in a real headless Chromium (Debian's chromium and chromium-driver, through selenium).

The run: a real eval of the scripted teacher (real bwrap sandboxes, the adapter, the grader, the tiny
model's tokenizer; eval.save_samples) at RUN/eval/iter_0, and rollout 0 written by the pool's writers
(tests/view_runs.py) with an attempt whose every text is hostile markup. Each page is opened by the
browser; any console error (level SEVERE) fails the test, and each test leaves screenshots in its
tmp_path. Without chromium the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ci import skip_or_fail
from view_runs import Script, make_rollout, new_run

from agentrl.sample import SAMPLE_CODEC
from hpc.buffer import read_shard

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make sysdeps)")]
HOSTILE = "<script>window.__pwned = 1</script></textarea><img src=x onerror=\"window.__pwned = 2\">"


def agentrl(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium. Missing: skipped here, a failure under CI (which must run these tests)."""
    problem = None
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        problem = "selenium is not installed (pip install -e '.[dev]')"
    if problem is None and (chromium is None or driver_path is None):
        problem = "chromium or chromedriver is not installed (make sysdeps: Debian's chromium, chromium-driver)"
    if problem:
        skip_or_fail("the browser tests", problem)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1300,1600", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def site(tiny_model, tmp_path_factory) -> Path:
    """RUN with rollout 0 (one hostile attempt among others) and a real teacher eval at eval/iter_0; its site."""
    from transformers import AutoTokenizer

    work = tmp_path_factory.mktemp("view-site")
    run = new_run(work / "run", model=tiny_model)
    encode = AutoTokenizer.from_pretrained(str(tiny_model)).encode
    make_rollout(run, 0, {(0, 0): Script("alpha"), (0, 1): Script("alpha", reward=0.0, patch=""),
                          (1, 0): Script(HOSTILE, command=HOSTILE, tool_output=HOSTILE, final=HOSTILE,
                                         grade_output=HOSTILE, patch=f"diff --git a/x b/x\n+{HOSTILE}\n"),
                          (1, 1): Script("beta", retry=True)}, encode)
    agentrl("tasks", "generate", "pyfix-hint", "--n", "2", "--seed", "0", "--split", "train", "--out",
            work / "tasks", "--force")
    config = work / "teacher.yaml"
    config.write_text(yaml.safe_dump({"eval": {
        "tasks": str(work / "tasks"), "n_samples": 2, "seed": 0, "engine": "teacher", "teacher_accuracy": 0.5,
        "save_samples": True, "pool": {"harness": "builtin", "prompt_style": "instruction", "max_agents": 2,
                                       "max_booting": 2, "lease_s": 60,
                                       "adapter": {"max_context": 4096, "max_new_tokens": 96},
                                       "tools_dir": str(work / "tools"), "scratch_dir": str(work / "scratch")}}}))
    (work / "scratch").mkdir()
    agentrl("eval", tiny_model, "--config", config, "--out", run.eval_dir(0))
    out = agentrl("view", run.root, "--quiet").stdout
    assert "file://" in out
    return run.root


def load(driver, url: str) -> None:
    """Open the page; fail on any console error it logged."""
    driver.get(url)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{url}: {errors}"


def eval_pages(site: Path) -> list[tuple[Path, dict, list]]:
    """(page, result, samples) of each eval attempt, from the eval's own files."""
    eval_dir = site / "eval" / "iter_0"
    out = []
    for result_file in sorted((eval_dir / "attempts").glob("*.json")):
        g, a, t = result_file.stem.split("-")
        (shard,) = (eval_dir / "samples").rglob(f"{g}-{a}-{t}.msgpack")
        out.append((site / "view" / "eval_0" / f"{g}-{a}.html", json.loads(result_file.read_text()),
                    read_shard(shard, SAMPLE_CODEC)[1]))
    assert len(out) == 4
    return out


def test_an_attempt_page_shows_its_turns_tool_calls_patch_and_grade(browser, site, tmp_path):
    from selenium.webdriver.common.by import By

    load(browser, (site / "view" / "index.html").as_uri())
    assert browser.find_element(By.LINK_TEXT, "eval iter_0") and browser.find_element(By.LINK_TEXT, "rollout 0")
    browser.save_screenshot(str(tmp_path / "index.png"))
    passed = 0
    for page, result, samples in eval_pages(site):
        load(browser, page.as_uri())
        browser.save_screenshot(str(tmp_path / f"{page.stem}.png"))
        assert browser.find_element(By.ID, "reward").text == f"{result['reward']:g}"
        assert browser.find_element(By.CSS_SELECTOR, "h1").text.startswith(result["task"])
        assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.turn")) == result["turns"]
        calls = browser.find_elements(By.CSS_SELECTOR, ".tool-call")
        assert len(calls) == result["tool_calls"] and all("bash" in c.text for c in calls)
        assert browser.find_elements(By.CSS_SELECTOR, ".msg.role-tool")          # the tools' results
        assert browser.find_elements(By.CSS_SELECTOR, ".msg.role-system")
        assert len(browser.find_elements(By.CSS_SELECTOR, "section.sample")) == len(samples)
        assert f"reward {result['reward']:g}" in browser.find_element(By.ID, "grade").text
        if result["reward"] > 0:      # the fix is in the diff, coloured
            passed += 1
            added = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#patch .add")]
            removed = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#patch .del")]
            assert added and removed and any("<=" in line for line in added), added
            assert browser.find_element(By.CSS_SELECTOR, "#patch .add").value_of_css_property(
                "background-color") != browser.find_element(By.CSS_SELECTOR, "#patch .del").value_of_css_property(
                "background-color")
    assert passed, "the teacher (accuracy 0.5) solved none of 4 attempts: nothing to check the diff with"


def test_the_trained_token_marks_are_the_samples_loss_mask(browser, site):
    from selenium.webdriver.common.by import By

    rollout = [(site / "view" / "rollout_0" / f"{'-'.join(p.stem.split('-')[:2])}.html", read_shard(p, SAMPLE_CODEC)[1])
               for p in sorted((site / "buffer").rglob("*.msgpack"))]
    pages = [(page, samples) for page, _result, samples in eval_pages(site)] + rollout
    seen = set()
    for page, samples in pages:
        load(browser, page.as_uri())
        for i, sample in enumerate(samples):
            marks = browser.execute_script(
                "return Array.from(document.querySelectorAll(arguments[0])).map("
                "e => [e.classList.contains('t'), e.classList.contains('m'), e.title])",
                f"#sample-{i} .tokens.resp .tk")
            assert [t for t, _, _ in marks] == [bool(m) for m in sample.loss_mask]
            for (trained, model, title), lp in zip(marks, sample.rollout_log_probs, strict=True):
                assert (f"logprob {lp:.4f}" in title) == trained
                seen.add("trained" if trained else "model" if model else "other")
        # the tokens are text, decoded by the run's tokenizer
        assert "<tool_call>" in browser.find_element(By.CSS_SELECTOR, "#sample-0 .tokens.resp").text
    assert seen == {"trained", "model", "other"}     # the branch's trunk is the model's, trained in its first sample


def test_the_search_box_filters_attempts_by_task_reward_and_class(browser, site, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    load(browser, (site / "view" / "eval_0" / "index.html").as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#attempts tr.att")

    def shown() -> list[str]:
        return [r.get_attribute("data-task") for r in rows if r.is_displayed()]

    tasks = [r.get_attribute("data-task") for r in rows]
    rewards = [float(r.get_attribute("data-reward")) for r in rows]
    assert len(rows) == 4 and shown() == tasks
    box = browser.find_element(By.ID, "filter-text")
    box.send_keys(tasks[0][-4:])
    assert shown() == [t for t in tasks if t.endswith(tasks[0][-4:])] and len(shown()) == 2
    assert browser.find_element(By.ID, "shown").text == "2 of 4 attempts"
    browser.save_screenshot(str(tmp_path / "filtered.png"))
    box.clear()
    box.send_keys("no such task")
    assert shown() == []
    box.clear()
    box.send_keys("x")      # clear() fires no input event: type, then erase
    box.send_keys("\b")
    assert shown() == tasks
    Select(browser.find_element(By.ID, "filter-reward")).select_by_value("pos")
    assert shown() == [t for t, r in zip(tasks, rewards, strict=True) if r > 0]
    Select(browser.find_element(By.ID, "filter-reward")).select_by_value("")
    Select(browser.find_element(By.ID, "filter-class")).select_by_value("not_triggered")
    classes = [r.get_attribute("data-class") for r in rows]
    assert shown() == [t for t, c in zip(tasks, classes, strict=True) if c == "not_triggered"]


def test_hostile_agent_text_shows_as_text_and_runs_no_script(browser, site, tmp_path):
    from selenium.webdriver.common.by import By

    for page in ("rollout_0/index.html", "rollout_0/1-0.html"):
        load(browser, (site / "view" / page).as_uri())
        assert browser.execute_script("return window.__pwned === undefined")
        assert not browser.find_elements(By.CSS_SELECTOR, "img")
    browser.save_screenshot(str(tmp_path / "hostile.png"))
    text = browser.find_element(By.TAG_NAME, "main").text
    assert text.count("<script>window.__pwned = 1</script></textarea>") >= 4    # tool call, result, patch, grade
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.turn")) == 2


def test_the_site_is_served_on_loopback_with_the_serve_option(browser, site):
    from selenium.webdriver.common.by import By

    server = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(site), "--quiet", "--serve", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None
        lines = [server.stdout.readline() for _ in range(3)]
        url = next(m.group(1) for line in lines if (m := re.search(r"at (http://127\.0\.0\.1:\d+/)", line)))
        assert any("ssh -N -L" in server.stdout.readline() for _ in range(1))
        load(browser, url)
        browser.find_element(By.LINK_TEXT, "eval iter_0").click()
        browser.find_elements(By.CSS_SELECTOR, "#attempts tr.att a")[0].click()
        assert browser.current_url.startswith(url + "eval_0/") and browser.find_elements(By.CSS_SELECTOR, ".msg.turn")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_eval_directory_alone_is_viewed_with_its_runs_tokenizer(site):
    eval_dir = site / "eval" / "iter_0"
    out = agentrl("view", eval_dir, "--quiet").stdout
    assert f"file://{eval_dir / 'view' / 'index.html'}" in out
    pages = sorted((eval_dir / "view" / "eval_0").glob("*-*.html"))
    assert len(pages) == 4
    assert all("tool call: <b>bash</b>" in p.read_text() for p in pages)     # decoded: the run's tokenizer
    assert 'href="eval_0/index.html"' in (eval_dir / "view" / "index.html").read_text()
