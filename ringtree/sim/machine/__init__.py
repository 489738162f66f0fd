"""The modeled machine: the cluster graph (:mod:`.cluster`), its routes (:mod:`.routing`),
named clusters (:mod:`.presets`), where ranks run (:mod:`.placement`), and the model's
rules (:mod:`.model`: what a transfer and a reduction cost, one :class:`.model.Rules`
record read by every engine)."""
