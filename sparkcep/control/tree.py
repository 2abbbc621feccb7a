"""Where the control plane keeps what in the registry: the paths under a cluster's root.

Nothing here holds a token; what something will act on (a query to deploy)
is sealed with it (:func:`sparkcep.auth.seal`).
"""

MEMBERS = "/members"  # ephemeral, one per live instance manager: name, address, host, pid, cpus, node
ORCHESTRATORS = "/orchestrators"  # ephemeral, one per running orchestrator: name, pid, host, metrics address
LEASE = "orchestrator"  # the lease the orchestrators contend for: its holder leads
ENGINE = "/engine"  # ephemeral: the engine host (the data path) — address, pid, host, run id
REQUESTS = "/requests"  # sealed requests to the leading orchestrator: deploy, undeploy
RESULTS = "/results"  # the leader's answer to each request, by request name
DEPLOYMENTS = "/deployments"  # per query: the sealed query and options, its placement and bin tables
STREAMS = "/streams"  # per input stream: where its source lives
OUTPUTS = "/outputs"  # per output: where its log lives
EVENTS = "/events"  # sequential: instance managers that died (with what they ran), leaders that changed


def member(name: str) -> str:
    return f"{MEMBERS}/{name}"
