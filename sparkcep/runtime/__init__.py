"""The runtime: deployments, sub-query instances, balancers, the engine."""
