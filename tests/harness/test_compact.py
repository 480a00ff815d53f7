"""harness.compact: finished runs' records become .xz (older .gz ones are re-packed), every
reader still sees the same rows."""

import gzip
import json
import shutil

import pytest

from harness.compact import main
from harness.records import read_jsonl
from harness.results import Run


def _run_dir(root, name, finished):
    d = root / "fig4" / name
    d.mkdir(parents=True)
    rows = [{"index": i, "success": True, "ttft": 0.1 * i} for i in range(50)]
    (d / "records.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"index": 50, "succ'
    )
    if finished:
        (d / "summary.json").write_text(json.dumps({"completed": 50}))
    return d, rows


def test_compact_finished_runs_only_and_readers_see_the_same_rows(tmp_path, capsys):
    done, rows = _run_dir(tmp_path, "hisparse-glm53_mini-c4-00000000", True)
    live, _ = _run_dir(tmp_path, "hisparse-glm53_mini-c16-11111111", False)
    assert main(["--results", str(tmp_path)]) == 0
    assert "compressed 1 records files" in capsys.readouterr().out
    assert not (done / "records.jsonl").exists() and (done / "records.jsonl.xz").is_file()
    assert (live / "records.jsonl").is_file()  # a run in progress keeps appending to its file
    assert list(read_jsonl(done / "records.jsonl")) == rows  # the torn last line is skipped
    assert Run(done, {"completed": 50}).records == rows
    first = (done / "records.jsonl.xz").read_bytes()
    assert main(["--results", str(tmp_path)]) == 0  # idempotent
    assert (done / "records.jsonl.xz").read_bytes() == first
    # a run compacted earlier to .gz is re-packed as .xz with the same rows (and bytes)
    old, rows_old = _run_dir(tmp_path, "hisparse-glm53_mini-c8-22222222", True)
    with open(old / "records.jsonl", "rb") as src, gzip.open(old / "records.jsonl.gz", "wb") as dst:
        dst.write(src.read())
    (old / "records.jsonl").unlink()
    assert list(read_jsonl(old / "records.jsonl")) == rows_old  # the .gz reads as before
    assert main(["--results", str(tmp_path)]) == 0
    assert not (old / "records.jsonl.gz").exists()
    assert list(read_jsonl(old / "records.jsonl")) == rows_old
    assert (old / "records.jsonl.xz").read_bytes() == first  # same rows, same bytes
    assert main(["--results", str(tmp_path / "missing")]) == 2


def _commit_all(root):
    import subprocess

    git = dict(cwd=root, check=True, capture_output=True)
    subprocess.run(["git", "init", "-q"], **git)
    subprocess.run(["git", "add", "-A"], **git)
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "runs"], **git
    )


@pytest.mark.slow
def test_prune_unused_never_removes_what_a_figure_reads(tmp_path, capsys, monkeypatch):
    """On the figures' fixture: --prune-unused removes committed request records and server
    samples that no figure opens (a note says from which commit to restore them), keeps the ones
    the figures read, files git does not hold and runs outside the figures' experiments, and
    make_all regenerates the same report and claims afterwards."""
    import matplotlib.figure

    from figures import make_all
    from harness.compact import PRUNED_NOTE
    from tests.figures.fixture import build

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    # The two reports compared below leave out two parts that pruning cannot change, over half
    # of a make_all's time here (compact's own make_all --inputs child still runs them): the
    # pending-runs paragraph, which composes every planned run's config to look for its
    # summary.json (kept, asserted below; the fixture's hand-named runs are never the plan's;
    # tested in tests/figures/test_figures.py), and the images, drawn from what the scripts
    # already read, and their layout (the report text and claims are compared, not pixels)
    monkeypatch.setattr(make_all, "_stale_runs_note", lambda results: [])
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: None)
    monkeypatch.setattr(matplotlib.figure.Figure, "tight_layout", lambda self, *a, **k: None)
    res = build(tmp_path / "results")
    bench = res / "lane_interference" / "run-a"  # no figure lists this experiment
    bench.mkdir(parents=True)
    (bench / "summary.json").write_text("{}")
    (bench / "records.jsonl").write_text('{"index": 0}\n')
    _commit_all(tmp_path)
    late = res / "fig9" / "hisparse-dsv41_mini-B2k-C8" / "server_metrics.parquet"
    late.write_bytes(late.read_bytes() + b"\0")  # changed since the commit: git lacks its bytes

    def report(name):
        out = tmp_path / name
        args = ["--results", str(res), "--out", str(out / "out"), "--report", str(out / "R.md")]
        make_all.main([*args, "--claims", str(out / "claims.json"), "--dpi", "30", "--quiet"])
        return (out / "R.md").read_text(), (out / "claims.json").read_text()

    before = report("before")
    assert main(["--results", str(res), "--prune-unused"]) == 0
    out = capsys.readouterr().out
    assert "kept 1 that git does not hold" in out
    unread = res / "fig4" / "resident-glm53_mini-C128-x" / "records.jsonl"
    unread_samples = res / "fig9" / "hisparse-dsv41_mini-B4k-C8" / "server_metrics.parquet"
    assert not unread.exists() and not unread_samples.exists()
    note = (unread.parent / PRUNED_NOTE).read_text()
    assert (
        "git checkout" in note and "results/fig4/resident-glm53_mini-C128-x/records.jsonl" in note
    )
    assert (unread.parent / "summary.json").is_file() and late.is_file()
    # what Table A2, the notes and Fig. 9 read stays (then compacted like any finished run)
    read = res / "fig4" / "hisparse-glm53_mini-C128-x"
    assert (read / "records.jsonl.xz").is_file() and (read / "server_metrics.parquet").is_file()
    assert (bench / "records.jsonl.xz").is_file()
    assert report("after") == before


def test_prune_traces_keeps_what_the_figures_read(tmp_path, capsys):
    """--prune-traces removes committed Perfetto traces of finished runs and notes where to restore
    them from; kernel_summary.json stays, and a trace git does not hold is kept."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    from harness.compact import TRACES_NOTE

    res = tmp_path / "results"
    k = res / "fig10" / "run-a" / "kernels"
    k.mkdir(parents=True)
    (k.parent / "summary.json").write_text("{}")
    (k / "kernel_summary.json").write_text("{}")
    (k / "trace_0.json.gz").write_bytes(b"trace")
    git = dict(cwd=tmp_path, check=True, capture_output=True)
    subprocess.run(["git", "init", "-q"], **git)
    subprocess.run(["git", "add", "-A"], **git)
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "runs"], **git
    )
    (k / "trace_1.json.gz").write_bytes(b"new")  # not committed yet
    assert main(["--results", str(res), "--prune-traces"]) == 0
    out = capsys.readouterr().out
    assert "pruned 1 kernel traces" in out and "kept 1" in out
    assert not (k / "trace_0.json.gz").exists() and (k / "trace_1.json.gz").exists()
    assert (k / "kernel_summary.json").exists()
    note = (k / TRACES_NOTE).read_text()
    assert "git checkout" in note and "results/fig10/run-a/kernels/trace_0.json.gz" in note


def test_streamed_metrics_go_once_the_parquet_holds_every_sample(tmp_path, capsys):
    """A finished run drops server_metrics.jsonl when its parquet holds every sample; a run in
    progress, or one whose parquet holds fewer samples, keeps it."""
    import pandas as pd

    samples = [{"ts": float(i), "dhs_num_running_reqs": i} for i in range(6)]

    def run(name, finished, parquet_rows):
        d = tmp_path / "fig6" / name
        d.mkdir(parents=True)
        (d / "server_metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        if parquet_rows is not None:
            pd.DataFrame(samples[:parquet_rows]).to_parquet(d / "server_metrics.parquet")
        if finished:
            (d / "summary.json").write_text("{}")
        return d / "server_metrics.jsonl"

    gone = run("a", True, 6)
    short = run("b", True, 4)
    live = run("c", False, 6)
    none = run("d", True, None)
    assert main(["--results", str(tmp_path)]) == 0
    assert "removed 1 streamed server_metrics.jsonl" in capsys.readouterr().out
    assert not gone.exists() and short.exists() and live.exists() and none.exists()
