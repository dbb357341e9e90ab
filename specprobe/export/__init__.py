"""From a saved result to something to run: the engine's serving config for the
recommended K (`export.serving`, with each engine's writer in
`engines/<engine>/export.py`), the same in the engine's synthetic-acceptance form,
and retraining data where the drafter is weakest (`export.training`).

Reads saved results only: the serving-config exports never import torch (as `report`,
they run where the models are not). The training export reads the on-disk reference
cache and the target's tokenizer, and defers those imports into the function that needs
them.
"""
