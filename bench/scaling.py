"""How the speedup of each method grows with the model: several suite reports (edge-bench's suite.json, one per
target, e.g. the 150M, 500M and 1B memory-bound targets) side by side, ordered by the bytes of weights the target
reads per step.

    edge-bench --scaling runs/150m,runs/500m,runs/1b --out runs/scaling   ->  scaling.md, scaling.png

A method appears where its report has it (labels as in the suites: `feature (k=adaptive)`, `llama.cpp q8_0`, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

from edge.errors import EdgeError

MEASURES = [  # (summary key, category or None, heading)
    ("speedup_six", None, "Speedup over edge's plain decoding, six categories (whole replies)"),
    ("speedup_by_category", "code", "Speedup on code (whole replies)"),
    ("decode_speedup_six", None, "Speedup of the decode steps alone, six categories"),
    ("decode_speedup_by_category", "code", "Speedup of the decode steps alone, code"),
    ("mean_accepted_tokens", None, "Mean tokens per step"),
]


def read_reports(paths: list[str]) -> list[dict]:
    """Each suite report (a suite.json, or the folder holding one), ordered by the target's weight bytes."""
    reports = []
    for given in paths:
        path = Path(given)
        path = path / "suite.json" if path.is_dir() else path
        if not path.is_file():
            raise EdgeError(f"--scaling {given}: no suite report there; give the --out folder of an edge-bench suite "
                            "run, or its suite.json")
        try:
            report = json.loads(path.read_text())
            report["summary"]
        except (ValueError, KeyError, TypeError):
            raise EdgeError(f"--scaling {given}: {path} is not an edge-bench suite report; run the suite again "
                            "with --out to write one") from None
        if not report.get("target_weight_bytes"):
            raise EdgeError(f"--scaling {given}: the report does not say how many bytes of weights its target reads "
                            "per step (written by edge-bench since the scaling table); run the suite again")
        reports.append(report)
    return sorted(reports, key=lambda r: r["target_weight_bytes"])


def column(report: dict) -> str:
    """A report's heading: the target folder's name, its weight bytes and precision."""
    name = Path(report["model"]).parent.name + "/" + Path(report["model"]).name
    return f"{name} ({report['target_weight_bytes'] / 2**30:.2f} GiB, {report['weights']})"


def value(row: dict, key: str, category: str | None) -> float | None:
    found = row.get(key)
    if category is not None:
        found = (found or {}).get(category)
    return found if isinstance(found, (int, float)) else None


def method_key(label: str) -> str:
    """A method's label with a draft model's path cut to its folder name: `draft:/runs/1b/draft (k=2)` and
    `draft:/runs/150m/draft (k=2)` are one method, each target with its own draft model."""
    for prefix in ("draft:", "hf-assisted:"):
        if label.startswith(prefix):
            path, space, rest = label.removeprefix(prefix).partition(" ")
            return prefix + Path(path).name + space + rest
    return label


def rows_by_method(report: dict) -> dict[str, dict]:
    return {method_key(row["method"]): row for row in report["summary"]}


def methods_in(tables: list[dict[str, dict]]) -> list[str]:
    """Every method of the reports' rows_by_method tables, in order of first appearance."""
    return list(dict.fromkeys(method for table in tables for method in table))


def markdown(reports: list[dict]) -> str:
    headings = [column(r) for r in reports]
    tables = [rows_by_method(report) for report in reports]
    blocks = []
    for key, category, title in MEASURES:
        lines = [f"**{title}**", "", "| method | " + " | ".join(headings) + " |", "|---|" + "---:|" * len(reports)]
        for method in methods_in(tables):
            cells = []
            for table in tables:
                row = table.get(method)
                found = value(row, key, category) if row else None
                suffix = "" if key == "mean_accepted_tokens" else "x"
                cells.append("-" if found is None else f"{found:.2f}{suffix}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    commands = "\n".join(f"- `{r['command']}` ({r['date']}, {r['machine']})" for r in reports)
    return "\n\n".join(blocks) + "\n\nRuns:\n\n" + commands + "\n"


def plot(reports: list[dict], path: Path) -> bool:
    """Speedup (six categories, and code) against the target's weight bytes, a line per method; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = [r["target_weight_bytes"] / 2**30 for r in reports]
    tables = [rows_by_method(report) for report in reports]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=110, sharey=True)
    for axis, (key, category, title) in zip(axes, MEASURES[:2]):
        for method in methods_in(tables):
            points = [(size, value(table[method], key, category)) for size, table in zip(sizes, tables)
                      if method in table]
            points = [(x, y) for x, y in points if y is not None]
            if method != "ar" and points:
                axis.plot(*zip(*points), marker="o", label=method)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xscale("log")
        axis.set_xticks(sizes, [f"{size:.2f}" for size in sizes])
        axis.minorticks_off()
        axis.set_xlabel("target weights read per step (GiB)")
        axis.set_title(title, fontsize=9)
    axes[0].set_ylabel("speedup over edge's plain decoding")
    axes[1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def write(paths: list[str], out: Path) -> tuple[str, bool]:
    """scaling.md (and scaling.png where matplotlib is installed) in `out`: the Markdown, and whether it plotted."""
    reports = read_reports(paths)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(reports)
    (out / "scaling.md").write_text(text)
    return text, plot(reports, out / "scaling.png")
