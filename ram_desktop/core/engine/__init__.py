"""The numeric engine: aligning base and agents into tensor jobs (``plan``), reading them in slices
(``chunks``), the passes over the data (``passes``) and the contract types they read of a method
(``contracts``), the generic fused CPU primitives (``kernels`` and their numba source ``kernel_code``;
each method's own fused kernel lives beside it in ``core.methods``), the probe report (``probe``) and
inspection statistics (``inspection``). The engine never imports the methods. One merge end to end is
``core.pipeline``."""
