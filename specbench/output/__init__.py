"""What a run produces: its typed records, the run directory they are written to and read from, and the
tables, plots and Markdown rendered from them."""
