"""Render a review as a PDF: Jinja HTML + CSS from templates/reports/, laid out by WeasyPrint.

Nothing is fetched from anywhere but the reports template folder, and the PDF
is written to a temporary file and renamed only when complete.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError, TemplateSyntaxError, select_autoescape

from nightshift.app.paths import bundled
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.typeset import tie

REPORTS_DIR = bundled("templates") / "reports"


def local_only_fetcher():
    """A WeasyPrint URL fetcher that serves files under templates/reports/ and refuses everything else."""
    from weasyprint.urls import URLFetcher, URLFetchingError

    class LocalOnly(URLFetcher):
        def fetch(self, url, headers=None):
            parsed = urlparse(url)
            path = Path(unquote(parsed.path)).resolve() if parsed.scheme == "file" else None
            if path is None or not path.is_relative_to(REPORTS_DIR):
                raise URLFetchingError(f"refused {url}: reports may only use files under {REPORTS_DIR}")
            return super().fetch(url, headers)

    return LocalOnly(allowed_protocols=("file",))


def render_html(template: str, context: dict[str, Any]) -> str:
    environment = Environment(
        loader=FileSystemLoader(REPORTS_DIR), autoescape=select_autoescape(default=True), undefined=StrictUndefined
    )
    environment.filters["tie"] = tie  # where nightshift's own phrases may break across lines
    try:
        return environment.get_template(template).render(**context)
    except TemplateError as exc:
        raise ReviewError(template_problem(REPORTS_DIR, template, exc)) from None


def template_problem(folder: Path, template: str, exc: TemplateError) -> str:
    """What is wrong with a template, where, and what to do (syntax errors carry their line)."""
    line = f":{exc.lineno}" if isinstance(exc, TemplateSyntaxError) and exc.lineno else ""
    return f"template {folder / template}{line}: {exc.message or exc}; fix the template (or use the bundled one)"


PARTIAL_SUFFIX = ".pdf.part"


@functools.cache
def shared_fonts():
    """One WeasyPrint font configuration per process: a new one per PDF kept ~0.2 MB alive per report,
    so a service writing hundreds of reports grew (docs/reliability.md, soak). PDFs are written one at a time."""
    from weasyprint.text.fonts import FontConfiguration

    return FontConfiguration()


def remove_partial_reports(folder: Path) -> list[Path]:
    """Delete what a process killed while writing a PDF left behind; call only while holding the engine lock."""
    leftovers = sorted(folder.glob(f".*{PARTIAL_SUFFIX}")) if folder.is_dir() else []
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)
    return leftovers


def write_pdf(html: str, target: Path) -> Path:
    """Lay out `html` and write the PDF at `target` atomically (temp file in the same folder, then rename)."""
    try:
        from weasyprint import HTML
    except OSError as exc:  # WeasyPrint loads the system's Pango when imported; pip cannot bring it
        raise ReviewError(
            f"cannot lay out the PDF: WeasyPrint needs the Pango library ({str(exc).split(':')[0]}); install it "
            "(Debian/Ubuntu: apt install libpango-1.0-0 libpangoft2-1.0-0; Fedora: dnf install pango)"
        ) from exc

    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=PARTIAL_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            HTML(string=html, base_url=str(REPORTS_DIR) + os.sep, url_fetcher=local_only_fetcher()).write_pdf(
                out, font_config=shared_fonts()
            )
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ReviewError(
            f"cannot write the report {target}: {exc}; check the `output` folder in the schedule"
        ) from exc
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
