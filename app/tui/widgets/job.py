"""The running job: progress (tokens of max, ETA from the measured rate), its figures and the text so far."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import ProgressBar

from nightshift.app.daemon.runs import Run, RunProgress
from nightshift.app.tui.format import seconds, stamp
from nightshift.app.tui.widgets.plot import History, RatePlot
from nightshift.app.tui.widgets.text import Line


def eta(progress: RunProgress) -> float | None:
    """Seconds left at the measured decode rate, if the run goes to its token limit."""
    if not progress.decode_tokens_per_s or not progress.max_tokens:
        return None
    return max(0, progress.max_tokens - progress.generated_tokens) / progress.decode_tokens_per_s


def figures(progress: RunProgress) -> str:
    """Two lines: the generation's rates and times, then what the engine says about its reads."""
    limit = progress.max_tokens or "?"
    if not progress.generated_tokens:
        first = f"reading the {progress.prompt_tokens}-token prompt; up to {limit} tokens to write"
    else:
        first = (f"{progress.generated_tokens}/{limit} tokens  {progress.decode_tokens_per_s:.1f} tok/s  "
                 f"TTFT {progress.time_to_first_token:.2f} s  prompt {progress.prompt_tokens}  "
                 f"ETA {seconds(eta(progress))}")  # fmt: skip
    # A streamed store's figures (a model held in memory has none: "—"): the prompt's read amplification,
    # and the drive whose read landed last (the barrier) most often in recent passes.
    engine = (("cache hits", progress.cache_hits, "{}"), ("prefetch recall", progress.prefetch_recall, "{:.0%}"),
              ("prefill read amp", progress.read_amplification, "{:.2f}x"),
              ("last to land", progress.last_landed, "{}"))  # fmt: skip
    second = "  ".join(
        f"{label} {'—' if value is None else template.format(value)}" for label, value, template in engine
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

    def show(self, run: Run | None) -> None:
        for part in (self.bar, self.figures, self.scroll):
            part.display = run is not None
        self.plot.redraw()
        if run is None:
            self.title.set("no job running")
            return
        self.title.set(f"run {run.id}: {run.review} ({run.origin}, started {stamp(run.started)})")
        progress = run.progress or RunProgress()
        self.bar.update(total=progress.max_tokens or None, progress=progress.generated_tokens)
        self.figures.set(figures(progress))
        text = progress.text or "(waiting for the first token)"
        if text != self.text.text:
            self.text.set(text)
            self.scroll.scroll_end(animate=False)
