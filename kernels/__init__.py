"""Hot-path kernels (Triton on CUDA, torch on CPU), each with a torch reference."""
