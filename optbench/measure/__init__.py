"""Measuring: the one timing primitive (``timing``) and its turns with a partner process
(``lockstep``), device memory (``memory``), the GPUs' profiles (``hardware``), the machine and its
GPU's state (``machine``), roofline ceilings and floors (``roofline``), a smaller GPU emulated on a
larger one (``emulate``), communication against computation on a timeline (``overlap``), and the
signals that interrupt a case (``signals``).

It imports itself and the store (the run's settings); nothing of optbench above it, nor kernels,
models or benchmarks."""
