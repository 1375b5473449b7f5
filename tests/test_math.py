"""Math on the rendered pages: typeset in the browser by the book's own MathJax, nothing fetched
from outside the book.

The chapters write formulas as ``$...$`` and ``$$...$$``; Sphinx puts each in a ``.math``
element and loads MathJax from ``_static/mathjax`` on the pages that have one. Here every such
page is opened in Debian's Chromium, and every formula must have become MathJax output, with
no TeX error, its fonts served by the book, and no request leaving the page. With
BOOK_SCREENSHOTS=1 a screenshot of each page is saved in _build/screenshots.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import needs_chromium, save

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]

ROOT = Path(__file__).resolve().parent.parent
# Chapters whose formulas are written as math; each must keep at least one.
WITH_MATH = (
    "03_automatic_parallelism",
    "06_collective_matmul",
    "09_tensor_parallelism",
    "12_performance",
    "13_transformer_3d",
    "14_pipeline_parallelism",
    "15_experts_and_long_sequences",
    "17_profiling",
    "18_planning_a_real_run",
    "19_a_training_run",
    "20_serving",
    "21_newer_forms",
)
MATHJAX = re.compile(r'<script[^>]*src="[^"]*_static/mathjax/tex-chtml-full\.js')


def math_pages(html: Path) -> list[str]:
    """The pages of the built book with at least one formula, by file stem."""
    return sorted(
        p.stem
        for p in (html / "notebooks").glob("*.html")
        if 'class="math notranslate' in p.read_text()
    )


def test_mathjax_loads_once_on_pages_with_math_and_nowhere_else(built_book):
    with_math = math_pages(built_book)
    assert set(WITH_MATH) <= set(with_math)
    for page in (built_book / "notebooks").glob("*.html"):
        loads = len(MATHJAX.findall(page.read_text()))
        # The landing page counts the formulas of the chapters it lists, so it may load it too.
        if page.stem in with_math:
            assert loads == 1, page.name
        elif page.stem != "intro":
            assert loads == 0, page.name
    assert (built_book / "_static" / "mathjax" / "output" / "chtml" / "fonts").is_dir()


@dataclass
class Visit:
    """What a page did while it loaded and typeset its math."""

    errors: list = field(default_factory=list)  # console errors and uncaught exceptions
    outside: list = field(default_factory=list)  # requests that left the book
    failed: list = field(default_factory=list)  # requests that failed or were refused
    fonts: list = field(default_factory=list)  # the fonts MathJax asked for


def typeset(browser, url):
    """Open a page and wait until MathJax has typeset it and fetched its fonts."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    seen = Visit()
    origin = urlparse(url).netloc

    def record(request):
        parsed = urlparse(request.url)
        local = parsed.scheme == "file" or parsed.netloc == origin
        if not local and parsed.scheme not in ("data", "blob", "about"):
            seen.outside.append(request.url)
        if parsed.path.endswith(".woff"):
            seen.fonts.append(request.url)

    def answered(response):
        if response.status >= 400:
            seen.failed.append(f"{response.status} {response.url}")

    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("requestfailed", lambda r: seen.failed.append(r.url))
    page.on("request", record)
    page.on("response", answered)
    page.goto(url, wait_until="networkidle")
    # The page sets MathJax's configuration first; its deferred script, on a busy machine only
    # after the network has gone quiet, then adds startup and its promise of the typesetting.
    page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate("MathJax.startup.promise")
    page.wait_for_load_state("networkidle")  # the fonts the typeset formulas asked for
    return page, seen


@needs_chromium
def test_every_formula_is_typeset_from_the_book_itself(browser, site, built_book):
    for stem in math_pages(built_book):
        page, seen = typeset(browser, f"{site}/notebooks/{stem}.html")
        formulas = page.locator(".math").count()
        assert formulas > 0, stem
        assert page.locator(".math > mjx-container").count() == formulas, stem
        assert page.locator("mjx-merror, [data-mjx-error]").count() == 0, stem
        raw = page.locator(".math").evaluate_all(
            "els => els.filter(e => /\\\\[()[\\]]/.test(e.textContent)).length"
        )
        assert raw == 0, f"{stem}: formulas left as TeX"
        assert seen.fonts, f"{stem}: MathJax loaded no font from the book"
        save(page, f"{stem}-math.png", full_page=True)
        assert seen.outside == [], stem
        assert seen.failed == [], stem
        assert seen.errors == [], stem
        page.close()
