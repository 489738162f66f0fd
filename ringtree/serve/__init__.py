"""Greedy serving of the GPT over a paged, prefix-cached KV cache (torch required).

- :mod:`ringtree.serve.scheduler`: continuous batching, block allocation, preemption;
- :mod:`ringtree.serve.engine`: the tensor-parallel forward over the paged cache;
- :mod:`ringtree.serve.tpcomm`: the engine's communication (ringtree or gloo);
- :mod:`ringtree.serve.runner`: one replica's serving loop;
- :mod:`ringtree.serve.router`: cache-aware and round-robin routing over replicas;
- :mod:`ringtree.serve.generate` and :mod:`ringtree.serve.cli`: ``ringtree generate``.

See ``docs/serving.md``.
"""
