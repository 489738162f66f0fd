"""What to simulate: the whole run, or one representative per class of equivalent ranks
(:mod:`.choice`), when :mod:`.symmetry` proves the run symmetric under shifts or XOR of
ranks and :mod:`.orbits` that the routes keep it."""
