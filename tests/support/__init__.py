"""What the tests need around them: a Kafka-protocol broker (Tansu), a real Slurm cluster, an NVML stand-in."""
