import os

import torch

if not torch.cuda.is_available():  # run Triton kernels on the CPU; must be set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
