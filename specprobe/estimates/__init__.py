"""What a drafter buys: τ(K), speedup, best K and adaptive K from the acceptance curves
(pure), the cost model of a round, and the timing of costs on the run's device.
"""
