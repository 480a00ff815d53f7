"""The paper-vs-ours report of one figure or table: rows comparing our number with the paper's,
panels' status, tables and notes, written as <out>/<name>.md beside the figure's PNG; number
formatting and the figure scripts' command line."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from figures.paper_values import PV  # noqa: E402
from figures.stats import RatioStats, fewest_runs, tie_text  # noqa: E402
from harness.load_mapping import PAPER_DECODE_GPUS, loads_line  # noqa: E402
from harness.results import DEFAULT_RESULTS, REPO, SUPERSEDED, as_float  # noqa: E402

DEFAULT_OUT = REPO / "figures" / "out"
NOT_MEASURED = "not yet measured"
# the longest text a table cell holds; longer provenance, run lists and explanations become
# numbered notes under the table
CELL_MAX = 120
SHORT_MAX = 60
# the most quantities a summary grid puts side by side (Table 2 has 8)
GRID_MAX_COLUMNS = 8


# between two measured reasons of one row (Report.diagnose): a reason's own text may hold "; "
REASON_SEP = "\n"


class Footnotes:
    """The numbered notes under one table. A text that does not fit a cell leaves its short label
    (its first clause) and a note number in the cell; equal texts share one note."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def cell(self, text: str, limit: int = SHORT_MAX) -> str:
        """``text`` where it is at most ``limit`` characters, else its short label and a note."""
        text = text.strip()
        if len(text) <= limit:
            return text
        return f"{short_label(text, limit)} {self.ref(text)}"

    def reasons(self, text: str) -> str:
        """Note numbers for a measured reason: one note per reason (``REASON_SEP``-separated),
        in order and whole, so no clause of one reads as another's."""
        return "".join(self.ref(t.strip()) for t in text.split(REASON_SEP) if t.strip())

    def sources(self, text: str) -> str:
        """Note numbers for a provenance ('; '-separated tags): its short tags together in one
        note, each long one (a run list, a mix of commits) in its own, so rows that share a tag
        share its note."""
        tags = split_tags(text)
        short = "; ".join(t for t in tags if len(t) <= SHORT_MAX)
        return "".join(
            self.ref(t)
            for t in ([short] if short else []) + [t for t in tags if len(t) > SHORT_MAX]
        )

    def markdown(self) -> list[str]:
        """The notes as a numbered list (with a blank line after), or nothing."""
        if not self.texts:
            return []
        return [f"{i}. {t}" for i, t in enumerate(self.texts, 1)] + [""]


def split_tags(text: str) -> list[str]:
    """``text`` split at '; ' outside parentheses."""
    tags, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text.startswith("; ", i):
            tags.append(text[start:i])
            start = i + 2
    tags.append(text[start:])
    return [t.strip() for t in tags if t.strip()]


def short_label(text: str, limit: int = SHORT_MAX) -> str:
    """The first clause of a provenance or explanation ("; " or ": " ends it), without a
    parenthesis where longer than ``limit``, cut to ``limit`` characters at a word."""
    head = re.split(r"; |: ", text, maxsplit=1)[0]
    if len(head) > limit:
        head = head.split(" (")[0]
    if len(head) > limit:
        head = head[:limit].rsplit(" ", 1)[0] + " ..."
    return head


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, Mapping) and "lo" in v and "hi" in v:
        return f"{fmt(v['lo'])}–{fmt(v['hi'])}"
    if isinstance(v, str):
        return v
    f = float(v)
    if math.isnan(f):
        return "—"
    if math.isinf(f):  # e.g. a ratio over a side that sustained nothing
        return "∞" if f > 0 else "−∞"
    a = abs(f)
    if f == int(f) and a < 1e15:
        return f"{int(f):,}"
    if a >= 1000:
        s = f"{f:,.0f}"
    elif a >= 100:
        s = f"{f:.1f}"
    elif a >= 10:
        s = f"{f:.2f}".rstrip("0").rstrip(".")
    elif a >= 1:
        s = f"{f:.3f}".rstrip("0").rstrip(".")
    else:
        s = f"{f:.4g}"
    return s


def paper_number(p: Any) -> float | None:
    """A comparable number for a paper value (the midpoint of a range)."""
    if p is None:
        return None
    if isinstance(p, Mapping) and "lo" in p and "hi" in p:
        return (float(p["lo"]) + float(p["hi"])) / 2.0
    return as_float(p)


def paper_source(p: Any) -> str:
    if isinstance(p, PV):
        return p.source + (f" ({p.note})" if p.note else "")
    if isinstance(p, Mapping) and isinstance(p.get("lo"), PV):
        lo = p["lo"]
        return lo.source + (f" ({lo.note})" if lo.note else "")
    return ""


@dataclass
class Row:
    key: str
    quantity: str
    paper: Any
    ours: float | None
    unit: str = ""
    prov: str = ""
    note: str = ""
    # a ratio over repeat runs: its bootstrap interval, run counts and per-run-group ratios
    stats: RatioStats | None = None
    # our load where this row's runs follow another mapping than the report's ``loads``
    ours_c: int | None = None
    # for an argmax row ("the budget with the highest output"): the other candidates whose repeats
    # reach ours (stats.argmax_with_ties), so the claim cannot single ours out
    tied: tuple = ()
    # the fewest repeats behind any candidate of such a row: with one run a candidate's noise
    # cannot be told from the difference, so the claim is untested
    argmax_runs: int | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        return self.stats.interval if self.stats else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return self.stats.spread if self.stats else None

    @property
    def ratio(self) -> float | None:
        p = paper_number(self.paper)
        if self.ours is None or p is None or p == 0:
            return None
        return float(self.ours) / p

    @property
    def measured(self) -> bool:
        return self.ours is not None


@dataclass
class Report:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    panels: dict[str, str] = field(default_factory=dict)
    tables: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # row key -> measured reason it differs
    # the compared loads, {paper C: ours C} (harness.load_mapping labels both)
    loads: dict[int, int] = field(default_factory=dict)
    decode_gpus: int = PAPER_DECODE_GPUS  # the paper's decode GPUs for the figure's model
    measured_with: str = ""
    png: Path | None = None
    md: Path | None = None

    # ------------------------------------------------------------------ collecting
    def compare(
        self,
        key: str,
        quantity: str,
        paper: Any,
        ours: Any,
        unit: str = "",
        prov: str = "",
        note: str = "",
        stats: RatioStats | None = None,
    ) -> Row:
        o = as_float(ours)
        row = Row(
            key,
            quantity,
            paper,
            o,
            unit,
            prov if o is not None else NOT_MEASURED,
            note,
            stats if o is not None else None,
        )
        self.rows.append(row)
        return row

    def panel(self, letter: str, status: str) -> None:
        self.panels[letter] = status

    def table(self, title: str, df: pd.DataFrame | str) -> None:
        md = df if isinstance(df, str) else df_to_markdown(df)
        self.tables.append((title, md))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def diagnose(self, keys: Iterable[str], text: str, append: bool = False) -> None:
        """A measured reason for rows whose claim may not hold (shown beside the claim);
        ``append`` adds it after a reason already given."""
        for k in keys:
            self.why[k] = f"{self.why[k]}{REASON_SEP}{text}" if append and self.why.get(k) else text

    def argmax_ties(self, row: Row, values: dict, best, tied: tuple, name: str) -> None:
        """Mark an argmax row ("the budget with the highest output") with the candidates its
        repeats cannot single ``best`` out from (stats.argmax_with_ties) and the fewest repeats
        behind a candidate, which the claim's criterion reads; a tie's repeat ranges are
        appended to the row's measured reason."""
        row.tied, row.argmax_runs = tied, fewest_runs(values)
        if tied:
            self.diagnose([row.key], tie_text(best, tied, values, name), append=True)

    def note_reasons(self, reasons: Iterable[str]) -> None:
        """One note per distinct reason (e.g. each left-out run), as a sentence."""
        for why in dict.fromkeys(reasons):
            self.note(why[0].upper() + why[1:].rstrip(".") + ".")

    def value(self, key: str) -> float | None:
        for r in self.rows:
            if r.key == key:
                return r.ours
        return None

    def row(self, key: str) -> Row | None:
        for r in self.rows:
            if r.key == key:
                return r
        return None

    @property
    def n_measured(self) -> int:
        return sum(1 for r in self.rows if r.measured)

    # ------------------------------------------------------------------ output
    def markdown(self, heading_level: int = 1, image: str | None = None) -> str:
        h = "#" * heading_level
        out = [f"{h} {self.title}", ""]
        if image:
            out += [f"![{self.name}]({image})", ""]
        notes = Footnotes()
        if self.loads:
            out += [f"Loads: {loads_line(self.loads, self.decode_gpus)}.", ""]
        if self.measured_with:
            mw = self.measured_with
            out += [f"Measured with: {mw if len(mw) <= CELL_MAX else notes.sources(mw)}", ""]
        if self.panels:
            out.append("Panels: " + "; ".join(f"**{k}** {v}" for k, v in self.panels.items()))
            out.append("")
        if self.rows:
            sources = [paper_source(r.paper) for r in self.rows]
            common = max(set(sources), key=sources.count)
            out += [f"{h}# Paper vs ours", ""]
            if common and sources.count(common) > 1:
                out += [f"Paper values from {common} unless a row names another source.", ""]
            out += [
                "| quantity | paper | ours | ours/paper | paper source; ours from |",
                "|---|---|---|---|---|",
            ]
            for r, src in zip(self.rows, sources):
                q = quantity_cell(r, notes)  # its note numbered before the sources'
                ratio = fmt(r.ratio) if r.ratio is not None else "—"
                src = (
                    "" if src == common and sources.count(common) > 1 else notes.cell(src, limit=30)
                )
                prov = r.prov if r.prov == NOT_MEASURED else notes.sources(r.prov)
                out.append(
                    f"| {q} | {paper_text(r)} | {ours_text(r)} | "
                    f"{ratio} | {'; '.join(x for x in (src, prov) if x)} |"
                )
            out.append("")
        out += notes.markdown()
        for title, md in self.tables:
            out += [f"{h}# {title}", "", md, ""]
        out += self._not_measured(h)
        notes = self.all_notes()
        if notes:
            out += [f"{h}# Notes", ""] + [f"- {n}" for n in notes] + [""]
        return "\n".join(out)

    def summary_markdown(self, heading_level: int, image: str, detail: str) -> str:
        """This report as REPRODUCTION.md shows it: the figure, its loads and panels, a compact
        paper-vs-ours table (rows named '<group>: <quantity>' folded into a group x quantity
        grid) and a link to ``detail``, the full report (every row's paper source and
        provenance, the run lists, the extra tables and the notes). Numbers are the full
        report's, formatted alike."""
        h = "#" * heading_level
        out = [f"{h} {self.title}", "", f"![{self.name}]({image})", ""]
        if self.loads:
            out += [f"Loads: {loads_line(self.loads, self.decode_gpus)}.", ""]
        if self.panels:
            out += ["Panels: " + "; ".join(f"**{k}** {v}" for k, v in self.panels.items()), ""]
        notes = Footnotes()
        if self.rows:
            sources = [paper_source(r.paper) for r in self.rows]
            common = max(set(sources), key=sources.count)
            if common and sources.count(common) > 1:
                # how a long source was read (Fig. 11's segments) is in the full report
                src = common
                if len(common) > CELL_MAX:
                    src = f"{common.split(' (')[0]} (read as the full report says)"
                out += [f"Paper values from {src} unless the full report names another.", ""]
            grids, rest = fold_grids(self.rows)
            for columns, lines in grids:
                out += [
                    "| paper / ours | " + " | ".join(columns) + " |",
                    "|---|" + "---|" * len(columns),
                ]
                for label, by_col in lines:
                    cells = [
                        f"{paper_text(r)} / {ours_text(r)}" if r else ""
                        for r in (by_col.get(c) for c in columns)
                    ]
                    out.append(f"| {label} | " + " | ".join(cells) + " |")
                out.append("")
            if rest:
                out += ["| quantity | paper | ours | ours/paper |", "|---|---|---|---|"]
                for r in rest:
                    ratio = fmt(r.ratio) if r.ratio is not None else "—"
                    out.append(
                        f"| {quantity_cell(r, notes)} | {paper_text(r)} | {ours_text(r)} | "
                        f"{ratio} |"
                    )
                out.append("")
        out += notes.markdown()
        out += self._not_measured(h)
        n_tables, n_notes = len(self.tables), len(self.all_notes())
        more = [
            f"{n} {what}{'s' if n > 1 else ''}"
            for what, n in (("table", n_tables), ("note", n_notes))
            if n
        ]
        out += [
            "Where each number came from (paper source, preset, run list, commits)"
            f"{', ' + ' and '.join(more) if more else ''}: [{detail}]({detail}).",
            "",
        ]
        return "\n".join(out)

    def _not_measured(self, h: str) -> list[str]:
        missing = [r for r in self.rows if not r.measured]
        if not missing and not any(NOT_MEASURED in v for v in self.panels.values()):
            return []
        out = [f"{h}# Not yet measured", ""]
        for k, v in self.panels.items():
            if NOT_MEASURED in v:
                out.append(f"- panel {k}: {v}")
        for r in missing:
            out.append(f"- {r.quantity} (paper: {fmt(r.paper)}{(' ' + r.unit) if r.unit else ''})")
        return out + [""]

    def all_notes(self) -> list[str]:
        """The report's notes, then what the output-cap rule left out (harness.results)."""
        notes = list(self.notes)
        if self.name in SUPERSEDED:
            n, cap, newer = SUPERSEDED[self.name]
            if n:
                notes.append(
                    f"{n} older run(s) with another output cap are left out: this figure "
                    f"uses the runs at the {cap}-token cap."
                )
            if newer:
                notes.append(
                    f"{newer} newer run(s) at another output cap are left out until they cover "
                    f"every system and setting this figure's {cap}-token runs measured at "
                    "their loads (a partial rerun)."
                )
        return notes

    def print(self) -> None:
        print(f"== {self.title}")
        w = max([len(r.quantity) for r in self.rows] + [10])
        for r in self.rows:
            u = f" {r.unit}" if r.unit else ""
            ours = fmt(r.ours) + u if r.measured else NOT_MEASURED
            ratio = f"  ours/paper {fmt(r.ratio)}" if r.ratio is not None else ""
            print(f"  {r.quantity:<{w}}  paper {fmt(r.paper)}{u:<8}  ours {ours}{ratio}")
        if self.png:
            print(f"  -> {self.png}  {self.md}")

    def claims_caption(self) -> str:
        """One line per headline claim this report's rows hold (figures/claims.py): the
        claim, the paper's value and ours with its interval; '' without any."""
        from figures.claims import CLAIMS, GEOMETRY, MAGNITUDE, ours_load

        lines = []
        for cl in CLAIMS.values():
            if cl.report != self.name or cl.kind in (MAGNITUDE, GEOMETRY):
                continue
            row = self.row(cl.key)
            if row is None or row.ours is None:
                continue
            iv = f" (90% {fmt(row.interval[0])}-{fmt(row.interval[1])})" if row.interval else ""
            ours_c = ours_load(cl, row, self)
            at = f" at paper C{cl.paper_c}" if cl.paper_c else ""
            at += f" = ours C{ours_c}" if at and ours_c else ""
            lines.append(
                f"{cl.text}{at}: paper {fmt(paper_number(cl.paper))}, ours {fmt(row.ours)}{iv}"
            )
        return "\n".join(lines)

    def _note_unused_runs(self, results: Path | None) -> None:
        """Where nothing of the report was measured but its experiments' directories hold
        finished runs (a smoke or ad-hoc sweep at other models or loads than the figure
        compares), say so rather than leave bare not-measured panels."""
        if results is None or any(r.ours is not None for r in self.rows) or not self.rows:
            return
        # the figure's own experiments: fig1 and fig1_h200, not fig10
        dirs = [Path(results) / self.name, *sorted(Path(results).glob(f"{self.name}_*/"))]
        found = {d.name: len(list(d.glob("*/summary.json"))) for d in dirs if d.is_dir()}
        found = {k: v for k, v in found.items() if v}
        if found:
            where = ", ".join(f"{n} in {Path(results) / k}" for k, n in found.items())
            text = (
                f"Finished runs were found ({where}), none at the preset and loads this figure "
                f"compares; `python -m figures.sweep <experiment>` plots any experiment's runs."
            )
            self.note(text)
            print(f"[{self.name}] {text}", file=sys.stderr)

    def finish(self, fig, args) -> Report:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        self._note_unused_runs(getattr(args, "results", None))
        self.png = out / f"{self.name}.png"
        self.md = out / f"{self.name}.md"
        if fig is not None:
            caption = self.claims_caption()
            if caption:  # under the panels: the image says what the report's claims measured
                fig.text(0.01, 0.0, caption, ha="left", va="top", fontsize=7, color="#333333")
            fig.savefig(self.png, dpi=args.dpi, bbox_inches="tight")
            plt.close(fig)
        self.md.write_text(self.markdown(image=self.png.name))
        if not getattr(args, "quiet", False):
            self.print()
        return self


def paper_text(r: Row) -> str:
    return fmt(r.paper) + (f" {r.unit}" if r.unit and r.paper is not None else "")


def ours_text(r: Row) -> str:
    """Our value with its unit and interval, or the not-measured marker."""
    if r.ours is None:
        return f"*{NOT_MEASURED}*"
    return fmt(r.ours) + (f" {r.unit}" if r.unit else "") + interval_text(r)


def quantity_cell(r: Row, notes: Footnotes) -> str:
    """The row's quantity with its note in parentheses, or with the note as a numbered note where
    both do not fit a cell."""
    q = r.quantity + (f" ({r.note})" if r.note else "")
    if len(q) > CELL_MAX and r.note:  # a long quantity without a note stays as it is
        q = f"{r.quantity} {notes.ref(r.note[0].upper() + r.note[1:])}"
    return q.replace("|", "\\|")  # an absolute value's bars would end the cell


def fold_grids(rows: Sequence[Row]) -> tuple[list, list[Row]]:
    """Rows named '<group>: <quantity>' as grids of group x quantity, and the rows left over.

    A group is a run of at least two consecutive rows with one prefix and distinct quantities; a
    grid collects the groups that share a quantity with it (a row between them that belongs to
    no group does not end it), so Table A3's 126 rows become one grid of 21 groups x 6; a grid
    of one group, with fewer than two thirds of its cells filled or more than GRID_MAX_COLUMNS
    quantities stays rows. Returns
    ([(columns, [(group label, {column: row})])], rows in no grid), both in the rows' order."""
    groups: list[tuple[str | None, list[Row]]] = []
    for r in rows:
        prefix, sep, _ = r.quantity.partition(": ")
        key = prefix if sep and not r.note else None  # a row's note has no place in a grid cell
        if key is not None and groups and groups[-1][0] == key:
            groups[-1][1].append(r)
        else:
            groups.append((key, [r]))
    grids: list[tuple[list[str], list]] = []
    rest: list[Row] = []
    for key, rs in groups:
        cols = [r.quantity.partition(": ")[2] for r in rs]
        if key is None or len(rs) < 2 or len(set(cols)) < len(cols):
            rest += rs
            continue
        if not grids or not set(cols) & set(grids[-1][0]):
            grids.append(([], []))
        columns, lines = grids[-1]
        columns += [c for c in cols if c not in columns]
        lines.append((key.replace("|", "\\|"), dict(zip(cols, rs))))
    # a grid of one group, one mostly empty (Fig. 7's loads each compare other blocks) or one
    # wider than a screen (Table 1's two derived presets, 20 quantities) reads better as rows
    kept = []
    for columns, lines in grids:
        filled = sum(len(by_col) for _, by_col in lines)
        wide = len(columns) > GRID_MAX_COLUMNS
        if len(lines) >= 2 and not wide and 3 * filled >= 2 * len(columns) * len(lines):
            kept.append((columns, lines))
        else:
            rest += [r for _, by_col in lines for r in by_col.values()]
    grids = kept
    order = {id(r): i for i, r in enumerate(rows)}
    return grids, sorted(rest, key=lambda r: order[id(r)])


def interval_text(r: Row) -> str:
    """' (90% [paired] lo-hi; groups lo-hi)' for a row with a bootstrap interval, else ''."""
    if r.interval is None:
        return ""
    paired = "paired " if r.stats is not None and r.stats.paired else ""
    text = f" (90% {paired}{fmt(r.interval[0])}–{fmt(r.interval[1])}"
    if r.spread is not None and len(r.stats.group_ratios) > 1:
        text += f"; run groups {fmt(r.spread[0])}–{fmt(r.spread[1])}"
    return text + ")"


def df_to_markdown(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(fmt(v) if not isinstance(v, str) else v for v in row) + " |")
    return "\n".join(lines)


def parse_args(
    name: str,
    doc: str | None,
    argv: Sequence[str] | None = None,
    add: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The figure scripts' common options (``--results``, ``--out``, ``--dpi``, ``--quiet``),
    plus a script's own where ``add`` adds them to the parser."""
    ap = argparse.ArgumentParser(
        prog=f"python -m figures.{name}",
        description=(doc or "").strip().splitlines()[0] if doc else None,
    )
    ap.add_argument(
        "--results",
        type=Path,
        default=Path(os.environ.get("DHS_RESULTS", DEFAULT_RESULTS)),
        help="results directory to read (default: results/)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="where to write <name>.png and <name>.md (default: figures/out/)",
    )
    ap.add_argument("--dpi", type=int, default=150)
    ap.add_argument("--quiet", action="store_true", help="do not print the comparison")
    if add is not None:
        add(ap)
    return ap.parse_args(list(argv) if argv is not None else None)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def pct_change(a: float | None, b: float | None) -> float | None:
    """(a / b - 1) * 100."""
    r = ratio(a, b)
    return None if r is None else (r - 1.0) * 100.0


def spread_pct(values: list[float]) -> float:
    """(max / min - 1) * 100 over ``values``; unbounded where one is 0 and another is not."""
    lo, hi = min(values), max(values)
    if lo <= 0:
        return 0.0 if hi == lo else math.inf
    return (hi / lo - 1.0) * 100.0


def parse_budget(text: str) -> float | None:
    """B/k from a tag like 'B2k', 'b4k', 'Bk' or 'B=0.5k'."""
    m = re.search(r"[Bb]=?(\d*\.?\d*)k", text)
    if not m:
        return None
    return float(m.group(1)) if m.group(1) else 1.0
