#!/usr/bin/env bash
# Run the test suite: lint (ruff, import contracts, snakefmt, snakemake --lint), then pytest on three workers (pytest-xdist). Starts the
# services the cluster tests use — a single-node Slurm on localhost (Debian packages, needs root), set up while the
# linters run — so that those tests run against the real scheduler.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
# `bash scripts/test.sh --quick [pytest args]`: the contributor's inner loop (docs/contributing.md) — the unit and
# property tests of the math, the grader, the config and the credit methods; no linters, no services, no studies.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --quick ]; then
  shift
  exec python3 -m pytest -n 2 -m "not slow and not slurm and not vllm" \
    tests/credit tests/trainer tests/stats tests/core/test_grading_corpus.py tests/core/test_grading_modes.py \
    tests/core/test_rewards.py tests/pipeline/test_study_config.py tests/pipeline/test_plugin_config.py "$@"
fi
slurm_setup=""
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  SITE=1 WITH_DBD=1 bash scripts/slurm-single-node.sh >/tmp/grail-slurm-setup.log 2>&1 &
  slurm_setup=$!
fi
# The suite writes about 13 GB at its peak (the reduced SmolLM2 study 8.6 GiB, the CPU image 2.4 GB): say so up front
# rather than leave a full disk to show up as a cascade of unrelated setup errors.
free_gb=$(df -P -k "${TMPDIR:-/tmp}" 2>/dev/null | awk 'NR==2 {print int($4 / 1048576)}' || true)
if [ -n "$free_gb" ] && [ "$free_gb" -lt 13 ]; then
  echo "warning: ${free_gb} GB free under ${TMPDIR:-/tmp}; the whole suite needs about 13 GB there" >&2
fi
ruff check .
ruff format --check .
# The architecture's import contracts (pyproject.toml [tool.importlinter], ARCHITECTURE.md): entry modules import
# no entry module, the subpackages import only downward, no cycles.
lint-imports --no-cache
snakefmt --check .
# Snakemake's linter on the default, paper, SmolLM2, ablations and quick studies, from a scratch directory (it writes .snakemake/ there).
lint_dir="$(mktemp -d)"
for study in configs/default.yaml configs/paper.yaml configs/smol.yaml configs/ablations.yaml configs/quick.yaml; do
  PYTHONPATH="$PWD" snakemake --snakefile "$PWD/Snakefile" --directory "$lint_dir" --configfile "$PWD/$study" --lint
done
rm -rf "$lint_dir"
# The documentation site: a broken link, a missing page or an unresolvable API reference fails the build.
site_dir="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 PYTHONPATH="$PWD" mkdocs build --strict --quiet --site-dir "$site_dir"
rm -rf "$site_dir"
if [ -n "$slurm_setup" ] && ! wait "$slurm_setup"; then
  echo "Slurm could not be started (log: /tmp/grail-slurm-setup.log)" >&2
  tail -n 20 /tmp/grail-slurm-setup.log >&2
  # Under CI the Slurm tests are part of the acceptance: do not let them silently skip.
  [ "${CI:-}" = true ] && exit 1
fi
# Three workers on two cores: much of the suite waits (Slurm polling, engine start-up, image downloads, subprocess
# studies), so a third worker fills the CPU time two leave idle (measured: pytest 48 -> 40 minutes on this machine;
# peak memory about 16 GB of 24); the work units and their order are tests/conftest.py's (the Slurm tests on one
# worker, the long poles first). The slowest tests in the log, to see where the suite's time goes.
# The suite starts many Python processes (stages, Snakemake runs, Slurm job steps); an environment that sets
# PYTHONDONTWRITEBYTECODE (this machine's image does) makes each compile the package's modules from source
# again (about 0.35 s of CPU a stage process here), so the suite writes the bytecode caches (.gitignore'd).
unset PYTHONDONTWRITEBYTECODE
# One compute thread a process (a study's jobs still get their rule's threads from Snakemake): three workers share two
# cores, and processes that each run a thread per core beside one another spend it waiting on their OpenMP threads;
# vLLM's CPU engines would also pin their threads to the cores (nobind leaves that to the kernel). Measured: three
# colocated vLLM training tests side by side 152 -> 117 s, 291 -> 223 s of CPU; over the whole suite about even (some
# non-vLLM training tests with a core to spare ran slower), pytest 80 min 57 s in all on the AVX2 CI machine.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind
python3 -m pytest -n 3 --dist loadgroup --no-loadscope-reorder -ra --durations=60 "$@"
