"""From Programs to what the engines run: every rank's Programs flattened with the
executor's compiler (:mod:`.compiled`), what a sweep's sizes share (:mod:`.structure`,
:mod:`.pairing`), one symbolic template for every rank (:mod:`.symbolic`,
:mod:`.template`), slots renamed by sets (:mod:`.renaming`), and the caches of their
pure answers (:mod:`.recent`)."""
