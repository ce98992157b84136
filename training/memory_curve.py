"""What the memory buys, as a table and a plot: the results of one model evaluated at several memory lengths.

`transformers-xl evaluate --memory-lengths` and the demo make the results (`evaluate.evaluate_memory_lengths`: the
paper's protocol at each length, nothing else changed); this module only lays them out: a markdown table (printed
and written), a CSV file, and the loss against the memory length with the evaluation time on a second axis. The loss
is shown as bits per character for character-level text and as perplexity for word-level text (the papers' metrics).
"""

import csv
import io

from matplotlib.figure import Figure

COLUMNS = ("file", "mem_len", "same_length", "loss", "perplexity", "bits_per_{unit}", "predicted_tokens", "seconds",
           "tokens_per_second")  # fmt: skip


def metric(unit: str) -> tuple[str, str]:
    """The result's key and the axis label of the plotted metric: bits per character, or perplexity for tokens."""
    return ("bits_per_character", "bits per character") if unit == "character" else ("perplexity", "perplexity")


def markdown(results: list[dict], unit: str) -> str:
    header = ["file", "memory length", "same_length", "loss", "perplexity", f"bits per {unit}", "tokens predicted",
              "seconds", "tokens/s"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        cells = [r["file"], r["mem_len"], "yes" if r["same_length"] else "no", f"{r['loss']:.5f}",
                 f"{r['perplexity']:.3f}", f"{r[f'bits_per_{unit}']:.5f}", r["predicted_tokens"], f"{r['seconds']:.2f}",
                 f"{r['tokens_per_second']:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def csv_text(results: list[dict], unit: str) -> str:
    columns = [column.format(unit=unit) for column in COLUMNS]
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(results)
    return text.getvalue()


def draw(axes, results: list[dict], unit: str, model_mem_len: int | None = None):
    """On `axes`, the metric against the memory length (one line per file) and, on a second y axis, the seconds each
    evaluation took (dashed); a dotted vertical line at the model's own `mem_len`. Returns the second axes."""
    key, label = metric(unit)
    seconds_axes = axes.twinx()
    files = list(dict.fromkeys(r["file"] for r in results))
    for index, file in enumerate(files):
        points = [r for r in results if r["file"] == file]
        lengths = [r["mem_len"] for r in points]
        name = f" ({file})" if len(files) > 1 else ""
        axes.plot(lengths, [r[key] for r in points], "o-", color=f"C{index}", label=f"{label}{name}")
        seconds_axes.plot(lengths, [r["seconds"] for r in points], "s--", color=f"C{index}", alpha=0.5,
                          label=f"evaluation time{name}")  # fmt: skip
    if model_mem_len is not None:
        axes.axvline(model_mem_len, color="gray", linestyle=":", label=f"the model's mem_len ({model_mem_len})")
    axes.set(xlabel="memory length (positions)", ylabel=label)
    axes.ticklabel_format(axis="y", useOffset=False)
    seconds_axes.set(ylabel="evaluation time (s)")
    seconds_axes.set_ylim(bottom=0)
    handles, labels = axes.get_legend_handles_labels()
    more_handles, more_labels = seconds_axes.get_legend_handles_labels()
    axes.legend(handles + more_handles, labels + more_labels, fontsize="small")
    return seconds_axes


def plot_png(results: list[dict], unit: str, title: str, model_mem_len: int | None = None) -> bytes:
    """`draw` on a figure of its own, as PNG bytes (no pyplot: no GUI backend, no global state)."""
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    draw(axes, results, unit, model_mem_len)
    axes.set_title(title, fontsize="medium")
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100)
    return png.getvalue()
