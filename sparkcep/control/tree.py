"""Where the control plane keeps what in the registry: the paths under a cluster's root.

Nothing here holds a token; what something will act on (a query to deploy)
is sealed with it (:func:`sparkcep.auth.seal`).
"""

MEMBERS = "/members"  # ephemeral, one per live instance manager: name, address, host, pid, cpus, node
ORCHESTRATORS = "/orchestrators"  # ephemeral, one per running orchestrator: name, pid, host, metrics address
LEASE = "orchestrator"  # the lease the orchestrators contend for: its holder leads
ENGINE = "/engine"  # ephemeral: the primary engine host (the data path) — name, address, pid, host, run, era
DATAPATH = "/datapath"  # the data path's last era: its run, era, primary and the standby synced with it
HOSTS = "/hosts"  # ephemeral, one per engine-host process: name, address, pid, role, era, run
REQUESTS = "/requests"  # sealed requests to the leading orchestrator: deploy, undeploy
RESULTS = "/results"  # the leader's answer to each request, by request name
DEPLOYMENTS = "/deployments"  # per query: the sealed query and options, its placement and bin tables
STREAMS = "/streams"  # per input stream: where its source lives
OUTPUTS = "/outputs"  # per output: where its log lives
EVENTS = "/events"  # sequential: instance managers that died (with what they ran), leaders that changed


def member(name: str) -> str:
    return f"{MEMBERS}/{name}"


def host(name: str) -> str:
    return f"{HOSTS}/{name}"
