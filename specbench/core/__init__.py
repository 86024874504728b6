"""The torch-free bottom layer everything uses: errors, the one reader and atomic writer, strict JSON, the
ranges of numeric options, Markdown tables, and the typed records a run produces. It imports nothing else
of specbench."""
