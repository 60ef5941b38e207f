"""JupyterLab in a real browser: a notebook using the explorers runs top to bottom, its widgets render
and answer their controls.

Needs Debian's Chromium (/usr/bin/chromium) and the ``playwright`` package (which drives that
browser; no browser is downloaded), and SmolLM2-135M in the course cache. Screenshots of both
explorers go to $COURSE_SCREENSHOTS (default: the test's temporary folder), and also to
docs/screenshots/ when COURSE_SAVE_SCREENSHOT=1.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course import assets
from tests.browser import CHROMIUM, CHROMIUM_ARGS, browser_api, screenshot_dir

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

sync_api = browser_api()
REPO = Path(__file__).resolve().parents[2]
KERNEL_IDLE = re.compile(r"\(ipykernel\) \| Idle")  # JupyterLab's status bar once the kernel is connected

CELLS = [
    ("markdown", "# The explorers in JupyterLab"),
    ("code", """\
import matplotlib.pyplot as plt

from course.attention_analysis import attention_maps
from course.data import load_text, tokenize
from course.models import load_model
from course.widgets import attention_explorer, cache_explorer, cache_view, token_strings

model, tokenizer = load_model("smollm2-135m", "cpu")
ids = tokenize(tokenizer, load_text("austen", "pride_and_prejudice"), 96)"""),
    ("code", """\
maps = attention_maps(model, ids[:, :32])
attention_explorer(maps, token_strings(tokenizer, ids[:, :32]))"""),
    ("code", """\
view = cache_view(model, tokenizer, ids, "streaming", 32, 4)
fig = view.figure()
plt.show()"""),
    ("code", "cache_explorer(model, tokenizer, ids)"),
]
N_CODE = sum(kind == "code" for kind, _ in CELLS)


def write_notebook(path: Path) -> None:
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    nb = nbformat.v4.new_notebook(cells=[make[kind](src) for kind, src in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(url: str, token: str, method: str = "GET") -> dict:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else {}


def wait_for_server(proc: subprocess.Popen, base: str, token: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            api(f"{base}/api/status", token)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server over a folder holding the test notebook: yields (notebook URL, server log)."""
    if not assets.status()["smollm2-135m"]:
        pytest.fail("SmolLM2-135M is not in the course cache: run `python -m course fetch` first")
    root, state = tmp_path / "lab", tmp_path / "jupyter-state"
    root.mkdir()
    write_notebook(root / "explorers.ipynb")
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernel's own inline backend
    dirs = {name: state / name.lower() for name in (
        "JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR")}
    env.update({name: str(path) for name, path in dirs.items()})
    quiet = dirs["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    quiet.parent.mkdir(parents=True)
    quiet.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))  # no news toast, offline
    token, port = secrets.token_hex(16), free_port()
    log = tmp_path / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--IdentityProvider.token={token}",
           "--ServerApp.ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(proc, base, token, log)
        yield f"{base}/lab/tree/explorers.ipynb?token={token}", log
    finally:
        try:
            api(f"{base}/api/shutdown", token, method="POST")  # stops the kernels too
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
RUN_ALL_DONE = """([n, stderr]) => {
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
    const failed = [...document.querySelectorAll(stderr)].some(e => e.textContent.includes('Traceback'));
    const ran = prompts.every(p => /^\\[\\d+\\]:$/.test(p));
    return prompts.length === n && (ran || (failed && !prompts.includes('[*]:')));
}"""  # every code cell ran, or one failed (Run All stops there)


def run_all_cells(page) -> None:
    """JupyterLab's menu Run > Run All Cells, then wait until every code cell has its execution count."""
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    page.wait_for_function(RUN_ALL_DONE, arg=[N_CODE, STDERR], timeout=150_000)


def error_outputs(page) -> list[str]:
    """Texts of the stderr / error output areas that report an error."""
    texts = page.locator(STDERR).all_inner_texts()
    return [t for t in texts if "Traceback" in t or "Error" in t]


def test_explorers_run_and_render_in_jupyterlab(jupyterlab, tmp_path):
    url, log = jupyterlab
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            tmp_path / "chromium-profile", executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = browser.new_page()
            page.goto(url, timeout=90_000)
            page.locator(".jp-StatusBar-Widget").get_by_text(KERNEL_IDLE).wait_for(timeout=90_000)
            run_all_cells(page)

            errors = error_outputs(page)
            assert not errors, "\n\n".join(errors) + f"\n\nserver log:\n{log.read_text()[-2000:]}"
            assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()
            sliders = page.locator(".jupyter-widgets.widget-slider")
            assert sliders.count() == 6  # layer, head | budget, sinks, layer, KV head
            heatmap = page.locator(".jupyter-widgets.widget-image").first
            heatmap.wait_for(state="visible")
            assert page.locator(".jp-RenderedImage img").count() == 1  # the static kept-tokens figure
            page.get_by_text("window(64): PPL").wait_for(state="visible")  # the cache explorer's status

            # Round trips through the kernel: head 0 -> 1 updates the sink-mass caption, and another
            # policy updates the cache explorer.
            head = sliders.filter(has=page.get_by_text("head", exact=True)).first
            head.scroll_into_view_if_needed()
            head.locator(".noUi-handle").focus()
            page.keyboard.press("ArrowRight")
            page.get_by_text("layer 0, head 1: sink mass").wait_for(timeout=30_000)
            page.locator(".jupyter-widgets.widget-dropdown select").select_option("streaming")
            page.get_by_text("streaming(4+60): PPL").wait_for(timeout=30_000)

            shots = screenshot_dir(tmp_path)
            for name, first_control in [("attention_explorer", sliders.first),
                                        ("cache_explorer", page.locator(".jupyter-widgets.widget-dropdown"))]:
                first_control.evaluate("e => e.scrollIntoView({block: 'start'})")
                page.screenshot(path=shots / f"{name}.png")
        finally:
            browser.close()
    if os.environ.get("COURSE_SAVE_SCREENSHOT") == "1":
        docs = REPO / "docs" / "screenshots"
        docs.mkdir(parents=True, exist_ok=True)
        for shot in shots.glob("*_explorer.png"):
            shutil.copy(shot, docs / shot.name)
