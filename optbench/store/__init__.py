"""The store: optbench's result store, one file of records per run (``store``), the typed reader of
a stored record (``records``), other runners' results folded in (``merge``), and a run's settings,
the only reader of optbench's environment variables (``settings``).

The bottom room: it imports nothing of optbench but itself, nor kernels, models or benchmarks."""
