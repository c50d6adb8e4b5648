"""Where an ``embedder`` instance runs: its NUMA node, CPUs and GPU.

* :mod:`~triton_embed_server.host.placement.slicing`: the one rule that splits CPUs (or physical
  cores) among instances, used here and by ``triton-embed doctor``.
* :mod:`~triton_embed_server.host.placement.instance`: decides an instance's placement once
  (``numa_placement`` = ``off``, ``auto`` or a plan file) into a frozen result.
* :mod:`~triton_embed_server.host.placement.apply`: applies it: the only place that pins CPUs
  (``sched_setaffinity``) and binds memory (``set_mempolicy``).
"""
