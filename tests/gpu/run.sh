#!/usr/bin/env bash
# The whole GPU run in one command, on a host with an NVIDIA GPU (see docs/gpu.md):
#   tests/gpu/run.sh OUT_DIR
# 1. installs carried wheels (WHEELS, default .whl/) into /tmp/site (no network needed);
# 2. imports the carried exllamav3 extension build (EXT_DIR, default .gpu/ext/: exllamav3_ext.so, or
#    exllamav3_ext.so.xz) or builds it (~300 s) and leaves a fresh build in OUT_DIR xz-packed in
#    parts under 16 MiB (ext.so.xz.part-aa …; a call that reused an earlier build leaves none);
# 3. writes the decisive tiny GLM-5.3-Flash fixture and converts it to EXL3;
# 4. runs tests/gpu and the benchmark; logs and results land in OUT_DIR.
# STEPS (default "tests bench bench-large") picks what step 4 runs, PYTEST_K narrows the tests
# (a -k expression: "tp2 or video"), PYTEST_ARGS adds pytest options; MODEL_DIR reuses a
# converted model, BENCH_ARGS adds benchmark options ("--levels 8,16 --rounds 2"); each step has
# its own time limit. bench-large writes the ~2.1B bench-size
# fixture on the GPU and benchmarks it unconverted (bf16); bench-large2 runs the same benchmark a
# second time (two runs that must agree); profile profiles the bench-size fixture
# (tests/bench/exllamav3_profile.py: GPU-busy share, py-spy of the server; PROFILE_ARGS); ab runs
# tests/bench/exllamav3_ab.py on it (AB_ARGS), cli-bench runs `sparkfold bench` against the engine
# server on it (tests/bench/exllamav3_cli_bench.py; CLI_BENCH_ARGS). bench-q, bench-q2 and profile-q
# do the same on its EXL3 conversion (4 bits, bounded by CONVERT_TIMEOUT; LARGE_SIZE=mid picks a
# ~0.55B fixture that converts faster). long sends ~1M-token requests through the gateway
# (tests/bench/long_window.py; LONG_TIMEOUT, LONG_ARGS); cli-bench-window runs `sparkfold bench
# --suite prefill,reuse` against the engine server on the tiny fixture with the 1,048,576-token
# window (prefill lengths doubling to the window, the 64k re-send); fairness starts the engine on the
# bench-size fixture with empty compile caches and again (the restart figure), then runs `sparkfold
# bench --suite fairness` (tests/bench/exllamav3_fairness.py; FAIRNESS_TIMEOUT, FAIRNESS_ARGS:
# "--chunks 2048,2048/512 --repeats 2 --tokens 128k"); pages times a job start's page allocation with
# exllamav3's eviction order and with free pages first (tests/bench/exllamav3_pages_bench.py;
# PAGES_ARGS, no GPU needed, exllamav3 only). STEPS=none only installs and
# imports (on a fresh machine: builds) the extension. EXPECT_SOURCE (a commit, as `git describe
# --always --dirty --abbrev=12` prints it) refuses a tree that is not that commit: a copy without git
# names its source in a .source file (tests/gpu/README.md), a checkout asks git.
set -uo pipefail
OUT=${1:?usage: tests/gpu/run.sh OUT_DIR}
WHEELS=${WHEELS:-.whl}
EXT_DIR=${EXT_DIR:-.gpu/ext}
STEPS=${STEPS:-tests bench bench-large}
WORK=${WORK:-/tmp/sparkfold-gpu}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export TORCH_EXTENSIONS_DIR=$WORK/torch_extensions
log() { echo "== $(date +%T) $*" | tee -a "$OUT/run.log"; }

source_id=$(cat .source 2>/dev/null || git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
log "source: $source_id"
if [ -n "${EXPECT_SOURCE:-}" ] && [ "$source_id" != "$EXPECT_SOURCE" ]; then
  log "this tree is $source_id, not EXPECT_SOURCE=$EXPECT_SOURCE: copy the checkout again (tests/gpu/README.md)"
  exit 2
fi

log "device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tr '\n' ' ')"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  log "installing carried wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl >>"$OUT/run.log" 2>&1 || { log "wheel install failed"; exit 1; }
fi
export PYTHONPATH=$PWD/runtime:$PWD:/tmp/site PATH=/tmp/site/bin:$PATH  # carried tools (py-spy)
if [ ! -f "$EXT_DIR/exllamav3_ext.so" ] && [ -f "$EXT_DIR/exllamav3_ext.so.xz" ]; then  # carried packed
  log "unpacking the carried extension build $EXT_DIR/exllamav3_ext.so.xz"
  mkdir -p "$WORK/ext" && python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$EXT_DIR/exllamav3_ext.so.xz" "$WORK/ext/exllamav3_ext.so" && EXT_DIR=$WORK/ext
fi
for prior in "$WORK/ext" "$TORCH_EXTENSIONS_DIR/exllamav3_ext"; do
  if [ ! -f "$EXT_DIR/exllamav3_ext.so" ] && [ -f "$prior/exllamav3_ext.so" ]; then
    # a warm machine's earlier call (a carried build it unpacked, or its own build): torch's JIT
    # would rebuild it (the reinstalled sources are newer than the build)
    log "reusing this machine's earlier build $prior" && EXT_DIR=$prior
  fi
done
if [ -f "$EXT_DIR/exllamav3_ext.so" ]; then
  log "using the carried extension build $EXT_DIR"
  export PYTHONPATH=$PYTHONPATH:$(cd "$EXT_DIR" && pwd)
fi
log "importing exllamav3 (builds its extension unless carried)"
# a build cut by an earlier call's limit leaves torch's lock behind, and a build waits for that lock
# to go without end (FileBaton in torch/utils/cpp_extension.py's _jit_compile): one run at a time
rm -f "$TORCH_EXTENSIONS_DIR/exllamav3_ext/lock"
touch "$WORK/.import-start"
if ! timeout 900 python3 -c "import exllamav3, exllamav3.ext as e; print(exllamav3.__file__, e.exllamav3_ext.__file__)" \
    >>"$OUT/ext.log" 2>&1; then
  log "exllamav3 import failed (ext.log)"; tail -30 "$OUT/ext.log"; exit 1
fi
tail -1 "$OUT/ext.log" | tee -a "$OUT/run.log"
built=$(ls "$TORCH_EXTENSIONS_DIR"/exllamav3_ext/exllamav3_ext.so 2>/dev/null || true)
if [ -n "$built" ] && [ "$built" -nt "$WORK/.import-start" ]; then  # built by this call (a warm one reuses it)
  log "packing the fresh build into $OUT (join: cat ext.so.xz.part-* > exllamav3_ext.so.xz)"
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb'))" \
    "$built" "$WORK/ext.so.xz" && split -b 15M "$WORK/ext.so.xz" "$OUT/ext.so.xz.part-"
  sha256sum "$built" | tee "$OUT/ext.so.sha256"
fi

MODEL=${MODEL_DIR:-$WORK/tiny-glm-exl3}  # MODEL_DIR: a carried conversion (skips ~110 s)
needs_tiny=0
for step in $STEPS; do case $step in tests|bench|long|cli-bench-window) needs_tiny=1 ;; esac; done
if [ "$needs_tiny" = 1 ] && [ ! -f "$MODEL/config.json" ]; then
  log "writing and converting the decisive tiny GLM-5.3-Flash"
  python3 -m sparkfold.testing.tiny_glm "$WORK/tiny-glm" --decisive >>"$OUT/convert.log" 2>&1 &&
  timeout 400 python3 -m exllamav3.conversion.convert_model -i "$WORK/tiny-glm" -o "$MODEL" \
    -w "$WORK/convert-work" -b 4 -cr 8 -cc 256 >>"$OUT/convert.log" 2>&1 ||
    { log "conversion failed (convert.log)"; tail -30 "$OUT/convert.log"; exit 1; }
fi
export SPARKFOLD_EXL3_MODEL=$MODEL SPARKFOLD_GPU_OUT=$OUT
rc=0
for step in $STEPS; do
  case $step in
    tests)
      log "tests/gpu"
      timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -p no:cacheprovider -q --timeout 300 tests/gpu ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} \
        2>&1 | tee "$OUT/pytest.log" | tail -40 || rc=1 ;;
    bench)
      log "benchmark"
      timeout "${BENCH_TIMEOUT:-240}" python3 tests/bench/exllamav3_bench.py "$MODEL" --json "$OUT/bench.json" ${BENCH_ARGS:-} \
        2>&1 | tee "$OUT/bench.log" | tail -20 || rc=1 ;;
    long)
      log "the long window through the gateway (tests/bench/long_window.py)"
      timeout "${LONG_TIMEOUT:-420}" python3 tests/bench/long_window.py "$MODEL" "$OUT/long.json" \
        --budget-s $(( ${LONG_TIMEOUT:-420} - 30 )) ${LONG_ARGS:-} 2>&1 | tee "$OUT/long.log" | tail -30 || rc=1 ;;
    cli-bench-window)
      log "sparkfold bench --suite prefill,reuse to the 1,048,576-token window (tiny fixture)"
      timeout "${CLI_BENCH_TIMEOUT:-300}" python3 tests/bench/exllamav3_cli_bench.py "$MODEL" "$OUT/cli-bench-window" \
        --context 1048576 -- --suite prefill,reuse --label "exllamav3 server, 1M window" \
        2>&1 | tee "$OUT/cli-bench-window.log" | tail -30 || rc=1 ;;
    bench-large|bench-large2|profile|ab|cli-bench|fairness|bench-q|bench-q2|profile-q)
      LARGE=$WORK/bench-glm${LARGE_SIZE:+-$LARGE_SIZE}
      if [ ! -f "$LARGE/config.json" ]; then
        log "writing the ${LARGE_SIZE:-bench}-size fixture (bf16, on the GPU)"
        timeout 200 python3 -m sparkfold.testing.tiny_glm "$LARGE" --size "${LARGE_SIZE:-bench}" >>"$OUT/bench-large.log" 2>&1 ||
          { log "writing it failed (bench-large.log)"; rc=1; continue; }
      fi
      case $step in *-q|*-q2)  # its EXL3 conversion: the quantized path real checkpoints take
        if [ ! -f "$LARGE-exl3/.converted" ]; then
          resume=(); [ -f "$LARGE-work/args.json" ] && resume=(-r)  # an earlier call's cut conversion
          log "converting it to EXL3, 4 bits (bounded by CONVERT_TIMEOUT${resume:+; resuming from $LARGE-work})"
          if timeout "${CONVERT_TIMEOUT:-240}" python3 -m exllamav3.conversion.convert_model -i "$LARGE" \
              -o "$LARGE-exl3" -w "$LARGE-work" -b 4 -cr 8 -cc 256 "${resume[@]}" >>"$OUT/bench-convert.log" 2>&1; then
            touch "$LARGE-exl3/.converted"; log "converted"
          else
            log "conversion failed or timed out (bench-convert.log)"; tail -5 "$OUT/bench-convert.log"; rc=1; continue
          fi
        fi
        LARGE=$LARGE-exl3 ;;
      esac
      if [ "$step" = ab ]; then
        log "A/B of exllamav3's own loop, bench-size fixture"
        timeout "${AB_TIMEOUT:-240}" python3 tests/bench/exllamav3_ab.py "$LARGE" --json "$OUT/ab.json" \
          ${AB_ARGS:-} 2>&1 | tee "$OUT/ab.log" | tail -20 || rc=1
        continue
      fi
      if [ "$step" = fairness ]; then
        log "the engine's restart and fairness, bench-size fixture (tests/bench/exllamav3_fairness.py)"
        timeout "${FAIRNESS_TIMEOUT:-560}" python3 tests/bench/exllamav3_fairness.py "$LARGE" "$OUT/fairness" \
          --budget-s $(( ${FAIRNESS_TIMEOUT:-560} - 20 )) ${FAIRNESS_ARGS:-} 2>&1 | tee "$OUT/fairness.log" | tail -40 || rc=1
        continue
      fi
      if [ "$step" = cli-bench ]; then
        log "sparkfold bench against the engine server, bench-size fixture"
        timeout "${CLI_BENCH_TIMEOUT:-300}" python3 tests/bench/exllamav3_cli_bench.py "$LARGE" "$OUT/cli-bench" \
          ${CLI_BENCH_ARGS:-} 2>&1 | tee "$OUT/cli-bench.log" | tail -30 || rc=1
        continue
      fi
      if [ "$step" = profile ] || [ "$step" = profile-q ]; then
        log "profile, bench-size fixture"
        timeout "${PROFILE_TIMEOUT:-300}" python3 tests/bench/exllamav3_profile.py "$LARGE" "$OUT/$step" \
          ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/$step.log" | tail -30 || rc=1
        continue
      fi
      log "benchmark ($step), bench-size fixture"
      rounds=$(grep -o -- '--rounds [0-9]*' <<<"${BENCH_ARGS:-}" | grep -o '[0-9]*$' || true)
      # 4 rounds of four levels took 229 s on an H100: a default that grows with --rounds
      timeout "${BENCH_LARGE_TIMEOUT:-$(( 300 * ${rounds:-4} / 4 ))}" python3 tests/bench/exllamav3_bench.py "$LARGE" \
        --json "$OUT/$step.json" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/$step.log" | tail -20 || rc=1 ;;
    pages)
      log "a job start's page allocation, exllamav3's order against free pages first (tests/bench/exllamav3_pages_bench.py)"
      timeout "${PAGES_TIMEOUT:-120}" python3 tests/bench/exllamav3_pages_bench.py --json "$OUT/pages-bench.json" \
        ${PAGES_ARGS:-} 2>&1 | tee "$OUT/pages-bench.log" | tail -20 || rc=1 ;;
    none) ;;
    *) log "unknown step $step (tests bench long bench-large bench-large2 bench-q bench-q2 profile profile-q ab cli-bench cli-bench-window fairness pages none)"; rc=1 ;;
  esac
done
log "done rc=$rc"
exit $rc
