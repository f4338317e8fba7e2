"""A backend per layer kind, measured: does running each kind of layer with its own fastest backend beat the best
single backend for the whole model?

    python -m benchmarks.layer_kinds OUT                    # a GPU: every check below (bf16)
    python -m benchmarks.layer_kinds OUT --only=gemma3-prefill,whisper
    python -m benchmarks.layer_kinds OUT --smoke            # a CPU: tiny models, the same logic, no verdict

The checks (``CHECKS``): a Gemma-3-1B-shaped model (26 layers, five sliding-window layers to one full, window 512, 4
query heads and 1 key-value head of 256, random weights) compared for prefill at 8192 tokens and for a generate of
16 new tokens after an 8192-token prompt (math and numerics left out); a Whisper-small-shaped encoder-decoder (12 +
12 layers, d_model 768, 30 s of audio, 128 decoder tokens) and a T5-base-shaped one (12 + 12 layers, 1024 encoder
and 128 decoder tokens) for prefill. Each is ``attnswitch.compare`` with its defaults (numerics checked), which adds
the candidate of each kind's fastest backend and measures it in the same rounds as every other.

Writes per check ``OUT/<check>/report.json`` and ``report.md``, and ``OUT/layer_kinds.json``: per check the
attention time per kind of every backend (µs per step), the per-kind candidate, its margin against the best
single backend (the median of the per-round ratios and its 95 % interval), the pick, and the environment.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import attnswitch
from attnswitch import candidate
from attnswitch.env import environment
from attnswitch.stats import paired_margin
from attnswitch.workload import make_workload

from .user_loop import OverTime, bounded, folder_main

__all__ = ["Check", "CHECKS", "TOTAL_S", "run", "summary", "main"]

GPU_BACKENDS = ["flash", "cudnn", "efficient", "flex", "auto", "math"]
CPU_BACKENDS = ["naive", "flash", "math"]


@dataclass(frozen=True)
class Check:
    """``options``: the compare's, besides its defaults; ``skip``: backends left out of it."""

    name: str
    model: str  # gemma3, whisper, t5
    mode: str  # prefill, generate
    bound_s: float
    options: tuple[tuple[str, object], ...] = ()
    skip: tuple[str, ...] = ()


# the generate: math left out (a third of a second per 8192-token prefill, every round) and numerics too (the
# prefill's check runs them at this length); it ran past 170 s on an H200 twice, with and without them (flex
# compiles its prefill and its decode calls, each of both kinds of layer). The prefill's check took 60 s, the
# encoder-decoders' 22 and 17 s.
CHECKS = (Check("gemma3-prefill", "gemma3", "prefill", 120.0),
          Check("gemma3-generate", "gemma3", "generate", 280.0, (("check_numerics", False), ("time_budget_s", 30.0)),
                ("math",)),
          Check("whisper", "whisper", "prefill", 60.0), Check("t5", "t5", "prefill", 60.0))
#: the whole run's time bound (s): a check that would not end within it is not started (``gpu_run.sh`` gives the
#: run 540 s)
TOTAL_S = 530.0


def _model(kind: str, tiny: bool) -> torch.nn.Module:
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        T5Config,
        T5ForConditionalGeneration,
        WhisperConfig,
        WhisperForConditionalGeneration,
    )

    torch.manual_seed(0)
    if kind == "gemma3":
        size = dict(vocab_size=211, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, sliding_window=8) if tiny else \
            dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512)
        return Gemma3ForCausalLM(Gemma3TextConfig(max_position_embeddings=32768, **size))
    if kind == "whisper":
        size = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                    decoder_attention_heads=4, num_mel_bins=16, max_source_positions=16) if tiny else \
            dict(d_model=768, encoder_layers=12, decoder_layers=12, encoder_attention_heads=12,
                 decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, num_mel_bins=80,
                 max_source_positions=1500)
        return WhisperForConditionalGeneration(WhisperConfig(
            vocab_size=211 if tiny else 51865, max_target_positions=448, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1, **size))
    size = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4) if tiny else \
        dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12)
    return T5ForConditionalGeneration(T5Config(vocab_size=211 if tiny else 32128, **size))


def _inputs(check: Check, model, tiny: bool, device: str, dtype):
    """A workload (the decoder-only model's) or a batch (an encoder-decoder's encoder and decoder inputs)."""
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    if check.model == "gemma3":
        seq = 16 if tiny else 8192
        if check.mode == "generate":
            return make_workload(model, batch=1, seq=seq, mode="generate", new_tokens=4 if tiny else 16,
                                 prompt_lens=(seq,))
        return make_workload(model, batch=1, seq=seq, mode="prefill")
    batch, dec = (2, 8) if tiny else (4, 128)
    out = {"decoder_input_ids": torch.randint(3, vocab, (batch, dec), generator=g)}
    if check.model == "whisper":
        frames = 2 * model.config.max_source_positions
        out["input_features"] = torch.randn(batch, model.config.num_mel_bins, frames, generator=g).to(dtype)
    else:
        out["input_ids"] = torch.randint(3, vocab, (batch, 16 if tiny else 1024), generator=g)
    return {k: v.to(device) for k, v in out.items()}


def summary(report) -> dict:
    """What a check shows: each backend's attention time per kind, the per-kind candidate and its margin against
    the best single backend (the first in the ranking that is neither per kind nor eager)."""
    ranked = [b for n in report.ranking for b in report.backends if b.backend == n]
    # the candidate of each kind's fastest backend: the per-kind one naming the most kinds (a probe of a backend
    # refused at one kind names the others only), the fastest of those
    kinds = [b for b in ranked if candidate.parse(b.backend).kinds is not None]
    most = max((len(candidate.parse(b.backend).kinds.kinds) for b in kinds), default=0)
    per_kind = next((b for b in kinds if len(candidate.parse(b.backend).kinds.kinds) == most), None)
    # the best single backend: one backend for every call (not a policy per phase, not per kind, not eager)
    single = next((b for b in ranked if len(candidate.parse(b.backend).backends) == 1
                   and candidate.parse(b.backend).kinds is None and b.backend != "eager"), None)
    margin = None
    if per_kind is not None and single is not None:
        m = paired_margin(per_kind.time_rounds_ms, single.time_rounds_ms, single.backend)
        margin = None if m is None else {"ratio": round(m.ratio, 4), "low": round(m.low, 4), "high": round(m.high, 4),
                                         "decided": m.decided, "text": m.text()}
    return {
        "pick": report.pick, "answer": report.recommendation.splitlines()[0],
        "attn_us_by_kind": {b.backend: dict(b.attn_by_kind) for b in report.backends if b.ok and b.attn_by_kind},
        "time_ms": {b.backend: round(b.time_ms, 4) for b in report.backends if b.ok and b.time_ms is not None},
        "per_kind": per_kind.backend if per_kind else None, "best_single": single.backend if single else None,
        "per_kind_vs_best_single": margin,
        "left_out": {b.backend: b.reasons[:1] for b in report.backends if not b.ok},
    }


def run(out: Path, smoke: bool = False, only: str | None = None, total_s: float = TOTAL_S) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not smoke
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    backends = GPU_BACKENDS if cuda else CPU_BACKENDS
    todo = [c for c in CHECKS if not only or c.name in only.split(",")]
    # each check's own backends in its record (a check may leave some out: ``Check.skip``)
    done = {"environment": environment(), "smoke": smoke, "backends": backends, "checks": {}}
    t_start = time.perf_counter()
    for c in todo:
        t0, left = time.perf_counter(), total_s - (time.perf_counter() - t_start)
        if left < c.bound_s:
            done["checks"][c.name] = {"status": "not run", "why": f"{left:.0f} s of the run's bound left"}
            (out / "layer_kinds.json").write_text(json.dumps(done, indent=1, default=str))
            continue
        def said(line: str, t0=t0, name=c.name) -> None:  # where a check's time goes, should it run past its bound
            print(f"  {time.perf_counter() - t0:6.1f} s {name}: {line}", flush=True)

        compared = [b for b in backends if b not in c.skip]
        try:
            with bounded(c.bound_s):
                model = _model(c.model, smoke).to(device, dtype).eval()
                report = attnswitch.compare(model, _inputs(c, model, smoke, device, dtype),
                                            backends=compared, progress=said,
                                            model_name=f"{c.model}-shaped ({c.name})", **dict(c.options),
                                            **({"warmup": 0, "iters": 2, "rounds": 2} if smoke else {}))
            folder = out / c.name
            folder.mkdir(exist_ok=True)
            report.to_json(folder / "report.json")
            report.to_markdown(folder / "report.md")
            done["checks"][c.name] = {"status": "ok", "backends": compared, **summary(report)}
        except (OverTime, Exception) as e:
            done["checks"][c.name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        finally:
            model = None
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        got = done["checks"][c.name]
        got["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{c.name}: {got['status']} in {got['seconds']} s; per kind {got.get('per_kind')} vs "
              f"{got.get('best_single')}: {(got.get('per_kind_vs_best_single') or {}).get('text')}; "
              f"pick {got.get('pick')}", flush=True)
        (out / "layer_kinds.json").write_text(json.dumps(done, indent=1, default=str))
    return 0 if all(c["status"] == "ok" for c in done["checks"].values()) else 1


def main(argv=None) -> int:
    return folder_main(argv, __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
