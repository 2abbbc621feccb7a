"""Fault tolerance: active replication, the duplicate-filtering sink, Flux's catch-up (DESIGN §5).

Over the same runtime hooks as live migration (control records at an
epoch, bin extract/install, generations of a deployment):

* :mod:`.replicas` — a deployment run as replicas on disjoint instance
  managers, each fed every input; a failed one dropped from the feed at once;
* :mod:`.dedup` — the sink that publishes each epoch's rows from the replica
  that delivers it first and drops the other copy;
* :mod:`.catchup` — a lost replica rebuilt on a standby instance manager from
  a survivor's state at an epoch, while the query runs.
"""
