#!/usr/bin/env bash
# Run the test suite: lint (ruff, snakefmt, snakemake --lint), then pytest. Starts the services the cluster tests use first — a single-node Slurm
# on localhost (Debian packages, needs root) — so that those tests run against the real scheduler.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! WITH_DBD=1 bash scripts/slurm-single-node.sh >/tmp/grail-slurm-setup.log 2>&1; then
    echo "Slurm could not be started (log: /tmp/grail-slurm-setup.log)" >&2
    tail -n 20 /tmp/grail-slurm-setup.log >&2
    # Under CI the Slurm tests are part of the acceptance: do not let them silently skip.
    [ "${CI:-}" = true ] && exit 1
  fi
fi
# The suite writes about 13 GB at its peak (the reduced SmolLM2 study 8.6 GiB, the CPU image 2.4 GB): say so up front
# rather than leave a full disk to show up as a cascade of unrelated setup errors.
free_gb=$(df -P -k "${TMPDIR:-/tmp}" 2>/dev/null | awk 'NR==2 {print int($4 / 1048576)}' || true)
if [ -n "$free_gb" ] && [ "$free_gb" -lt 13 ]; then
  echo "warning: ${free_gb} GB free under ${TMPDIR:-/tmp}; the whole suite needs about 13 GB there" >&2
fi
ruff check .
ruff format --check .
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
# the slowest tests in the log, to see where the suite's time goes
python3 -m pytest -ra --durations=40 "$@"
