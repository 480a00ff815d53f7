"""harness.compact: finished runs' records become .xz (older .gz ones are re-packed), every
reader still sees the same rows."""

import gzip
import json

from figures.common import Run
from harness.compact import main
from harness.records import read_jsonl


def _run_dir(root, name, finished):
    d = root / "fig4" / name
    d.mkdir(parents=True)
    rows = [{"index": i, "success": True, "ttft": 0.1 * i} for i in range(50)]
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"index": 50, "succ')
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
