"""Placements found without a MILP, and bounds proven without one: the paper's baselines and warm
starts, constructions on the layer axis, local search over the exact max flow, and upper bounds."""
