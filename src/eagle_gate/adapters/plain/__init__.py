"""The plain step (one target DECODE returned in the flat speculative format)
and what it needs: the shared step and its version parts (``step``), tensor
helpers (``tensors``), lazy draft sync (``lazy``), and the plain step's own
DECODE CUDA graphs at run time (``graphs``) and at start (``capture``)."""
