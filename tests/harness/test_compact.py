"""harness.compact: finished runs' records become .xz (older .gz ones are re-packed), every
reader still sees the same rows."""

import gzip
import json

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


def test_prune_unused_removes_only_committed_records_of_runs_no_figure_reads(tmp_path, capsys):
    """An older run of a setting re-measured since is not read by any figure: its records go
    (git keeps them, a note says from which commit), the figure's run keeps its own, and records
    git does not hold unchanged are never removed."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    from harness.compact import PRUNED_NOTE

    res = tmp_path / "results"

    def run(name, t, tput, cap=320, conc=128, system="hisparse"):
        d = res / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "system": system,
                    "concurrency": conc,
                    "output_tok_s": tput,
                    "point": {"tag": f"c{conc}"},
                }
            )
        )
        (d / "env.json").write_text(json.dumps({"time_utc": t}))
        (d / "config.yaml").write_text(
            json.dumps({"workload": {"output_len": cap}, "model": {"x": t}})
        )
        (d / "records.jsonl").write_text('{"index": 0}\n')
        return d

    old = run("old", "2026-01-01T00:00", 1.0)
    new = run("new", "2026-01-02T00:00", 2.0)
    also = run("c8", "2026-01-02T00:01", 2.0, conc=8, system="adaptive_hisparse")
    # a newer cap with HiSparse at C8 only: not plotted while Adaptive HiSparse's C8 at this cap is
    # missing, but it will be
    partial = run("partial", "2026-01-03T00:00", 3.0, cap=640, conc=8)
    git = dict(cwd=tmp_path, check=True, capture_output=True)
    subprocess.run(["git", "init", "-q"], **git)
    subprocess.run(["git", "add", "-A"], **git)
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "runs"], **git
    )
    late = run("late_old", "2025-12-31T00:00", 0.5)  # unused too, but never committed
    assert main(["--results", str(res), "--prune-unused"]) == 0
    out = capsys.readouterr().out
    assert "pruned 1 records files" in out and "kept 1 that git does not hold" in out
    assert (
        not (old / "records.jsonl").exists() and "git checkout" in (old / PRUNED_NOTE).read_text()
    )
    # (then compacted like any finished run)
    assert (new / "records.jsonl.xz").is_file() and not (new / PRUNED_NOTE).exists()
    assert (late / "records.jsonl.xz").is_file()
    assert (partial / "records.jsonl.xz").is_file() and (also / "records.jsonl.xz").is_file()
    assert (
        "git checkout" in (old / PRUNED_NOTE).read_text()
        and "results/fig4/old/records.jsonl" in (old / PRUNED_NOTE).read_text()
    )
    assert (old / "summary.json").is_file()  # the run itself stays


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
