"""What is built on the library and only uses it: the DP/TP/PP trainer
(:mod:`~ringtree.apps.parallel`), its models (:mod:`~ringtree.apps.models`), the paged
KV cache (:mod:`~ringtree.apps.kvcache`) and the serving loop
(:mod:`~ringtree.apps.serve`)."""
