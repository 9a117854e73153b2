"""``searchlab report DIR``: one self-contained HTML page, opened in headless Chromium.

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``), so
the test needs nothing but Debian's ``chromium``: it waits until every chart is drawn, fails
on any console error or uncaught exception, sorts the trials table by clicking its headers and
saves a screenshot of the whole page (also to ``$SEARCHLAB_REPORT_SCREENSHOT`` when set).
Without Chromium the browser test is skipped, unless ``SEARCHLAB_REQUIRE_CHROMIUM=1`` (CI).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pathlib
import re
import select
import shutil
import subprocess
import time
from typing import Any

import pytest
from synthetic_search import ERRORED, Story, write_asha_search, write_grid_search

import searchlab
from searchlab._report import CHART_IDS, write_report
from searchlab.cli import main

pytest.importorskip("plotly")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WIDTH = 1400


@pytest.fixture(scope="module")
def asha(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Story]:
    exp_dir = tmp_path_factory.mktemp("asha") / "search"
    story = write_asha_search(exp_dir)
    assert main(["report", str(exp_dir)]) == 0
    return exp_dir, story


def _figures(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="figures">(.*?)</script>', page, re.S)
    assert found
    return dict(json.loads(found[1]))


# --- the file -----------------------------------------------------------------------------------


def test_report_is_one_file_that_needs_no_network(asha: Any) -> None:
    exp_dir, _ = asha
    page = (exp_dir / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc=", page)  # plotly.js is inside the page
    assert not re.search(r"<link\b|@import|url\(\s*['\"]?https?:", page)
    assert "Plotly" in page and len(page) > 1_000_000
    assert sorted(_figures(page)) == sorted(CHART_IDS)


def test_report_charts_hold_the_search(asha: Any) -> None:
    exp_dir, story = asha
    figures = _figures((exp_dir / "report.html").read_text(encoding="utf-8"))
    curves = figures["learning-curves"]["data"]
    lines = [t for t in curves if t["mode"] != "markers"]
    assert len(lines) == len(story.best)  # every trial that validated, the errored one not
    assert [t["name"] for t in lines if t["showlegend"]] == [f"best: {story.best_trial}"]
    markers = {t["name"]: len(t["x"]) for t in curves if t["mode"] == "markers"}
    assert markers["paused at a rung end, then promoted"] == sum(
        len(t) for t in story.promoted.values()
    )
    assert markers["paused at a rung end, waiting"] == 1
    buttons = figures["learning-curves"]["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["by batches", "by time"]
    dims = figures["parallel-coordinates"]["data"][0]["dimensions"]
    assert [d["label"] for d in dims] == ["lr", "width", "activation", "best validation_loss"]
    assert dims[0]["ticktext"][0] == "0.0001"  # lr is searched on a log scale
    assert dims[2]["ticktext"] == ["relu", "tanh"]
    assert len(dims[3]["values"]) == len(story.best)
    occupancy = figures["rung-occupancy"]["data"]
    assert [t["y"][-1] for t in occupancy] == [len(story.visits[r]) for r in sorted(story.visits)]
    [importance] = figures["importance"]["data"]  # fANOVA ran on the 16 trials with a metric
    assert sorted(importance["y"]) == ["activation", "lr", "width"]


def test_report_table_is_best_first_with_the_error(asha: Any) -> None:
    exp_dir, story = asha
    page = (exp_dir / "report.html").read_text(encoding="utf-8")
    table = page[page.index('<table id="trials"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]
    first_cells = [re.search(r"<td[^>]*>(.*?)</td>", row)[1] for row in rows]
    assert first_cells == story.ranked()
    assert '<tr class="best"' in table
    assert "RuntimeError: loss is NaN at batch 2" in rows[-1] and ERRORED in rows[-1]
    assert "checkpoint" not in table


def test_report_of_a_grid_and_of_a_single_trial(tmp_path: pathlib.Path) -> None:
    write_grid_search(tmp_path / "grid")
    figures = _figures(write_report(searchlab.load_results(tmp_path / "grid")).read_text())
    assert figures["rung-occupancy"]["layout"]["title"]["text"].startswith("Trials finished")
    single = tmp_path / "single"
    write_grid_search(single)
    trials = json.loads((single / "trials.json").read_text())
    trials["trials"] = trials["trials"][:1]
    (single / "trials.json").write_text(json.dumps(trials))
    out = write_report(searchlab.load_results(single), tmp_path / "out" / "single.html")
    figures = _figures(out.read_text())
    assert "no hyperparameter varies" in figures["parallel-coordinates"]["layout"]["title"]["text"]
    assert "not available" in figures["importance"]["layout"]["title"]["text"]


def test_report_into_an_unwritable_place_is_a_one_line_error(
    asha: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp_dir, _ = asha
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["report", str(exp_dir), "--out", str(blocker / "report.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"searchlab: error: {blocker / 'report.html'}: cannot write the report")
    assert len(err.splitlines()) == 1


# --- in a browser -------------------------------------------------------------------------------


class _Chromium:
    """Headless Chromium driven over the DevTools protocol on fds 3 and 4."""

    def __init__(self, user_data_dir: pathlib.Path) -> None:
        to_child, self._to_chrome = os.pipe()
        self._from_chrome, from_child = os.pipe()

        def wire_fds() -> None:  # in the child: the pipe ends become fds 3 and 4
            read_end = fcntl.fcntl(to_child, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_child, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={user_data_dir}"]  # fmt: skip
        self.process = subprocess.Popen(
            [CHROMIUM, *flags, "--remote-debugging-pipe", "about:blank"],
            preexec_fn=wire_fds,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        for domain in ("Runtime", "Page", "Log"):
            self.send(f"{domain}.enable")
        self.resize(900)
        self.send("Page.navigate", {"url": url})

    def resize(self, height: int) -> None:
        metrics = {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"still false after {timeout} s: {expression}")

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and error log entries."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params["type"] in (
                "error",
                "warning",
                "assert",
            ):
                found.append(" ".join(str(a.get("value")) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
        return found

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.fixture
def browser(tmp_path: pathlib.Path) -> Any:
    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("SEARCHLAB_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{CHROMIUM} is missing; install it with: apt-get install -y chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    chromium = _Chromium(tmp_path / "chromium-profile")
    yield chromium
    chromium.close()


_CHART_STATE = """JSON.stringify(Object.fromEntries(%s.map(id => [id, {
    svgs: document.querySelectorAll('#' + id + ' .main-svg').length,
    traces: (document.getElementById(id).data || []).length,
    text: document.getElementById(id).innerText}])))"""
_COLUMN = """Array.from(document.querySelectorAll('#trials tbody tr'))
    .map(row => row.cells[%d].getAttribute('data-sort'))"""


def _click_header(browser: _Chromium, name: str) -> int:
    index = browser.evaluate(
        "Array.from(document.querySelectorAll('#trials th')).map(th => th.textContent)"
    ).index(name)
    browser.evaluate(f"document.querySelectorAll('#trials th')[{index}].click()")
    return int(index)


def test_report_renders_in_headless_chromium(
    asha: Any, browser: _Chromium, tmp_path: pathlib.Path
) -> None:
    exp_dir, story = asha
    browser.open((exp_dir / "report.html").as_uri())
    assert browser.wait_for("document.body && document.body.getAttribute('data-rendered')") == str(
        len(CHART_IDS)
    )
    charts = json.loads(browser.evaluate(_CHART_STATE % json.dumps(list(CHART_IDS))))
    for chart_id, state in charts.items():
        assert state["svgs"] >= 1, chart_id  # plotly drew it
        assert state["traces"] >= 1, chart_id
    assert "paused at a rung end, then promoted" in charts["learning-curves"]["text"]
    assert "rung 2 (64 batches)" in charts["rung-occupancy"]["text"]
    assert browser.evaluate("document.querySelectorAll('#parallel-coordinates .parcoords').length")
    assert browser.evaluate("document.getElementById('errors').hidden") is True
    assert browser.problems() == []

    column = _click_header(browser, "trial_id")
    assert browser.evaluate(_COLUMN % column) == sorted(story.trial_ids)
    _click_header(browser, "trial_id")
    assert browser.evaluate(_COLUMN % column) == sorted(story.trial_ids, reverse=True)
    column = _click_header(browser, "best_validation_loss")
    values = browser.evaluate(_COLUMN % column)
    assert values[-1] == ""  # the errored trial has none: last either way
    assert [float(v) for v in values[:-1]] == sorted(story.best.values())
    column = _click_header(browser, "best_validation_loss")
    assert browser.evaluate(_COLUMN % column)[-1] == ""
    widths = [int(w) for w in browser.evaluate(_COLUMN % _click_header(browser, "width"))]
    assert widths == sorted(widths) and min(widths) < 10 < max(widths)  # as numbers, not text

    browser.resize(int(browser.evaluate("document.documentElement.scrollHeight")))
    time.sleep(0.5)  # the responsive charts follow the new size
    shot = base64.b64decode(browser.send("Page.captureScreenshot", {"format": "png"})["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 50_000
    (tmp_path / "report_screenshot.png").write_bytes(shot)
    keep = os.environ.get("SEARCHLAB_REPORT_SCREENSHOT")
    if keep:
        pathlib.Path(keep).write_bytes(shot)
    assert browser.problems() == []
