"""The run's whole life on the Live screen: preparing, reading the prompt, writing, cancelling, then a card.

Every figure is the run's own (its progress record); estimates say what they are based on: an
earlier run of the same review (its prompt reading rate, the length it wrote) or, lacking one,
the token limit as an upper bound.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import ProgressBar

from nightshift.app.batch_progress import batched, endings, reading, steps_left, tokens_at_most
from nightshift.app.batch_progress import eta as batch_eta
from nightshift.app.daemon.runs import Run, RunProgress
from nightshift.app.tui.ages import STALE_AFTER_S, Ages, age_label
from nightshift.app.tui.format import seconds, stamp, took
from nightshift.app.tui.widgets.plot import History, RatePlot
from nightshift.app.tui.widgets.text import Fit, Line

TOKENS_STEP_S = 1.0  # the service stores a running run's progress once a second
ENDED = {"stop": "ended at an end token", "length": "reached max_tokens", "cancelled": "cancelled"}


def earlier(run: Run, runs: list[Run]) -> Run | None:
    """The latest finished run of the same review that wrote something alone: what estimates go by (a run
    that shared a batch read every run's prompts before its first token, and wrote at the batch's pace)."""
    return next((r for r in runs if r.review == run.review and r.id != run.id and r.state == "done"
                 and r.progress and r.progress.generated_tokens and r.progress.time_to_first_token
                 and len(r.progress.batch) < 2), None)  # fmt: skip


def eta(progress: RunProgress, before: Run | None) -> tuple[float | None, str]:
    """Seconds left writing at the measured rate, and what length that assumes.

    A batch (several answers): the steps its longest open answer has left to its limit, at the measured time
    per step, said as an upper bound. One answer: the length an earlier run of the review wrote, when it ended
    by itself and this run has not passed it; else the token limit, said as an upper bound.
    """
    if batched(progress):
        left = batch_eta(progress)
        steps = steps_left(progress.answers)
        return (left, f"at most: the longest open answer has {steps} tokens to go") if left is not None else (None, "")
    rate, done = progress.decode_tokens_per_s, progress.generated_tokens
    if not rate:
        return None, ""
    wrote = before.progress.generated_tokens if before is not None and before.progress else 0
    if before is not None and before.progress.finish_reason == "stop" and done < wrote <= progress.max_tokens:
        return (wrote - done) / rate, f"if as long as run {before.id} ({wrote} tokens)"
    if progress.max_tokens:
        return max(0, progress.max_tokens - done) / rate, f"at most, to max_tokens {progress.max_tokens}"
    return None, ""


def reading_estimate(progress: RunProgress, before: Run | None) -> str:
    """How long reading this prompt takes at the rate an earlier run of the review read its own."""
    if before is None or not before.progress:
        return "no earlier run to estimate from"
    rate = before.progress.prompt_tokens / before.progress.time_to_first_token
    return f"about {seconds(progress.prompt_tokens / rate)} in all at run {before.id}'s {rate:.1f} tok/s"


def live_figures(run: Run, before: Run | None, now: float) -> tuple[str, ...]:
    """The running run's phase and figures, longest rendering first."""
    progress = run.progress
    running = seconds(took(run, now))
    if progress is None:
        return (f"preparing: reading the data, running the checks, loading the model · {running}",
                f"preparing (checks, model) · {running}", f"preparing {running}")  # fmt: skip
    if not progress.generated_tokens:
        return _reading(progress, before, running)
    left, basis = eta(progress, before)
    done, rate, first = progress.generated_tokens, progress.decode_tokens_per_s, progress.time_to_first_token
    prompt = f"{progress.prefill_tokens_per_s:.1f} tok/s"
    if batched(progress):
        answers = progress.answers
        limit = tokens_at_most(answers)
        return (f"writing {len(answers)} answers: {done}/{limit} tokens at most · {rate:.1f} tok/s together · "
                f"prompts read at {prompt}\nETA {seconds(left)} {basis} ({endings(answers)})",
                f"writing {len(answers)} answers {done}/{limit} · {rate:.1f} tok/s\nETA {seconds(left)} at most",
                f"{done}/{limit} tok · {rate:.1f} tok/s · ETA {seconds(left)}")  # fmt: skip
    limit = progress.max_tokens or "?"
    return (f"writing: {done}/{limit} tokens at {rate:.1f} tok/s · prompt {progress.prompt_tokens} read at {prompt}"
            f" in {first:.1f} s\nETA {seconds(left)} {basis}".rstrip(),
            f"writing {done}/{limit} · {rate:.1f} tok/s · prompt {prompt} · TTFT {first:.1f} s\n"
            f"ETA {seconds(left)} {basis}".rstrip(),
            f"{done}/{limit} tok · {rate:.1f} tok/s · ETA {seconds(left)}")  # fmt: skip


def _reading(progress: RunProgress, before: Run | None, running: str) -> tuple[str, ...]:
    """Before the first token: the prompt (each answer's, in a batch) being read, then the first token worked out."""
    read = f"{progress.prompt_done}/{progress.prompt_tokens}"
    part = reading(progress.answers) if batched(progress) else None
    if (progress.prompt_tokens and progress.prompt_done >= progress.prompt_tokens) or (batched(progress) and not part):
        # The last chunk's rows are in the cache; the first token's own pass (the last layers' experts,
        # the logits) is still being computed, which can take a while on a slow machine.
        what = (
            f"prompts read ({read} tokens)" if batched(progress) else f"prompt read ({progress.prompt_tokens} tokens)"
        )
        return (f"{what}; working out the first token · running {running}",
                f"{what.split(' (')[0]}; first token next · {running}", f"first token next · {running}")  # fmt: skip
    estimate = reading_estimate(progress, before)
    if part is not None:
        number, answer = part
        which = f"answer {number} of {len(progress.answers)}"
        return (f"reading the prompts: {which} ({answer.prompt_done}/{answer.prompt_tokens}) · {read} tokens in all "
                f"· running {running}\n{estimate}",
                f"reading prompts: {which} · {read} · {running}\n{estimate}",
                f"reading {which} · {read} · {running}")  # fmt: skip
    return (f"reading the prompt: {read} tokens read · running {running}\n{estimate}",
            f"reading the prompt: {read} tokens · {running}\n{estimate}",
            f"reading prompt {read} · {running}")  # fmt: skip


def engine_figures(progress: RunProgress) -> tuple[str, ...]:
    """What a streamed store's engine says about this run: its reads, the expert memory budget (its size, what it
    holds, the lookups it served), prefetch, and the process's peak memory ("—" for a model held in memory)."""
    read = sum(progress.drive_bytes.values()) if progress.drive_bytes else None
    budget = progress.cache_budget
    held = (f"budget {progress.cache_used / 1e9:.2f}/{budget / 1e9:.2f} GB held, {progress.cache_hit_rate:.0%} hits"
            if budget else "budget —")  # fmt: skip
    peak = f"peak memory {progress.peak_memory_bytes / 1e9:.2f} GB" if progress.peak_memory_bytes else "peak memory —"
    engine = (("read", read / 1e6 if read is not None else None, "{:.0f} MB"),
              ("prefetch recall", progress.prefetch_recall, "{:.0%}"),
              ("prefill read amp", progress.read_amplification or None, "{:.2f}x"),  # 0: not known until read
              ("last to land", progress.last_landed, "{}"))  # fmt: skip
    rest = [f"{label} {'—' if value is None else template.format(value)}" for label, value, template in engine]
    return (" · ".join([rest[0], held, *rest[1:], peak]),
            " · ".join([rest[0], held]) + "\n" + " · ".join([*rest[1:], peak]),
            " · ".join([rest[0], held]) + "\n" + " · ".join([rest[1], peak]), " · ".join([rest[0], held]))  # fmt: skip


def card(run: Run, now: float) -> tuple[str, ...]:
    """A finished run: when and how it ended, its figures and its report (kept until the next run)."""
    progress = run.progress or RunProgress()
    when = f"{run.state} at {stamp(run.finished, '%H:%M')} after {seconds(took(run, now))}"
    if run.state != "done":
        return (f"{when}\n{run.error or ''}".rstrip(), f"{when}\n{run.error or ''}".rstrip())
    if batched(progress):  # how each answer ended: a batch "reaches max_tokens" only answer by answer
        written = f"{progress.generated_tokens} tokens in {len(progress.answers)} answers ({endings(progress.answers)})"
    else:
        written = f"{progress.generated_tokens} tokens ({ENDED.get(progress.finish_reason or '', progress.finish_reason or '')})"
    report = (run.report or "").rsplit("/", 1)[-1]
    rate = f"{progress.decode_tokens_per_s:.1f} tok/s"
    return (
        f"{when} · {written} · {rate} · first token after {progress.time_to_first_token:.1f} s\n"
        f"report {run.report} · o opens it",
        f"{when}\n{written} · {rate}\n{report} · o opens it",
        f"{run.state} {stamp(run.finished, '%H:%M')} · {progress.generated_tokens} tok · {rate}\n{report} · o opens",
    )  # fmt: skip


def bar_total(progress: RunProgress) -> int:
    """The bar's end: the prompt while it is read, then the tokens the run can still reach (a batch's shrinks
    as answers end, so it ends full at what was written)."""
    if not progress.generated_tokens:
        return progress.prompt_tokens
    return tokens_at_most(progress.answers) if batched(progress) else progress.max_tokens


class JobPanel(Vertical):
    """The running run, else the last finished one as a card, else what to do to start one."""

    def __init__(self, tokens_history: History, **kwargs):
        super().__init__(**kwargs)
        self.title = Line("no job running", classes="title")
        self.figures = Fit()
        self.bar = ProgressBar(show_eta=False, show_percentage=True)
        self.engine = Fit(classes="note")
        self.batch = Line(classes="note")  # which runs share this run's batch, when it shares one
        self.batch.display = False
        self.plot = RatePlot(tokens_history, "tok/s", TOKENS_STEP_S, floor=1.0)
        self.text = Line(classes="generated")
        self.scroll = VerticalScroll(self.text)
        self.phase = ""  # reading, writing, or "" (no run running)

    def compose(self) -> ComposeResult:
        yield self.title
        yield self.figures
        yield self.bar
        yield self.batch
        yield self.engine
        yield self.plot
        yield self.scroll

    def show(self, runs: list[Run], cancelling: int | None, now: float) -> None:
        current = next((run for run in runs if run.state == "running"), None)
        progress = current.progress if current is not None else None
        self.phase = "" if progress is None else "writing" if progress.generated_tokens else "reading"
        last = current or next((run for run in runs if run.state in ("done", "failed", "interrupted")), None)
        for part in (self.figures, self.engine, self.plot, self.scroll):
            part.display = last is not None
        self.bar.display = current is not None
        self.set_class(current is not None and current.id == cancelling, "cancelling")
        self.set_class(last is not None and last.state in ("failed", "interrupted"), "failed")
        self.plot.redraw()
        if last is None:
            self.title.set("no job running, none has run yet: on the Queue screen (2) select a review and press n")
            return
        progress = last.progress or RunProgress()
        if current is None:
            self.title.set(f"last run {last.id}: {last.review} ({last.origin}) · started {stamp(last.started)}")
            self.figures.set(*card(last, now))
        else:
            if current.id == cancelling:
                self.title.set(f"run {current.id}: {current.review} · CANCELLING: it stops at its next token")
            else:
                self.title.set(
                    f"run {current.id}: {current.review} ({current.origin}) · started {stamp(current.started)}"
                )
            alone = len(progress.batch) < 2  # in a batch the figures are the batch's: no run alone compares
            self.figures.set(*live_figures(current, earlier(current, runs) if alone else None, now))
            self.bar.update(total=bar_total(progress) or None,
                            progress=progress.generated_tokens or progress.prompt_done)  # fmt: skip
        self.engine.set(*engine_figures(progress))
        self.batch.set(progress.batch_line())
        self.batch.display = bool(progress.batch_line())
        text = progress.text or ("(the text appears as it is written)" if current is not None else "(no text)")
        if text != self.text.text:
            self.text.set(text)
            self.scroll.scroll_end(animate=False)

    def age(self, ages: Ages) -> str:
        """The age of the queue's figures and, while a run runs, of its latest progress record."""
        queue = age_label(ages.service)
        if ages.record is None or ages.record < 1.0:
            return queue
        if self.phase == "writing" and ages.record > STALE_AFTER_S:  # records come once a second while writing
            return f"{queue} · no new figures from the run for {ages.record:.0f} s"
        if self.phase == "reading":
            return f"{queue} · last figures {ages.record:.0f} s ago (one per chunk of prompt read)"
        return queue
