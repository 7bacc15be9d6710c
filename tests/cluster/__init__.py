"""A test cluster of namespaced hosts on this machine, and the multi-host tests that run on it."""
