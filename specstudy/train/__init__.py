"""Drafter training: distil the small drafters of :mod:`specstudy.engine.drafters` from a target.

No package ships a small model with SmolLM2's tokenizer, so the kit distils its own drafters
from the target, on text the target itself generates from the kit's prompts.  Every kind is
trained by distillation: the cross-entropy of the drafter's distribution against the target's
own next-token distribution (its top-``label_top_k`` probabilities, renormalised) at the
position the drafter predicts — the softmax restricted to the tokens labelled in the batch,
which keeps a CPU step cheap — plus an EAGLE-style regression of the drafter's vector onto the
target's own last hidden state there.  Features come from the generation passes themselves.

* :mod:`.data` — the target's greedy generations and the features read from them
* :mod:`.losses` — distillation and feature-regression losses
* :mod:`.loop` — settings, the train/held-out split and the optimiser loop every kind shares
* :mod:`.heads` — Medusa/Hydra-style heads and the layer-skip adapter (position-wise drafters)
* :mod:`.eagle` — the EAGLE-style layer (whole sequences, teacher-forced)
* :mod:`.distill` — :func:`~.distill.train_drafter`, the one entry point (``specstudy train-drafter``)

Training imports torch and the engine's architectures; nothing in the engine imports this package.
"""
