"""Event-driven simulator of a Helix cluster (``helix simulate``).

It replays a workload through a plan with the *same* pure scheduling objects the live system uses:
the coordinator's schedulers (:mod:`coordinator.schedulers`) pick every request's pipeline and the
workers' step policy (:mod:`worker.step_policy`) batches every step; only the clock is simulated,
with step times from :class:`helix.costmodel.CostModel` and transfers over the spec's links.
"""
