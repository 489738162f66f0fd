"""Greedy serving of the GPT over a paged, prefix-cached KV cache (torch required).

- :mod:`ringtree.apps.serve.scheduler`: continuous batching, block allocation, preemption;
- :mod:`ringtree.apps.serve.engine`: the tensor-parallel forward over the paged cache;
- :mod:`ringtree.apps.serve.tpcomm`: the engine's communication (ringtree or gloo);
- :mod:`ringtree.apps.serve.runner`: one replica's serving loop;
- :mod:`ringtree.apps.serve.router`: cache-aware and round-robin routing over replicas;
- :mod:`ringtree.apps.serve.generate` and :mod:`ringtree.apps.serve.cli`: ``ringtree generate``.

See ``docs/serving.md``.
"""
