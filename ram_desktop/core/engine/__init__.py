"""The numeric engine: aligning base and agents into tensor jobs (``plan``), reading them in slices
(``chunks``), the passes over the data (``passes``), the fused CPU kernels (``kernels`` and their
numba source ``kernel_code``), the probe report (``probe``), inspection statistics (``inspection``)
and would-keep estimates (``would_keep``). One merge end to end is ``core.pipeline``."""
