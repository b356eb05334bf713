"""Event-driven simulator of a Helix cluster (``helix simulate``).

It replays a workload through a plan with the *same* pure scheduling objects the live system uses:
the coordinator's schedulers (:mod:`coordinator.schedulers`) pick every request's pipeline and the
workers' step policy (:mod:`worker.step_policy`, over :mod:`worker.kv_blocks`) batches every step;
only the clock is simulated, with step times from :class:`helix.core.costmodel.CostModel` and transfers
over the spec's links.

Modelling choices, so numbers can be read correctly:

- A step's time is the sum over the node's layers of the cost model's one-layer time for the batch
  present at that layer (requests entering mid-slice join at their entry layer).
- A sampled token goes last stage -> coordinator -> first stage, each hop over its link (the
  paper's route; the live system may forward it straight to the first stage).
- Links are FIFO by default (one ZeroMQ connection per peer pair sends messages in order);
  ``link_sharing="fair"`` splits a link's bandwidth among its messages in flight instead.
- The coordinator reserves KV for prompt + the workload's mean output per request and masks nodes
  above the high-water mark; workers track real KV blocks and preempt (recompute) on overflow.
- Offline mode admits requests in trace order whenever some pipeline has KV room; online mode
  uses the trace's (rescaled) arrival times or Poisson arrivals, queueing at the coordinator.
- Latencies count from arrival (online) or admission (offline); a request whose prompt + output
  cannot fit a pipeline's KV at all is rejected, as the live API would refuse it.

Layout: ``events`` (event classes), ``engine`` (heap loop, coordinator and worker handlers),
``worker`` (step policy + step timing), ``network`` (links), ``workload`` (Azure trace, Poisson),
``metrics`` (collector, :class:`~helix.sim.metrics.SimResult`), ``build`` (spec + plan -> simulator),
``run`` (the API behind the CLI and the benchmark), ``plots``.
"""
