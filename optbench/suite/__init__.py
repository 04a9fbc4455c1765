"""What is measured: the catalog (torch-free), the op registry, the workloads that build each case,
the plan of what a machine can run. Imports itself, run, measure, the store, kernels and models."""
