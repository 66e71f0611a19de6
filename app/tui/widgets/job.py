"""The running job: progress (tokens of max, ETA from the measured rate), its figures and the text so far."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import ProgressBar

from nightshift.app.tui.format import seconds, stamp
from nightshift.app.tui.widgets.plot import History, RatePlot
from nightshift.app.tui.widgets.text import Line

# Figures a streamed store adds to a run's progress (a dense model has none: "—"): the prompt's read
# amplification, and the drive whose read landed last (the barrier) most often in recent passes.
ENGINE_FIGURES = (("cache_hits", "cache hits", "{}"), ("prefetch_recall", "prefetch recall", "{:.0%}"),
                  ("read_amplification", "prefill read amp", "{:.2f}x"), ("last_landed", "last to land", "{}"))  # fmt: skip


def eta(progress: dict[str, Any]) -> float | None:
    """Seconds left at the measured decode rate, if the run goes to its token limit."""
    rate, done, limit = (
        progress.get("decode_tokens_per_s"),
        progress.get("generated_tokens"),
        progress.get("max_tokens"),
    )
    if not rate or done is None or not limit:
        return None
    return max(0, limit - done) / rate


def figures(progress: dict[str, Any]) -> str:
    """Two lines: the generation's rates and times, then what the engine says about its reads."""
    limit = progress.get("max_tokens") or "?"
    if not progress.get("generated_tokens"):
        first = f"reading the {progress.get('prompt_tokens', 0)}-token prompt; up to {limit} tokens to write"
    else:
        first = (f"{progress['generated_tokens']}/{limit} tokens  {progress.get('decode_tokens_per_s', 0):.1f} tok/s  "
                 f"TTFT {progress.get('time_to_first_token', 0):.2f} s  prompt {progress.get('prompt_tokens', 0)}  "
                 f"ETA {seconds(eta(progress))}")  # fmt: skip
    second = "  ".join(
        f"{label} {template.format(progress[key]) if progress.get(key) is not None else '—'}"
        for key, label, template in ENGINE_FIGURES
    )
    return f"{first}\n{second}"


class JobPanel(Vertical):
    """Shows `run` (a queue entry as the service reports it), or says nothing runs."""

    def __init__(self, tokens_history: History, **kwargs):
        super().__init__(**kwargs)
        self.title = Line("no job running", classes="title")
        self.bar = ProgressBar(show_eta=False, show_percentage=True)
        self.figures = Line()
        self.plot = RatePlot(tokens_history, "tok/s")
        self.text = Line(classes="generated")
        self.scroll = VerticalScroll(self.text)

    def compose(self) -> ComposeResult:
        yield self.title
        yield self.bar
        yield self.figures
        yield self.plot
        yield self.scroll

    def show(self, run: dict[str, Any] | None) -> None:
        progress = (run or {}).get("progress") or {}
        for part in (self.bar, self.figures, self.scroll):
            part.display = run is not None
        self.plot.redraw()
        if run is None:
            self.title.set("no job running")
            return
        self.title.set(f"run {run['id']}: {run['review']} ({run['origin']}, started {stamp(run.get('started'))})")
        self.bar.update(total=progress.get("max_tokens") or None, progress=progress.get("generated_tokens", 0))
        self.figures.set(figures(progress))
        text = progress.get("text") or "(waiting for the first token)"
        if text != self.text.text:
            self.text.set(text)
            self.scroll.scroll_end(animate=False)
