"""The rendered book in a real browser (Debian's Chromium): no console errors, nothing fetched
from outside the book, executed outputs present, and forms that answer without a kernel.

With BOOK_SCREENSHOTS=1 in the environment, a full-page screenshot of every page, and of every
form after its choices changed, is saved in _build/screenshots for people to look at; they take
seconds a page, so a plain test run takes none.
"""

from urllib.parse import urlparse

import pytest
from conftest import FORM_PAGES, needs_chromium, pages, save

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]


def visit(browser, url):
    """Open a page; return it with its console errors and the requests that left the book."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors, outside = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    origin = urlparse(url).netloc

    def record(request):
        parsed = urlparse(request.url)
        if parsed.scheme not in ("data", "blob", "about") and parsed.netloc != origin:
            outside.append(request.url)

    page.on("request", record)
    page.goto(url, wait_until="networkidle")
    return page, errors, outside


@needs_chromium
@pytest.mark.parametrize("stem", pages())
def test_page_loads_cleanly_and_shows_its_outputs(browser, site, stem):
    page, errors, outside = visit(browser, f"{site}/notebooks/{stem}.html")
    save(page, f"{stem}.png", full_page=True)
    assert errors == []
    assert outside == []
    if stem[:2].isdigit():
        assert page.locator(".cell_output").count() > 0
        assert page.locator(".cell_output .output.error, .output.traceback").count() == 0
    page.close()


@needs_chromium
@pytest.mark.parametrize("stem", FORM_PAGES)
def test_forms_answer_without_a_kernel(browser, site, stem):
    page, errors, _ = visit(browser, f"{site}/notebooks/{stem}.html")
    forms = page.locator(".bk-form")
    assert forms.count() > 0
    for k in range(forms.count()):
        form = forms.nth(k)
        out = form.locator(".bk-out")
        assert out.inner_html().strip(), "a form shows its first choice on load"
        selects = form.locator("select")
        for s in range(selects.count()):
            select = selects.nth(s)
            options = select.locator("option").all_inner_texts()
            if len(options) < 2:
                continue
            before = out.inner_html()
            other = next(o for o in options if o != select.input_value())
            select.select_option(other)
            assert out.inner_html() != before, f"choosing {other!r} changed nothing"
        # what a reader sees after changing every choice once, for people to look at
        save(form, f"{stem}-form{k + 1}.png")
    assert errors == []
    page.close()


@needs_chromium
def test_the_sharding_explorer_is_on_its_page(browser, site):
    page, _, _ = visit(browser, f"{site}/notebooks/02_sharded_arrays.html")
    form = page.locator(".bk-form").first
    form.locator("select").nth(0).select_option("2x2x2")
    form.locator("select").nth(1).select_option("('data', 'model')")
    assert "P(('data', 'model'), None)" in form.locator(".bk-out").inner_text()
    form.locator("select").nth(2).select_option("('data', 'model')")
    assert "used twice" in form.locator(".bk-out").inner_text()
    page.close()


@needs_chromium
def test_the_layout_form_is_on_its_page(browser, site):
    page, _, _ = visit(browser, f"{site}/notebooks/13_transformer_3d.html")
    form = page.locator(".bk-form").first
    assert "DP on 8 devices in a line (data=8)" in form.locator(".bk-out").inner_text()
    form.locator("select").nth(0).select_option("FSDP x TP")
    assert form.locator("select").nth(1).locator("option").all_inner_texts() == ["4x2", "2x4"]
    form.locator("select").nth(1).select_option("2x4")
    shown = form.locator(".bk-out").inner_text()
    assert "FSDP x TP on the 2x4 mesh (fsdp=2, model=4)" in shown
    assert "memory_analysis()" in shown and "all-gather" in shown
    page.close()
