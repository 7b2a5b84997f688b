#!/usr/bin/env bash
# Build a project image with containers/build.sh and check it from inside, as the image's user. It is the check of
# the GPU image (issue 46), run by hand: the GPU stack is several GB of downloads, so CI does not run it (CI builds
# the CPU variant in tests/clusters/test_containers.py). docs/contributing.md ("The GPU image") has its last figures.
#
#   containers/check_image.sh gpu       # or: cpu
#
# 1. build: `containers/build.sh VARIANT` (cold the first time: the pinned stack), its wall time and the image's size;
# 2. imports torch, transformers, TRL, accelerate, the project (and, gpu, vLLM and DeepSpeed) and prints their
#    versions, torch's CUDA release, what the image says about flash-attn, and which compilers it carries;
# 3. the preflight's software checks inside the image (`python -m pipeline.preflight --software-only`): the small
#    study's must pass; configs/paper.yaml's are printed (with FLASH_ATTN=none they fail on flash-attn, naming the fix);
# 4. a small study on this CPU through the image's torch (a CUDA build on a machine without a GPU): configs/quick.yaml
#    with GRPO and GRAIL (warm-up, training, HF-backend evaluation, report), Snakemake and every stage inside the
#    image, as uid 1000, in a results directory on the host owned by another uid (4242, mode 2770) that the job
#    reaches through its group, as a Kubernetes pod with runAsUser and fsGroup writes a volume it does not own;
#    prints the head of the study's report;
# 5. (gpu) FLASH_ATTN=source's toolkit: containers/cuda_home.sh, run as root in the image, assembles nvcc and CUDA's
#    headers from PyPI at torch's CUDA release, and torch.utils.cpp_extension builds a small CUDA kernel with them
#    (for sm_90) against the image's torch: the path flash-attn's source build takes, short of its hours of compiling;
# 6. a code-only rebuild: a copy of the build context with one line added to pipeline/__init__.py, built under the
#    tag TAG-rebuild-probe-VARIANT (removed afterwards); its wall time and which steps ran.
#
# Env: ENGINE (podman or docker; default podman), TAG, BUILD_OPTS, GPU_BASE_IMAGE, FLASH_ATTN (passed to build.sh),
#      COLD=1 removes the previous build's layers first (the cold build's time), CHECK_TOOLKIT=0 skips step 5, RUN_OPTS (extra
#      `run` flags of step 5, which downloads from PyPI: a proxy's CA, e.g. "-v CA:/ca.crt:ro -e PIP_CERT=/ca.crt"),
#      RESULTS_UID (default 4242), KEEP_RESULTS=1
#      keeps the results directory, LOG_DIR (default: a new temporary directory) keeps each step's full output.
set -euo pipefail
cd "$(dirname "$0")/.."

VARIANT=${1:?usage: $0 gpu|cpu}
case "$VARIANT" in gpu | cpu) ;; *) echo "usage: $0 gpu|cpu" >&2; exit 2 ;; esac
export ENGINE=${ENGINE:-podman}
RESULTS_UID=${RESULTS_UID:-4242}
LOG_DIR=${LOG_DIR:-$(mktemp -d /var/tmp/grail-check-image.XXXXXX)}
mkdir -p "$LOG_DIR"
image=$(bash containers/build.sh names | awk -v v="$VARIANT" '$1 == v {print $2}')
declare -A figure

section() { printf '\n== %s ==\n' "$*"; }
in_image() { "$ENGINE" run --rm --user 1000:1000 "$@"; }

remove_chain() {  # an image and the untagged build steps under it that no other image uses
  local id parent tags
  id=$("$ENGINE" image inspect --format '{{.Id}}' "$1" 2>/dev/null) || return 0
  while [ -n "$id" ]; do
    parent=$("$ENGINE" image inspect --format '{{.Parent}}' "$id")
    "$ENGINE" rmi "$id" >/dev/null 2>&1 || break  # tagged elsewhere, or a step another image builds on
    id=$parent  # podman removes untagged parents with their last child; then this one is gone already
    tags=$("$ENGINE" image inspect --format '{{len .RepoTags}}' "$id" 2>/dev/null) || break
    [ "$tags" = 0 ] || break  # the base image
  done
}

section "1. build ($image)"
cold=""
if [ "${COLD:-0}" = 1 ]; then
  # every step with content anew, the pinned stack's downloads included: the previous build's steps are removed
  # (those it shares with another image, metadata-only ARG steps of the CPU variant, say, stay). Not --no-cache: that
  # would leave two chains of equal steps, and the rebuild below could follow the other one and redo everything.
  remove_chain "$image"
  cold=" (cold: the previous build's steps removed first)"
fi
start=$(date +%s)
bash containers/build.sh "$VARIANT" >"$LOG_DIR/build.log" 2>&1 || { tail -n 40 "$LOG_DIR/build.log"; exit 1; }
figure[build]="$(($(date +%s) - start)) s"
bytes=$("$ENGINE" image inspect --format '{{.Size}}' "$image")
figure[size]="$(awk -v b="$bytes" 'BEGIN {printf "%.2f GB (%d bytes)", b / 1e9, b}')"
echo "build: ${figure[build]}$cold (log: $LOG_DIR/build.log; cached steps: $(grep -c -- '--> Using cache' "$LOG_DIR/build.log" || true))"
echo "size: ${figure[size]}"

section "2. imports and versions (as $(in_image "$image" id -un), uid $(in_image "$image" id -u))"
read -r -d '' imports <<'EOF' || true
import importlib.metadata as metadata, importlib.util, os, shutil, subprocess, sys, time
start = time.monotonic()
import accelerate, pipeline, torch, transformers, trl
names = ["torch", "transformers", "trl", "accelerate", "datasets", "snakemake"]
if os.environ["VARIANT"] == "gpu":
    import deepspeed, vllm
    names += ["vllm", "deepspeed", "triton", "flashinfer-python"]
seconds = time.monotonic() - start
print("python", sys.version.split()[0], "| torch", torch.__version__)
for name in names:
    print(name, metadata.version(name))
print("torch CUDA release:", torch.version.cuda, "| cuDNN:", torch.backends.cudnn.version() if torch.version.cuda else None,
      "| a GPU here:", torch.cuda.is_available())
nvidia = [d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("nvidia-")]
print(f"nvidia-* wheels: {len(nvidia)}")
print("flash-attn:", os.environ.get("GRAIL_FLASH_ATTN"), "| importable:", importlib.util.find_spec("flash_attn") is not None)
for tool in ("gcc", "nvcc"):
    print(f"{tool}:", shutil.which(tool) or "not on PATH")
print("project:", pipeline.__file__, f"| imports took {seconds:.1f} s")
EOF
in_image -e "VARIANT=$VARIANT" "$image" python -c "$imports" >"$LOG_DIR/imports.log" 2>&1 ||
  { cat "$LOG_DIR/imports.log"; exit 1; }
grep -v -E '(INFO|WARNING)' "$LOG_DIR/imports.log"  # the libraries' own start-up notes stay in the log

section "3. preflight, software checks (inside the image)"
in_image "$image" python -m pipeline.preflight --software-only --configfile /opt/grail/configs/quick.yaml \
  2>&1 | tee "$LOG_DIR/preflight-quick.log"
echo "-- configs/paper.yaml:"
status=0
in_image -v "$PWD/eval_data:/opt/grail/eval_data:ro" "$image" python -m pipeline.preflight --software-only \
  --configfile /opt/grail/configs/paper.yaml >"$LOG_DIR/preflight-paper.log" 2>&1 || status=$?
cat "$LOG_DIR/preflight-paper.log"
echo "(exit status $status)"

section "4. a small study on this CPU (configs/quick.yaml + GRAIL), results owned by uid $RESULTS_UID"
results=$(mktemp -d /var/tmp/grail-check-results.XXXXXX)
chown "$RESULTS_UID:$RESULTS_UID" "$results"
chmod 2770 "$results"
grail='grail: {credit: grail, grail_mean: 1.0, grail_std: 0.5, grail_w_min: 0.5, grail_w_max: 5.0,'
grail+=' grail_leaf: embeddings, grail_symmetry: wrong}'
start=$(date +%s)
in_image --group-add "$RESULTS_UID" -v "$results:/results" -w /results "$image" \
  python -m snakemake --snakefile /opt/grail/Snakefile --directory /results --cores 2 \
  --configfile /opt/grail/configs/quick.yaml --config "methods={$grail}" >"$LOG_DIR/study.log" 2>&1 ||
  { tail -n 60 "$LOG_DIR/study.log"; exit 1; }
figure[study]="$(($(date +%s) - start)) s"
grep -E '^(rule|localrule) ' "$LOG_DIR/study.log" | sort | uniq -c
stat -c 'results directory: owner %u:%g, mode %a' "$results"
stat -c 'its report.md: owner %u:%g, mode %a' "$results/results/quick/report.md"
echo "small study: ${figure[study]} (log: $LOG_DIR/study.log)"
echo "-- head of results/quick/report.md:"
head -n 30 "$results/results/quick/report.md"
if [ "${KEEP_RESULTS:-0}" = 1 ]; then echo "kept: $results"; else rm -rf "$results"; fi

if [ "$VARIANT" = gpu ] && [ "${CHECK_TOOLKIT:-1}" = 1 ]; then
  section "5. FLASH_ATTN=source's toolkit: a small CUDA extension built against the image's torch"
  read -r -d '' extension <<'EOF' || true
from torch.utils.cpp_extension import CUDA_HOME, load_inline
kernel = r"""
#include <torch/extension.h>
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
void run(torch::Tensor x) { add_one<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel()); }
"""
module = load_inline("probe", cpp_sources="void run(torch::Tensor x);", cuda_sources=kernel, functions=["run"])
print("CUDA_HOME", CUDA_HOME, "| built", module.__file__)
EOF
  start=$(date +%s)
  # shellcheck disable=SC2086,SC2016  # RUN_OPTS is a list of flags; $0 and $PATH expand inside the image
  "$ENGINE" run --rm --user 0 -e TORCH_CUDA_ARCH_LIST=9.0 ${RUN_OPTS:-} "$image" bash -c \
    'bash /opt/grail/containers/cuda_home.sh /tmp/cuda && CUDA_HOME=/tmp/cuda PATH=/tmp/cuda/bin:$PATH python -c "$0"' \
    "$extension" >"$LOG_DIR/toolkit.log" 2>&1 || { tail -n 30 "$LOG_DIR/toolkit.log"; exit 1; }
  figure[toolkit]="$(($(date +%s) - start)) s"
  grep -E '^(Build cuda|CUDA_HOME)' "$LOG_DIR/toolkit.log"
  echo "toolkit and extension: ${figure[toolkit]} (log: $LOG_DIR/toolkit.log)"
fi

section "6. a code-only rebuild"
context=$(mktemp -d /var/tmp/grail-check-context.XXXXXX)
cp -a containers configs pipeline Snakefile pyproject.toml "$context/"
echo "# a code-only change: containers/check_image.sh's rebuild probe" >>"$context/pipeline/__init__.py"
tag=${image##*:}
start=$(date +%s)
TAG="${tag%-"$VARIANT"}-rebuild-probe" bash "$context/containers/build.sh" "$VARIANT" >"$LOG_DIR/rebuild.log" 2>&1 ||
  { tail -n 40 "$LOG_DIR/rebuild.log"; exit 1; }
figure[rebuild]="$(($(date +%s) - start)) s"
probe=$(sed -n 's/^built //p' "$LOG_DIR/rebuild.log")
# the steps that did work (RUN, COPY) and were not taken from the cache
rebuilt=$(awk '/^STEP [0-9]+\/[0-9]+: / {step = $0; next}
  /^--> / && step != "" {if ($0 !~ /Using cache/ && step ~ /: (RUN|COPY|ADD) /) print "  " step; step = ""}' \
  "$LOG_DIR/rebuild.log")
"$ENGINE" rmi "$probe" >/dev/null
rm -rf "$context"
echo "code-only rebuild: ${figure[rebuild]}; steps that ran:"
echo "${rebuilt:-  (none)}"

section "figures ($VARIANT image, $(date -u +%Y-%m-%d))"
for key in build size study toolkit rebuild; do printf '%-8s %s\n' "$key" "${figure[$key]:--}"; done
echo "logs: $LOG_DIR"
