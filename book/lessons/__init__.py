"""Code the chapters teach, exported from their cells for later chapters to reuse.

A chapter's code cells tagged ``export`` are its reusable lesson: ``python -m
book.lessons.export`` writes them, in order, to ``book/lessons/<module>.py`` (the pairs
of chapter and module are in ``book.lessons.export.LESSONS``). The modules are
generated: the chapter is the one source, and a test fails when a module differs from
its chapter's cells.
"""
