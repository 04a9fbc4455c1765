"""The core: timing, memory, the result store, compare and merge, the machine and its hardware
profile, the roofline. It imports nothing of optbench's other layers, nor kernels, models or
benchmarks."""
