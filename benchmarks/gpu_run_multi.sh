#!/usr/bin/env bash
# One call on the lent two-GPU machine: the multi-GPU tests, the recorded traces for tests/data, and the
# proof (one model on one GPU, by device_map, by tensor parallelism). Results go to $OUT as tarballs.
set -u
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD/src:$PWD:/tmp/site
S=/tmp/stage; rm -rf $S; mkdir -p $S/multi
pack() { tar czf "$OUT/$1.tgz" -C "$S" "$1"; }
parts=${PARTS:-tests,cpu,traces,example,proof}
{ nvidia-smi; nvidia-smi topo -m; python3 -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__, torch.backends.cudnn.version(), torch.cuda.device_count(), torch.cuda.can_device_access_peer(0, 1))"; env | grep -E "NCCL|SYMM|NVSHMEM"; } > $S/multi/machine.txt 2>&1
tail -3 $S/multi/machine.txt
if [[ $parts == *tests* ]]; then
  timeout ${TESTS_S:-200} python3 -m pytest ${TESTS:-tests/gpu} -m gpu -q -rs -p no:cacheprovider > $S/multi/gpu_multi_tests.log 2>&1; echo "multi-gpu tests rc=$?" | tee -a $S/multi/gpu_multi_tests.log; tail -5 $S/multi/gpu_multi_tests.log
fi
if [[ $parts == *cpu* ]]; then
  timeout ${CPU_S:-300} python3 -m pytest tests -q -p no:cacheprovider --ignore=tests/gpu > $S/multi/cpu_tests_on_gpu_stack.log 2>&1; echo "cpu tests rc=$?" | tee -a $S/multi/cpu_tests_on_gpu_stack.log; tail -5 $S/multi/cpu_tests_on_gpu_stack.log
fi
if [[ $parts == *traces* ]]; then
  mkdir -p $S/multi/traces
  timeout 150 python3 benchmarks/record_traces.py $S/multi/traces --multi-gpu > $S/multi/traces/log.txt 2>&1; echo "traces rc=$?"; grep recorded $S/multi/traces/log.txt
fi
if [[ $parts == *example* ]]; then
  { timeout 150 python3 examples/larger_than_one_gpu.py --device-map auto; echo "device_map example rc=$?";
    timeout 150 python3 -m torch.distributed.run --nproc-per-node 2 examples/larger_than_one_gpu.py --tp; echo "tp example rc=$?"; } 2>&1 | grep -v "Loading\|USDT\|Writing" > $S/multi/example.log; grep "example rc" $S/multi/example.log
fi
if [[ $parts == *proof* ]]; then
  timeout ${PROOF_S:-330} python3 benchmarks/multi_gpu.py $S/multi/proof --iters ${ITERS:-5} --timeout 150 2>&1 | tail -12; echo "proof rc=$?"
  rm -rf $S/multi/proof/*/traces
fi
pack multi
ls -la $OUT
