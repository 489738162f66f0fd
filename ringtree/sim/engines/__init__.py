"""The engines: one reference (:mod:`.reference`, the specification) and the
accelerators that reproduce it exactly (:mod:`.batched`, :mod:`.alpha_beta`,
:mod:`.fixed_point` with :mod:`.link_stages`, :mod:`.rounds`, :mod:`.native`; link FIFOs
as arrays in :mod:`.fifo`), each behind the contract of :mod:`.contract` and chosen by
:mod:`.dispatch` alone."""
