"""The search space: one library-neutral description of what a sweep searches.

`params` (the parameter types, loguniform, choice, int ranges, grid, and their conversion at
the edge to Ray Tune, Optuna and ConfigSpace), `conditions` (`when:`: parameters searched only
where others have given values, and the grid of such a space), `constraints`
(`search.constraints`: expressions every configuration keeps). Imports neither Ray nor torch
(a library is imported only by the conversion that needs it).
"""
