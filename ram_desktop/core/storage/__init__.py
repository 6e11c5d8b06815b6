"""Storage: reading checkpoints (``formats``: headers only, slices on demand), the atomic output
writer (``output``), host ↔ device copies (``transfer``) and the guarded file reads every input goes
through (``safe_read``). Storage knows files and tensors, not merges: it imports nothing from the
engine, the methods or the ecosystem."""
