# One run of the train stage through a cluster executor, as the project's Snakefile runs it: the run-time settings
# (checkpoint_volume among them) in the job's environment (GRAIL_RUNTIME), the run directory from the output's local
# path (a storage provider's, in a pod). The start model and the rows are host paths (config: model, data), which
# the stand-in's pods reach.
import json
import os

from pipeline.runtime.settings import RuntimeSettings

RuntimeSettings(checkpoint_volume=config.get("checkpoint_volume")).export()


rule train:
    output:
        "runs/tiny/grpo/seed0/metrics.jsonl",
    params:
        run_dir=lambda wildcards, output: os.path.dirname(output[0]),
        training_spec=json.dumps(config["training_spec"]),
    shell:
        "python -m pipeline.train --model {config[model]:q} --training-spec {params.training_spec:q}"
        " --method-spec '{{}}' --data {config[data]:q} --seed 3 --out {params.run_dir:q}"
