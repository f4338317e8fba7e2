import os

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    BloomConfig,
    BloomForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

# Tiny models gain nothing from a second intra-op thread, and on a shared machine each parallel op waits at
# its barrier until the scheduler runs both threads: a step of the tiny Llama took 0.1-1.4 s with two
# threads beside other load, 30-60 ms with one. One thread here, and in the commands the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

VOCAB = 211


def saved_gqa_llama(folder) -> str:
    """A 4-layer Llama in bf16 with 8 query and 4 key-value heads, saved to ``folder`` (loaded with
    ``from_pretrained``: device maps and tensor parallelism split it as a checkpoint). With 4 k/v heads each
    of two tensor-parallel ranks keeps GQA (4 / 2), so its attention calls need the whole model's layout
    work."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)


def tiny(kind: str, **over):
    """Tiny random-weight models of real architectures, built from their configs."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB)
    if kind == "llama":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                          num_key_value_heads=2, **common)
        cls = LlamaForCausalLM
    elif kind == "mistral":
        cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, sliding_window=5, **common)
        cls = MistralForCausalLM
    elif kind == "qwen2":
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4, **common)
        cls = Qwen2ForCausalLM
    elif kind == "gpt2":
        cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, **common)
        cls = GPT2LMHeadModel
    elif kind == "bert":
        cfg = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=64, **common)
        cls = BertModel
    elif kind == "t5":
        cfg = T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **common)
        cls = T5ForConditionalGeneration
    elif kind == "gemma2":
        cfg = Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, sliding_window=4, attn_logit_softcapping=5.0,
                           **common)
        cls = Gemma2ForCausalLM
    elif kind == "bloom":  # computes attention in its own code (ALiBi), off transformers' attention interface
        cfg = BloomConfig(hidden_size=64, n_layer=1, n_head=4, **common)
        cls = BloomForCausalLM
    else:
        raise KeyError(kind)
    for k, v in over.items():
        setattr(cfg, k, v)
    return cls(cfg).eval()


def batch_for(model, batch=3, seq=12, pad=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if pad:
        encoder = model.config.model_type in ("bert", "t5")
        for i in range(1, batch):
            if encoder:
                mask[i, seq - 2 * i:] = 0  # right padding
            else:
                mask[i, : 2 * i] = 0  # left padding
    out = {"input_ids": ids, "attention_mask": mask}
    if model.config.is_encoder_decoder:
        out["decoder_input_ids"] = torch.randint(0, VOCAB, (batch, seq - 3), generator=g)
    return out


def output_of(out):
    return out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state


def valid_positions(model, batch):
    if model.config.is_encoder_decoder:
        return torch.ones_like(batch["decoder_input_ids"], dtype=torch.bool)
    return batch["attention_mask"].bool()


def eager_reference(model, batch):
    """The model's own transformers eager attention, independent of attnswitch."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return output_of(model(**batch))
    finally:
        model.set_attn_implementation(before)


def eager_greedy(model, batch, new_tokens):
    """Greedy tokens, exactly ``new_tokens`` more, under the model's own eager attention."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return model.generate(**batch, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    finally:
        model.set_attn_implementation(before)


def assert_first_token_agrees(out, ref, batch):
    """Half-precision backends may round differently later on; the prompt and the first greedy token
    must agree with the reference's."""
    n = batch["input_ids"].shape[1] + 1
    assert out.shape == ref.shape and torch.equal(out[:, :n], ref[:, :n]), (out, ref)


def to_cuda(batch):
    return {k: v.cuda() for k, v in batch.items()}


def gpu_events(fn):
    """The profiler's events of ``fn`` on the GPU (CPU and CUDA activity), the device idle before and after.
    The process may tear CUPTI down after a trace (attnswitch sets TEARDOWN_CUPTI=1): the detach is waited for
    after it, so that it never lands inside the next trace (pytorch/kineto#1554); a trace with no GPU activity
    fails here, never as a wrong count."""
    from attnswitch.profiling import cupti

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
        threads = cupti.tasks()
    cupti.settle(threads)
    events = prof.events()
    assert any(e.device_type == torch.autograd.DeviceType.CUDA for e in events), "the trace holds no GPU activity"
    return events


def op_names(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def sdpa_flags():
    """PyTorch's process-wide SDPA backend flags."""
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())


def configs(model):
    from attnswitch.hf import configs_of
    return {id(c): c._attn_implementation_internal for c in configs_of(model)}


def world(model=None):
    """Everything a switch may touch: transformers' registries and PreTrainedModel.__call__, leases,
    patches, this context's selection, PyTorch's SDPA flags, and the model's configs and attributes."""
    from attnswitch import hf
    out = {**hf.world(), "flags": sdpa_flags()}
    if model is not None:
        out["configs"] = configs(model)
        out["model attributes"] = sorted(vars(model))
    return out


class Spy:
    """Records (thread, backend, call site) of every attention call a switch runs: those through
    ``run_backend`` (the general path, their backends also in ``general``) and the common calls a forward
    takes straight to a backend's op (also in ``common``)."""

    def __init__(self):
        import threading
        self.calls, self._lock, self._threading = [], threading.Lock(), threading
        self.common, self.general = [], []

    def _record(self, name, where, path):
        from attnswitch.sites import site_name
        with self._lock:
            self.calls.append((self._threading.get_ident(), name, site_name(where)))
            path.append(name)

    def __call__(self, orig):
        def record(name, call):
            self._record(name, call.where, self.general)
            return orig(name, call)
        return record

    def common_op(self, name, op):
        import sys

        def record(*args):  # (q, k, v, dropout, causal, scale, gqa)
            out = op(*args)
            if out is not None:  # (None: refused, and the call goes on to run_backend)
                self._record(name, sys._getframe(1).f_locals["module"], self.common)  # attention_forward's
            return out
        return record

    @property
    def names(self):
        return [n for _, n, _ in self.calls]


def spy_on(monkeypatch, common: bool = True) -> Spy:
    """A ``Spy`` on every switched attention call; ``common=False``: no common op, every call takes the
    general path."""
    from attnswitch.hf import dispatch
    s = Spy()
    monkeypatch.setattr(dispatch, "run_backend", s(dispatch.run_backend))
    monkeypatch.setattr(dispatch, "COMMON_OPS", {n: s.common_op(n, op) for n, op in dispatch.COMMON_OPS.items()}
                        if common else {})
    return s


@pytest.fixture
def spy(monkeypatch):
    return spy_on(monkeypatch)


@pytest.fixture(scope="session")
def cpu_report():
    """A compare report made here, on the CPU: three backends ran, cudnn refused (CUDA only)."""
    import attnswitch
    from attnswitch.models import load_model
    from attnswitch.workload import make_workload

    m, _ = load_model("tiny-llama", layers=2)
    w = make_workload(m, batch=2, seq=32, padding=True)
    return attnswitch.compare(m, w, backends=["naive", "math", "flash", "cudnn"], warmup=1, iters=3, rounds=1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _clocked_modules():
    """The modules whose ``time.perf_counter`` times a measurement: steps, forwards and attention calls
    (capture, clock, instrument) and the time accounts (profiling, comparison, cli)."""
    import attnswitch.profiling as profiling
    from attnswitch import cli, comparison, instrument
    from attnswitch.profiling import capture, clock

    return (capture, clock, instrument, profiling, comparison, cli)


class VirtualClock:
    """The host clock a measurement reads, moved on by hand: ``sleep(s)`` adds ``s`` seconds to what
    ``perf_counter`` reads in the measuring modules, at once. A backend that "sleeps" on it costs a known
    time however busy the machine is; the real time the rest takes is still counted, and is small beside
    delays of seconds."""

    def __init__(self):
        import time

        self._real = time.perf_counter
        self.offset = 0.0

    def perf_counter(self) -> float:
        return self._real() + self.offset

    def sleep(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def vclock(monkeypatch):
    """A ``VirtualClock`` read by every clock of a measurement: the host timers of steps, forwards and
    attention calls (capture, clock, instrument) and the time accounts (profiling, comparison, cli)."""
    from types import SimpleNamespace

    c = VirtualClock()
    fake = SimpleNamespace(perf_counter=c.perf_counter)
    for module in _clocked_modules():
        assert module.time.perf_counter  # each reads the clock as time.perf_counter
        monkeypatch.setattr(module, "time", fake)
    return c


def use_cpu_clock(monkeypatch):
    """The CPU time of the calling thread (``time.thread_time``) as the clock every measurement reads;
    returns that clock, for the test's own readings. Unlike the wall clock, it does not run on while
    other processes have the CPU, so a figure checked against an outside reading of it holds on a busy
    machine: the spans nest as on the wall clock, and what they hold is work, not waiting. (The tests
    run torch with one thread: all the work of a step is this thread's.)"""
    import time
    from types import SimpleNamespace

    fake = SimpleNamespace(perf_counter=time.thread_time)
    for module in _clocked_modules():
        assert module.time.perf_counter  # each reads the clock as time.perf_counter
        monkeypatch.setattr(module, "time", fake)
    return time.thread_time


@pytest.fixture
def cpu_clock(monkeypatch):
    """``use_cpu_clock`` for one test."""
    return use_cpu_clock(monkeypatch)


class FakeClock:
    """A clock that moves only when a test says (``advance``): attnswitch's timing code reads it instead
    of the wall clock, so that every time it reports is exactly the time the test injected."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1e3


@pytest.fixture
def fake_clock(monkeypatch):
    """A ``FakeClock`` as the ``time`` of every module that times steps, forwards and attention calls."""
    import types

    from attnswitch import instrument
    from attnswitch.profiling import capture, clock

    c = FakeClock()
    fake = types.SimpleNamespace(perf_counter=c.perf_counter)
    for module in (capture, clock, instrument):
        monkeypatch.setattr(module, "time", fake)
    return c


@pytest.fixture
def timed_kernel(fake_clock):
    """``add(name, ms(q, k))``: a backend (SDPA's math underneath) that takes ``ms(q, k)`` fake milliseconds
    per call; unregistered after the test."""
    import attnswitch

    names = []

    def add(name, ms):
        def kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            fake_clock.advance(ms(q, k))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                                    scale=scale, enable_gqa=enable_gqa)
        names.append(attnswitch.register_backend(name, kernel, gqa=True))
        return name
    yield add
    for n in names:
        attnswitch.unregister_backend(n)
