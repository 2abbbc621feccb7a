"""A cluster's data path that survives the death of the process holding it (DESIGN §6, Flux's process pairs).

The data path — the sources' sequence, the staged micro-batches, the output
logs and their consumers' positions, the deployments — lives in an engine
host, the *primary*, and in a *standby* fed before anything is acknowledged:

* :mod:`.journal`: the primary's record of what it took (deploys, stamped
  sends, ends, aborts, layouts) and the entries it streams to its standby,
  outputs and consumers included, each before it counts;
* :mod:`.backup`: the standby's copy, and the take-over: a new engine that
  deploys the recorded queries and replays the recorded input, the output
  logs already holding every row published (an epoch is taken once);
* :mod:`.wire`: how entries cross the standby link (JSON headers, Arrow IPC);
* :mod:`.roles`: who is primary, who is standby, fenced by the registry
  (``/engine``, ``/datapath``, eras).
"""
