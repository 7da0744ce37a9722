"""Hand-written GPU kernels, each beside the reference path it must equal.

Why a room of its own: a method module states its paper's mathematics once, in plain PyTorch (the reference path,
which is also the fallback on CPUs, without Triton, and for shapes a kernel does not cover); a kernel is an
implementation detail with its own tests (forward and every gradient against the reference, under Triton's
interpreter on the CPU) and its own cost model. Kernels are plain tensor functions that know no model: they import
nothing of interlayer but this package and the error classes, and the core (the loss) and the methods call them,
never the other way round.

One dispatch rule decides between them (:func:`interlayer.kernels.dispatch.use_triton`): a kernel runs when
Triton imports, its tensors are on a CUDA device (or on the CPU under ``TRITON_INTERPRET=1``, how the suite tests
them), the kernel covers the case, and the mode allows it (``INTERLAYER_KERNELS=auto|triton|reference``, or
:func:`interlayer.kernels.dispatch.kernel_mode` around a block).
"""
