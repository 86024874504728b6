"""What a run leaves: the run directory its records (core/records/) are written to and read from, and the
tables and plots rendered from them."""
