"""What a plan delivers to users: throughput at saturation and latencies at 75 % of it, analytically.

The cost model's T(k) is what a node delivers when every request its KV holds is in every step
(:mod:`helix.core.costmodel`). Inside a pipeline of S stages that is not so; this package predicts from
the plan's pipelines (:func:`helix.core.pipelines.enumerate_pipelines`) what the simulator and the live
system measure. The derivation (operating points per node, round trips per pipeline, Little's law)
is in :mod:`helix.core.costmodel`'s docstring, section *Inside a pipeline*; this package computes it:

1. start with one decode per step everywhere;
2. step times of every node at its batch (:meth:`CostModel.stage_step_parts`: a plain step and
   one carrying a prompt piece, chunked by the step budget; a decode rides the step of its
   wave, :meth:`~.model.Model.wave_decodes`), the wait behind the step in progress, the convoys of prompts (:meth:`~.model.Model.convoys_s`: a
   decode wave behind a prompt waits at every stage the two share, its own pipeline's prompts and
   the others' alike) and the wait behind the messages a link
   is sending (links are FIFO queues, M/G/1: :meth:`~.model.Model.link_waits`); round trip R and
   first-token time F of every pipeline (a prompt's pieces after the first paced by its slowest
   stage or link); a request's stay ``T = F + (o - 1) R``;
3. requests in flight per pipeline by progressive filling: every max-flow pipeline grows in
   proportion to its share of requests times its stay (the scheduler sends it that share of the
   arrivals), until a node's KV (high-water mark) or its compute (T(k)) is full; the pipelines
   through that node stop growing, the others go on. Then the paths over the placement's other
   usable hops (share 0) grow into what is
   left: the coordinator's scheduler falls back to them when the flow paths' nodes are full, and
   the baselines' schedulers use every usable hop (:func:`~.fallback.scheduler_fallback` plays its
   rule in bulk to find them and how many requests each takes);
4. per node the decode batch = decode tokens/s through it / steps per s (each pipeline's decodes
   travel in :data:`~.model.DECODE_WAVES` waves, or fewer when it holds fewer requests, one step
   per wave per round trip, more where the waves carry more tokens than the step budget holds
   (the step policy cuts them), but never more steps than back to back); back to 2 until the
   batches and the rates settle (:class:`~.fixed_point.Mixer`: both damped, Anderson-accelerated,
   and why that converges where damping the batches alone cycled; at most 84 evaluations
   measured, :data:`~.fixed_point.MAX_ITERATIONS` a safeguard).

Offline: saturation (the KV fills). Online: requests at ``load`` x the predicted request rate,
Poisson (:mod:`~.predictor`).

One job per module: :mod:`~.model` (the queueing model's arrays and its map, steps 2-4),
:mod:`~.fixed_point` (iterating the map), :mod:`~.fallback` (the scheduler's fallback paths),
:mod:`~.incidence` (the sparse matrices), :mod:`~.predictor` (``predict``: offline and online).

Pure and fast (milliseconds to a second for 40 nodes): no simulation, numbers only.
"""

from planner.prediction.fixed_point import MAX_ITERATIONS, NoFixedPoint
from planner.prediction.model import DECODE_WAVES, PROMPT_CV
from planner.prediction.predictor import ONLINE_LOAD, PipelineState, online_rates, predict

__all__ = ["DECODE_WAVES", "MAX_ITERATIONS", "ONLINE_LOAD", "PROMPT_CV",
           "NoFixedPoint", "PipelineState", "online_rates", "predict"]
