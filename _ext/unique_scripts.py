"""Sphinx extension: drop repeated inline scripts from every page.

sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = ...``) during
``env-before-read-docs``, after the HTML builder has started. Sphinx 7.4 then records it twice:
once from ``app.add_js_file(None, ...)`` directly on the builder, and again when the builder
re-reads the registry as ``add_js_file('', ...)``. The two differ only in ``None`` versus ``''``,
so Sphinx's own de-duplication keeps both, and the browser reports
"Identifier 'THEBE_JS_URL' has already been declared". Keeping the first copy of each script
fixes the page without touching the extension.
"""


def _unique(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        attributes = tuple(sorted(getattr(script, "attributes", {}).items()))
        key = (getattr(script, "filename", None) or "", attributes)
        if key not in seen:
            seen.add(key)
            kept.append(script)
    if "script_files" in context:
        context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _unique, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
