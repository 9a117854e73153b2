"""examples/notebook.ipynb runs top to bottom in a Jupyter kernel, and the progress display.

The notebook runs a small adaptive search of the MNIST example offline, shows the trials,
plots, loads the best trial and evaluates it. Its first code cell holds the parameters; the
test points them at temporary directories before it runs the notebook with nbclient.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
from typing import Any

import pytest

from searchlab._progress import NotebookProgress, default_echo, in_notebook

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"


def _outputs(cell: Any, output_type: str) -> list[Any]:
    return [out for out in cell.get("outputs", []) if out["output_type"] == output_type]


def _text(cell: Any) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The notebook after nbclient ran it with its results and data under a temp directory."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    tmp = tmp_path_factory.mktemp("notebook")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in notebook.cells if c.cell_type == "code")
    assert "offline = True" in params.source  # the defaults a user without internet needs
    params.source = (
        f"offline = True\ndata_dir = {str(tmp / 'data')!r}\n"
        f"storage_path = {str(tmp / 'results')!r}\n"
    )
    env_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env_path}"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        client = nbclient.NotebookClient(
            notebook,
            timeout=300,
            kernel_name="python3",
            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
        )
        client.execute()
    finally:
        os.environ["PATH"] = env_path
    return {"notebook": notebook, "tmp": tmp}


@pytest.mark.slow
def test_notebook_runs_a_search_and_shows_one_progress_display(executed: Any) -> None:
    cells = [c for c in executed["notebook"].cells if c.cell_type == "code"]
    run_cell = next(c for c in cells if "searchlab.run(" in c.source)
    displays = _outputs(run_cell, "display_data")
    ours = [d for d in displays if d["data"].get("text/html", "").startswith("<pre")]
    assert len(ours) == 1  # updated in place, not one output per line
    # Besides it, at most Ray Tune's own notebook reporter: an empty HTML display.
    assert all(not d["data"].get("text/html", "").strip() for d in displays if d not in ours)
    progress = ours[0]["data"]["text/plain"]
    assert re.search(r"-- notebook_mnist: 8 trials: completed 8", progress)
    assert "latest trial events" in progress
    assert "best trial: " in progress  # the summary ends up in the same display
    streamed = "".join(out["text"] for out in _outputs(run_cell, "stream"))
    assert len(streamed.splitlines()) < 10  # Ray's own notices at most
    assert (executed["tmp"] / "results" / "notebook_mnist" / "trials.json").is_file()


@pytest.mark.slow
def test_notebook_shows_the_table_the_plots_and_an_evaluated_best_trial(executed: Any) -> None:
    cells = [c for c in executed["notebook"].cells if c.cell_type == "code"]
    table = next(c for c in cells if "best_trials(" in c.source)
    assert "best_validation_loss" in table["outputs"][0]["data"]["text/html"]
    curves = next(c for c in cells if "learning_curves()" in c.source)
    assert any("image/png" in out["data"] for out in _outputs(curves, "display_data"))
    plots = next(c for c in cells if "searchlab plot" in c.source)
    assert "rung_ladder.png" in _text(plots) and "report.html" in _text(plots)
    assert _outputs(plots, "execute_result")[0]["data"]["image/png"]
    evaluation = _text(next(c for c in cells if "F.nll_loss" in c.source))
    found = re.search(r"validation_loss (\S+) \(the search recorded (\S+)\)", evaluation)
    assert found, evaluation
    assert float(found[1]) == pytest.approx(float(found[2]), abs=2e-4)
    accuracy = float(re.search(r"accuracy (\S+) on 297 validation images", evaluation)[1])
    assert 0.1 < accuracy <= 1.0


# --- the progress display, without a kernel ---------------------------------------------------


class _Handle:
    def __init__(self, shown: list[dict[str, str]]) -> None:
        self.shown = shown
        self.index = len(shown) - 1

    def update(self, bundle: dict[str, str], raw: bool) -> None:
        self.shown[self.index] = bundle


def test_progress_keeps_notes_the_latest_table_and_recent_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    display_module = pytest.importorskip("IPython.display")
    shown: list[dict[str, str]] = []

    def fake_display(bundle: dict[str, str], raw: bool, display_id: bool) -> _Handle:
        shown.append(bundle)
        return _Handle(shown)

    monkeypatch.setattr(display_module, "display", fake_display)
    progress = NotebookProgress(recent=2)
    progress("experiment demo starts: grid search, results in /tmp/demo")
    for i in range(5):
        progress(f"12:00:0{i} trial t{i} started at batch 0 (lr=0.1)")
    progress("-- demo: 5 trials: running 2 | pending 3")
    progress("-- demo: 5 trials: completed 5")
    progress("best trial: t3  loss=0.1")
    # One display, replaced on every message; the first (made before Ray Tune, which clears
    # a notebook cell's output when it starts) is emptied when the search's first event comes.
    assert [bool(bundle["text/plain"]) for bundle in shown] == [False, True]
    text = shown[-1]["text/plain"]
    assert text.splitlines()[0] == "experiment demo starts: grid search, results in /tmp/demo"
    assert "-- demo: 5 trials: completed 5" in text and "running 2" not in text
    assert "latest trial events (and 3 earlier):" in text
    assert "trial t4 started" in text and "trial t2 started" not in text
    assert text.index("completed 5") < text.index("best trial: t3")
    assert (
        shown[-1]["text/html"].startswith("<pre") and "trial t4 started" in shown[-1]["text/html"]
    )
    assert progress.lines_seen == 9


def test_progress_refuses_a_negative_number_of_events() -> None:
    with pytest.raises(ValueError, match=r"`recent` is -1, but must be `recent >= 0`"):
        NotebookProgress(recent=-1)


def test_outside_a_kernel_progress_is_printed() -> None:
    assert not in_notebook()
    assert default_echo() is print
