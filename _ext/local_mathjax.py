"""Sphinx extension: load the book's own MathJax only where a page has math.

Jupyter Book 1 adds every ``.js`` file under ``html_static_path`` to ``html_js_files``, which
puts the vendored MathJax (``_static/mathjax``) on every page, undeferred, and a second time on
pages with math, where ``sphinx.ext.mathjax`` loads it from ``mathjax_path``. Dropping the
automatic entries leaves the loading to ``sphinx.ext.mathjax``: once, deferred, after the
configuration it writes, and only on pages with math.
"""


def _drop_static_mathjax(app, config):
    folder = config.mathjax_path.rpartition("/")[0] + "/"
    config.html_js_files = [
        entry
        for entry in config.html_js_files
        if not (isinstance(entry, str) and entry.startswith(folder))
    ]


def setup(app):
    app.connect("config-inited", _drop_static_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
