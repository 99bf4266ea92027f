"""Ray start/join: which cluster, whether it is safe, a local cluster, `ray job submit`."""
