"""The protocol the coordinator and the workers both speak.

``wire`` (data-plane messages and their frames), ``data_plane`` (ZeroMQ sockets that carry them),
``control`` (the gRPC control service and client), ``sampling`` (what a request asks of the sampler),
``io_types`` (a stage's inputs and outputs), ``stats`` (a worker's snapshot). ``worker/`` and
``coordinator/`` both import this package; neither imports the other.
"""
