"""Reports from stored results: tables, charts and the HTML site. Imports itself, the gate, the
suite, asv (to publish asv's site), run, measure, the store and models."""
