"""Models shared by the training layer and the serving layer (torch required).

- :mod:`ringtree.apps.models.gpt`: a nanoGPT-style character-level GPT whose weights are a
  plain ``state_dict`` (layout documented there).
- :mod:`ringtree.apps.models.data`: the corpus (the standard library's ``.py`` files), its
  96-character vocabulary and the deterministic batches.
"""
