"""The runtime: deployments, sub-query instances, balancers."""
