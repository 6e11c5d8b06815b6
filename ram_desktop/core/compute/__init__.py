"""Compute set-up: which accelerator this machine has, which torch build can use it, and a per-user runtime
folder that holds that build (docs/compute.md).

Plain Python (standard library only; torch is imported only in the verifying child process): ``detect``
reads the hardware, ``builds`` turns a detection into a plan, ``install`` runs ``uv`` into a staged runtime
folder and verifies it, ``runtime`` puts a verified folder ahead of the bundled torch at start-up.
"""
