"""asv plumbing: asv's command line with an atomic JSON writer (``asv_atomic``), asv's ``worktree``
environment (``asv_worktree``, the plugin asv.conf.json names) and the figures of the classes asv
times itself, read back from its results (``asv_timed``).

It imports itself, run, measure and the store, and asv (by absolute import: this package shadows
no top-level ``asv``); of optbench's other layers, reporting and the CLI import it."""
