"""Producers: node agents, training hooks, the cluster simulator, the publisher."""
