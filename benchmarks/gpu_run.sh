#!/usr/bin/env bash
# Calls on the lent GPU, each under 10 minutes; results go to $OUT as tarballs (the device tool returns at
# most 8 files). PARTS picks what runs:
#   tests      GPU suite (tests/gpu, marked gpu)
#   cpu        the CPU suite on the GPU machine's (older) torch and transformers
#   compare    `attnswitch compare` on the default preset, wall time measured outside
#   bench      the benchmark suite's GPU parts (BENCH_ONLY narrows them)
#   example    examples/bring_your_own_kernel.py: a Triton kernel registered and compared on the default preset
#   workloads  generate, train, sweep and a recorded training trace (WORKLOADS narrows them)
#   ranking    the ranking against independent loops: generate compared twice, prefill, train (RANKING narrows)
#   userloop   every backend's ranked step against a user's loop, 3 shapes x prefill, decode, train (USERLOOP narrows;
#              USERLOOP_TURN: the compare's timed steps per backend per round)
#   gensweep   generate sweeps over prompt lengths of the 1B and 0.5B shapes (GENSWEEP narrows, GENSWEEP_LENS)
#   compiled   every backend compiled against uncompiled (COMPILED_MODELS, COMPILED_WORKLOADS narrow them)
#   peak       % of peak through attnswitch's profiler path against an independent CUDA-event loop
#   startup    the command's imports split, and flex's first compile (empty and warm caches)
#   calltrace  the ops per attention call and each memcpy's source, Gemma-3 decode and prefill at 8k
#   kinds      a backend per layer kind: Gemma-3-1B-shaped and encoder-decoder compares (KINDS narrows)
set -u
export PYTHONUNBUFFERED=1
# the device tool stops a call at 600 s and then brings nothing back: every part runs within what is left of
# LIMIT_S since the start (a part with under 20 s left is not started), and the run's files are packed after
# each part
T0=$(date +%s); LIMIT_S=${LIMIT_S:-570}
bound() { local left=$(( LIMIT_S - ($(date +%s) - T0) )); local b=$(( $1 < left ? $1 : left )); echo $(( b < 20 ? 0 : b )); }
run_for() {  # run_for SECONDS command...: under timeout, within what is left of the call
  local b; b=$(bound "$1"); shift
  if [ "$b" -le 0 ]; then echo "not started (too little of the call's $LIMIT_S s left): $*"; return 124; fi
  timeout "$b" "$@"
}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD/src:$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
S=/tmp/stage; rm -rf $S; mkdir -p $S/run
pack() { tar czf "$OUT/$1.tgz" -C "$S" "$1"; }
parts=${PARTS:-tests,compare}
{ nvidia-smi; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.backends.cudnn.version())"; } > $S/run/machine.txt 2>&1
if [[ $parts == *tests* ]]; then
  run_for ${TESTS_S:-240} python3 -m pytest tests/gpu -m gpu -q -rs -p no:cacheprovider > $S/run/gpu_tests.log 2>&1
  echo "gpu tests rc=$?" | tee -a $S/run/gpu_tests.log; tail -n 4 $S/run/gpu_tests.log
  pack run
fi
if [[ $parts == *cpu* ]]; then
  run_for ${CPU_S:-300} python3 -m pytest tests -q -rf -p no:cacheprovider -p no:benchmark --ignore=tests/gpu -n ${CPU_N:-6} > $S/run/cpu_tests_on_gpu_stack.log 2>&1
  echo "cpu tests rc=$?" | tee -a $S/run/cpu_tests_on_gpu_stack.log; tail -n 3 $S/run/cpu_tests_on_gpu_stack.log
  pack run
fi
# one `attnswitch compare` of the default preset, its wall time measured outside and its stderr lines stamped
# with the seconds since the start (where the time outside the report's own account goes); $1 names the run
# (VAR=value settings first, then after -- the compare's own options)
timed_compare() {
  local name=$1; shift
  local envs=() args=()
  while [ $# -gt 0 ]; do if [ "$1" = "--" ]; then shift; args=("$@"); break; fi; envs+=("$1"); shift; done
  t0=$(date +%s.%N)
  run_for ${COMPARE_S:-150} env ${envs[@]+"${envs[@]}"} ${WRAP:-} python3 -m attnswitch compare ${args[@]+"${args[@]}"} --out $S/run/compare/$name > $S/run/compare/$name.txt \
    2> >(python3 -u -c "import sys, time; t0=float(sys.argv[1])
for l in sys.stdin: print(f'{time.time()-t0:7.1f} {l}', end='', flush=True)" $t0 > $S/run/compare/$name.err)
  rc=$?; t1=$(date +%s.%N); sleep 1
  echo "compare $name rc=$rc wall_s=$(python3 -c "print(round($t1-$t0,1))") (${envs[*]:-} ${args[*]:-})" | tee -a $S/run/compare/wall.txt
  rm -rf $S/run/compare/$name/traces
  pack run
}
if [[ $parts == *compare* ]]; then
  mkdir -p $S/run/compare
  python3 -m attnswitch env > $S/run/compare/env.txt 2>&1
  python3 -c "import time; t=time.perf_counter(); import torch, transformers; print('import torch, transformers: %.1f s' % (time.perf_counter()-t))" >> $S/run/compare/env.txt
  # COMPARE_RUNS: fresh (empty compile caches, as on a new machine), decode and train (the default preset in
  # that mode, the caches fresh's left), warm (the same caches again: a user's
  # second run), threads1 (empty caches, inductor compiling in this process instead of a worker pool), pyspy (empty
  # caches, sampled by py-spy where its wheel was carried), importtime (empty caches, python's -X importtime)
  c=/tmp/compile_caches
  for run in $(echo ${COMPARE_RUNS:-fresh} | tr , ' '); do
    case $run in
      fresh) rm -rf $c; timed_compare prefill TORCHINDUCTOR_CACHE_DIR=$c/inductor TRITON_CACHE_DIR=$c/triton ;;
      decode|train) timed_compare $run TORCHINDUCTOR_CACHE_DIR=$c/inductor TRITON_CACHE_DIR=$c/triton -- --mode $run ;;
      warm) timed_compare warm TORCHINDUCTOR_CACHE_DIR=$c/inductor TRITON_CACHE_DIR=$c/triton ;;
      threads1) timed_compare threads1 TORCHINDUCTOR_CACHE_DIR=$c/t1/inductor TRITON_CACHE_DIR=$c/t1/triton \
                  TORCHINDUCTOR_COMPILE_THREADS=1 ;;
      pyspy) rm -rf $c/ps; WRAP="py-spy record --idle --format raw -r 100 -o $S/run/compare/pyspy.txt --" \
               timed_compare pyspy TORCHINDUCTOR_CACHE_DIR=$c/ps/inductor TRITON_CACHE_DIR=$c/ps/triton ;;
      importtime) rm -rf $c/it; WRAP="env PYTHONPROFILEIMPORTTIME=1" \
               timed_compare importtime TORCHINDUCTOR_CACHE_DIR=$c/it/inductor TRITON_CACHE_DIR=$c/it/triton ;;
    esac
  done
  grep -h -A3 "Recommendation" $S/run/compare/prefill.txt | head -8
fi
if [[ $parts == *example* ]]; then
  mkdir -p $S/run/example
  run_for ${EXAMPLE_S:-150} python3 examples/bring_your_own_kernel.py --out $S/run/example > $S/run/example/stdout.txt 2>&1
  echo "example rc=$?" | tee -a $S/run/example/stdout.txt; grep -E "max \||ran:" $S/run/example/stdout.txt
fi
pack run
if [[ $parts == *bench* ]]; then
  mkdir -p $S/bench
  run_for ${BENCH_S:-240} python3 -m benchmarks --out $S/bench ${BENCH_ONLY:+--only $BENCH_ONLY} 2>&1 | tee $S/bench/log.txt
  pack bench
fi
if [[ $parts == *workloads* ]]; then
  mkdir -p $S/workloads
  run_for ${WORKLOADS_S:-420} python3 -m benchmarks.workloads $S/workloads ${WORKLOADS:+--only=$WORKLOADS} 2>&1 | tee $S/workloads/log.txt
  pack workloads
fi
if [[ $parts == *ranking* ]]; then
  mkdir -p $S/ranking
  run_for ${RANKING_S:-420} python3 -m benchmarks.ranking_check $S/ranking ${RANKING:+--only=$RANKING} 2>&1 | tee $S/ranking/log.txt
  rm -f $S/ranking/*.json.gz; pack ranking
fi
if [[ $parts == *userloop* ]]; then
  mkdir -p $S/userloop
  # the check's own bound 30 s inside the call's (imports, a device call no alarm interrupts, the files written):
  # a check it cannot finish is not started
  run_for ${USERLOOP_S:-580} python3 -m benchmarks.user_loop $S/userloop ${USERLOOP:+--only=$USERLOOP} \
    --total=$(( $(bound ${USERLOOP_S:-580}) - 30 )) ${USERLOOP_TURN:+--turn=$USERLOOP_TURN} 2>&1 | tee $S/userloop/log.txt
  cp $S/userloop/user_loop_check.json $S/userloop/user_loop_run.json $OUT/ 2>/dev/null; pack userloop
fi
if [[ $parts == *calltrace* ]]; then
  mkdir -p $S/calltrace/decode $S/calltrace/prefill
  for m in decode prefill; do
    run_for ${CALLTRACE_S:-90} python3 -m benchmarks.call_trace $S/calltrace/$m --mode=$m 2>&1 | grep -v USDT | tee $S/calltrace/$m/log.txt
  done
  pack calltrace
fi
if [[ $parts == *gensweep* ]]; then
  mkdir -p $S/gensweep
  run_for ${GENSWEEP_S:-360} python3 -m benchmarks.generate_sweep $S/gensweep ${GENSWEEP:+--only=$GENSWEEP} \
    ${GENSWEEP_LENS:+--lens=$GENSWEEP_LENS} 2>&1 | tee $S/gensweep/log.txt
  pack gensweep
fi
if [[ $parts == *compiled* ]]; then
  mkdir -p $S/compiled
  run_for ${COMPILED_S:-420} python3 benchmarks/compiled.py $S/compiled ${COMPILED_MODELS:+--models=$COMPILED_MODELS} \
    ${COMPILED_WORKLOADS:+--workloads=$COMPILED_WORKLOADS} 2>&1 | tee $S/compiled/log.txt
  pack compiled
fi
if [[ $parts == *peak* ]]; then
  mkdir -p $S/peak
  run_for ${PEAK_S:-180} python3 -m benchmarks.peak_check $S/peak 2>&1 | tee $S/peak/log.txt
  pack peak
fi
if [[ $parts == *startup* ]]; then
  mkdir -p $S/startup
  run_for ${STARTUP_S:-240} python3 benchmarks/startup.py --json $S/startup/startup_h200.json 2>&1 | tee $S/startup/log.txt
  pack startup
fi
if [[ $parts == *kinds* ]]; then
  mkdir -p $S/kinds
  run_for ${KINDS_S:-540} python3 -m benchmarks.layer_kinds $S/kinds ${KINDS:+--only=$KINDS} 2>&1 | tee $S/kinds/log.txt
  pack kinds
fi
ls -la $OUT
