"""One module per kernel: its Triton kernels, the launcher, and autograd where it applies."""
