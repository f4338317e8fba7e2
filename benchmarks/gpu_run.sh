#!/usr/bin/env bash
# One call on the lent GPU: GPU tests, CPU tests on the GPU machine's (older) torch/transformers,
# the benchmark suite, compare on the default preset (prefill, decode), small traces for tests/data.
# Results go to $OUT as a few tarballs (the device tool returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD/src:$PWD:/tmp/site
S=/tmp/stage; rm -rf $S; mkdir -p $S/tests $S/bench $S/compare $S/traces
pack() { tar czf "$OUT/$1.tgz" -C "$S" "$1"; }
{ nvidia-smi; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.backends.cudnn.version())"; } > $S/tests/machine.txt 2>&1
parts=${PARTS:-tests,traces,bench,compare}
if [[ $parts == *tests* ]]; then
  timeout 240 python3 -m pytest tests/gpu -m gpu -q -rs -p no:cacheprovider > $S/tests/gpu_tests.log 2>&1; echo "gpu tests rc=$?" | tee -a $S/tests/gpu_tests.log
  timeout 200 python3 -m pytest tests -q -p no:cacheprovider --ignore=tests/gpu > $S/tests/cpu_tests_on_gpu_stack.log 2>&1; echo "cpu tests rc=$?" | tee -a $S/tests/cpu_tests_on_gpu_stack.log
  for f in $S/tests/*.log; do tail -n 3 "$f"; done; pack tests
fi
if [[ $parts == *traces* ]]; then
  timeout 120 python3 benchmarks/record_traces.py $S/traces > $S/traces/log.txt 2>&1; tail -3 $S/traces/log.txt; pack traces
fi
if [[ $parts == *bench* ]]; then
  timeout 400 python3 -m benchmarks --out $S/bench ${BENCH_ONLY:+--only $BENCH_ONLY} 2>&1 | grep -v USDT | tee $S/bench/log.txt; pack bench
fi
if [[ $parts == *compare* ]]; then
  python3 -m attnswitch env > $S/compare/env.txt 2>&1
  timeout 60 python3 -m attnswitch check --padding --seq 512 > $S/compare/check_padding.txt 2>&1
  [[ $parts == *prefill* || $parts != *decode-only* ]] && { timeout 200 python3 -m attnswitch compare --out $S/compare/prefill > $S/compare/prefill.txt 2>&1; echo "prefill rc=$?"; }
  timeout 150 python3 -m attnswitch compare --mode decode --iters 30 --out $S/compare/decode > $S/compare/decode.txt 2>&1; echo "decode rc=$?"
  grep -h "Recommendation" -A2 $S/compare/*.txt; rm -rf $S/compare/*/traces; pack compare
fi
ls -la $OUT
