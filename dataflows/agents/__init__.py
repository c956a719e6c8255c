"""Node and cluster agents that feed the flow: the GPU collector, the log shipper, the Slurm watcher, log import."""
