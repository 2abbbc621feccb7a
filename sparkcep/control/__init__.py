"""Control plane: the loopback endpoint and its client, discovery of the local engine."""
