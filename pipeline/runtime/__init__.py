"""How a job runs, never what it computes: launching processes on CPUs, GPUs and Slurm nodes, preemption signals,
time windows, the stall watchdog, free-disk checks, the cluster's images and config digests, and the run-time
settings that travel with a job."""
