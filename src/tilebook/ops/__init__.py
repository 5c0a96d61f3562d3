"""One module per kernel: its Triton kernels, the launcher and autograd where it applies.

Every public op is also a ``torch.library`` operator (``torch.ops.tilebook.*``;
:mod:`tilebook.ops.library`): inside a ``torch.compile``'d function the op calls
its operator instead of its eager path, so ``fullgraph=True`` holds, the gradient
is traced with the rest, and Inductor launches the traceable kernels itself.
Called eagerly, each op keeps its own fast path.
"""
