"""The training layer: data, tensor and pipeline parallelism over ``torch.distributed``.

One small module per idea, written against ``torch.distributed`` so the same code runs
on the ``ringtree`` backend and on gloo:

- :mod:`.grid`: ``arange(world).view(dp, pp, tp)``, the groups, neighbours, checks;
- :mod:`.comms`: every collective / p2p, named by grid axis and recordable;
- :mod:`.tensor_parallel`: Megatron's f/g, column/row-parallel linears, heads split,
  vocabulary-parallel embedding and cross-entropy;
- :mod:`.schedule` and :mod:`.pipeline_parallel`: GPipe and 1F1B as tables, run per stage;
- :mod:`.data_parallel` and :mod:`.zero`: bucketed async gradient all-reduce, ZeRO-1;
- :mod:`.trainer`, :mod:`.checkpoint`, :mod:`.record`, :mod:`.train_cli`
  (``ringtree train``).
"""
