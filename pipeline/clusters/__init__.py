"""The preflight's checks of a cluster run, one room a concern: ``slurm`` (sinfo and Slurm's own verdicts),
``compute_job`` (the test job on a compute node), ``kubernetes`` (the profile, the S3 storage and the API),
``software`` (plugins, the GPU rules' packages, flash-attn, the training engine), ``hub`` (the Hugging Face cache)
and ``disk`` (free space and quotas). Each check answers as a ``check.Check``; ``python -m pipeline.preflight``
runs them as the checklist of a first cluster run and prints them with the cost estimate.
"""
