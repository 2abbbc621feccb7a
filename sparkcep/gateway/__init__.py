"""The gateway: an engine served to other processes — Spark's source and sink, clients, the CLI.

:mod:`.endpoint` serves an engine on an address (every connection proves the
engine's token first), :mod:`.client` is its client, :mod:`.protocol` the
frames between them, :mod:`.staging` the all-or-nothing micro-batches of
Spark's sink, :mod:`.discovery` how a process of this machine finds the
engine started last. Below the control plane (:mod:`sparkcep.control`),
which uses it to reach a cluster's engine host.
"""
