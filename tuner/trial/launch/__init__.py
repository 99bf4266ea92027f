"""How Ray runs a trial: the Tune trainable (`trainables`) and a DDP trial's ranks (`ranks`).

One worker: the mode's function runs in the (reused) Tune trial actor. Several workers on one
node: the actor starts them as rank actors in the trial's placement group. Otherwise: a Ray
Train run. Imports neither torch nor Ray at module level: the driver names these functions.
"""
