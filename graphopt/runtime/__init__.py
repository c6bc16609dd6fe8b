"""graphopt's own runtime (issue 4): runs optimized models on the GPU with CuPy."""
