"""One module per kernel: its Triton kernels, the launcher and autograd where it applies.

Inside a ``torch.compile``'d function each public op runs as an opaque call: Dynamo
stops its graph there (a graph break), calls the op as ordinary eager code, with
autograd, and resumes after it.  That keeps every op usable in compiled models on
any Triton version; registering them as ``torch.library`` custom ops, which would
let Inductor keep one graph around them, is the next step.
"""
