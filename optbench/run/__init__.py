"""Running a grid of cases and telling the user about it: check-then-time grids (``runner``), a
run's progress events and their console lines (``progress``), where its time went
(``breakdown``), the one console and table renderer (``console``), docstrings as command-line help
(``helptext``), the timer checked against ``triton.testing.do_bench`` (``calibrate``), a commit's
code in a worktree of its own (``worktree``) and the compile caches a run carries from one machine
to the next (``compile_cache``).

It imports itself, measure and the store; nothing of optbench above it, nor kernels, models or
benchmarks."""
