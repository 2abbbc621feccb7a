"""The control plane (DESIGN §6): registry, orchestrator, membership, the cluster's engine host, metrics.

* :mod:`.registry` — ZooKeeper (kazoo) or in-process: documents, watches,
  ephemeral members, leases, transactions; :mod:`.tree` — what lives where in it;
* :mod:`.orchestrator` — deploys and records; one leads, a standby takes over;
* :mod:`.host` — the engine host: a cluster's data path, in a process of its own;
* :mod:`.member` — an instance manager's membership (``sparkcep worker --zk``);
* :mod:`.connect` — ``Engine.connect("zk://...")``, a client of a cluster;
* :mod:`.prometheus` — the metric server; :mod:`.status`, :mod:`.deploy`,
  :mod:`.token`, :mod:`.zookeeper`, :mod:`.metrics_cli` — the ``sparkcep`` commands.
"""
