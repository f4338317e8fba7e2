"""The answer in a form to ship: how to run the pick in a serving process, what the measurement ran with,
and when to measure again (``deploy_info``, a report's ``deploy``); the policy file ``--out`` writes
(``policy.json``), and ``load_policy``, which applies the selection that was measured (a compiled pick's
``torch.compile`` mode is ``MeasuredPolicy.compile``: the compile is the caller's, as the Deploy snippet shows).

Pure over a report's fields, but for ``load_policy``, which reads a file and the running process's
versions.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import candidate, catalog
from ._own_env import SET_BY_TORCH
from ._versions import version_text
from .compiling import MODES
from .kinds import Kind, kind_of
from .modelshape import differences, dtype_of, malformed
from .results import Deploy

__all__ = ["deploy_info", "policy_document", "write_policy", "load_policy", "MeasuredPolicy", "POLICY_SCHEMA"]

POLICY_SCHEMA = 1
#: the versions a measurement holds for (another one: measure again)
_VERSIONS = ("gpu", "torch", "cuda", "cudnn", "transformers")


#: a generate's decode steps compiled and its prefill eager, as a compiled generate candidate is measured
_DECODE_ONLY = """eager, compiled = model.forward, torch.compile(model.forward{arg})


def forward(*args, **kwargs):  # decode steps (one query token) compiled, the prefill eager: as measured
    keys = ("decoder_input_ids", "input_ids", "decoder_inputs_embeds", "inputs_embeds")  # (a decoder's first)
    x = next((kwargs[k] for k in keys if kwargs.get(k) is not None), args[0] if args else None)
    return (compiled if x is not None and x.shape[1] == 1 else eager)(*args, **kwargs)


model.forward = forward  # generate(..., disable_compile=True): this compile in place of transformers' own"""


def _attnswitch_snippet(sel, mode: str | None, kind: Kind, static: bool = False) -> str:
    """Runs as it is with ``model`` in scope: the switch, then (a compiled pick) the compile as measured."""
    imports, lines = ["import attnswitch"], [
        f"attnswitch.patch(model, {sel!r})  # every thread, until attnswitch.unpatch(model)",
        "# or exactly what was measured, with a warning where the versions or the model differ:",
        "# attnswitch.load_policy(\"policy.json\").apply(model)"]
    if mode is not None:
        imports.append("import torch")
        arg = "" if mode == "default" else f", mode={mode!r}"
        lines.append(_DECODE_ONLY.format(arg=arg) if kind.name == "generate" else
                     f"model.forward = torch.compile(model.forward{arg})  # compiled, as measured")
    if static:
        lines.append(f"# then, as measured: {_STATIC_CALL}")
    return "\n".join(imports) + "\n\n" + "\n".join(lines)


#: a generate measured with a static KV cache, as it is run: transformers compiles a static cache's decode steps
#: on a GPU unless told not to, and the measurement tells it not to (a compiled pick compiles its own way)
_STATIC_CALL = "model.generate(**inputs, cache_implementation=\"static\", disable_compile=True)"


def _plain_equivalent(sel, kind: Kind, static: bool = False) -> tuple[str | None, list[str]]:
    """PyTorch's and transformers' own way to run the same kernels, and what it loses; None where none.
    ``static``: a generate measured with a static KV cache."""
    if isinstance(sel, dict) and set(sel) & {"prefill", "decode"}:
        return None, ["a backend per phase: transformers and PyTorch choose one kernel for every call"]
    if isinstance(sel, dict):
        return None, ["a backend per layer kind: transformers takes one attention implementation per model (or per "
                      "sub-model's config), and PyTorch's flags one kernel for every call"]
    row = catalog.row(sel)
    if row is not None and row.sdp_backend:
        code = ("import torch\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n\n"
                "model.set_attn_implementation(\"sdpa\")\n"
                f"with sdpa_kernel([SDPBackend.{row.sdp_backend}]):  # process-wide while open\n"
                f"    {_STATIC_CALL if static else kind.call}")
        loses = ["the flags are process-wide: every thread and every model's SDPA calls are forced while it is open",
                 "no layout change where the backend refuses the inputs as given (grouped k/v heads for "
                 "efficient): SDPA raises 'No available kernel' instead",
                 "under torch.compile the kernel is the one of the first compile, whatever the flags say later"]
        return code, loses
    if row is not None and row.transformers:
        return (f"model.set_attn_implementation({row.transformers!r})" + (f"\n{_STATIC_CALL}" if static else ""),
                [] if row.kind != "choice" else ["SDPA's own choice may change with the inputs, the GPU or PyTorch"])
    return None, [f"`{sel}` is attnswitch's own: transformers has no attention implementation that runs it"]


def _remeasure(environment: Mapping, workload: Mapping, sweep) -> list[str]:
    env, work = environment, workload
    out = []
    if env.get("gpu"):
        out.append(f"on another GPU than {env['gpu']}")
    versions = " or ".join(f"another {k} than {version_text(k, env[k])}"
                           for k in ("torch", "cudnn", "transformers") if env.get(k))
    out.append(f"with {versions}" if versions else "")
    lens = work.get("prompt_lens") or ([work["seq"]] if "seq" in work else [])
    if sweep:
        lens = [p.seq for p in sweep]
    if lens:
        out.append(f"for lengths outside {min(lens)}–{max(lens)} tokens" if len(set(lens)) > 1 else
                   f"for lengths other than {lens[0]} tokens")
    batches = sorted({p.batch for p in sweep}) if sweep else [work["batch"]] if work.get("batch") else []
    if batches:
        out.append(f"for batch sizes other than {', '.join(map(str, batches))}")
    if work.get("dtype"):
        out.append(f"in another dtype than {work['dtype']}")
    if work.get("cache") not in (None, "none"):  # (a generate's, with a KV cache)
        out.append(f"with another KV cache than a {work['cache']} one")
    return [x for x in out if x]


def deploy_info(pick: str, environment: Mapping, workload: Mapping, *, sweep=(), ties=(),
                keep: bool = False) -> Deploy:
    """How to ship ``pick`` for the workload's kind (a training step in the training script, the others in the
    serving process): the attnswitch snippet (runs as it is, with ``model`` in scope), the transformers/PyTorch-
    only equivalent where one exists and what it loses, the environment variables the measurement ran with
    that matter, the versions, and when to measure again. ``keep``: the pick is the model's own attention, and
    nothing needs to change."""
    c = candidate.parse(pick)  # a compiled candidate: its backend, then torch.compile as it was measured
    mode, kind = c.compile, kind_of(workload)
    sel = c.selection if isinstance(c.selection, str) else c.selection.as_dict()
    static = kind.generates and workload.get("cache") == "static"
    plain, loses = _plain_equivalent(sel, kind, static)
    if mode is not None and plain is not None:
        plain = f"# compiled as measured (torch.compile, mode {mode!r}) before the calls below\n{plain}"
    env = environment
    return Deploy(pick, sel, mode, kind.where, "" if keep else _attnswitch_snippet(sel, mode, kind, static), plain,
                  tuple(loses), dict(env.get("env_vars") or {}),
                  {k: env.get(k) for k in (*_VERSIONS, "attnswitch") if env.get(k) is not None},
                  tuple(_remeasure(environment, workload, sweep)), tuple(ties), keep)


def _selection_and_mode(selection, mode: str | None):
    """A selection and its compile mode, where files and reports from before the ``compile`` field named a
    compiled pick as one string (``flash+compile``)."""
    if mode is None and isinstance(selection, str):
        c = candidate.parse(selection)
        if c.compile is not None:
            return (c.selection if isinstance(c.selection, str) else c.selection.as_dict()), c.compile
    return selection, mode


def policy_document(report) -> dict | None:
    """What ``policy.json`` holds: the selection, the versions and environment it was measured with, the
    workload (and lengths) it was measured on, and the tie it was picked from."""
    info = report.deploy
    if info is None:
        return None
    selection, mode = _selection_and_mode(info.selection, info.compile)
    return {"schema": POLICY_SCHEMA, "selection": selection, "compile": mode,
            "model": report.model,
            "workload": {k: v for k, v in report.workload.items() if k != "description"},
            "environment": {k: report.environment.get(k) for k in (*_VERSIONS, "attnswitch", "device")},
            "env": info.env, "ties": list(info.ties), "recommendation": report.recommendation,
            "command": report.command}


def write_policy(report, path: str | Path) -> Path | None:
    doc = policy_document(report)
    if doc is None:
        return None
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return Path(path)


@dataclass(frozen=True)
class MeasuredPolicy:
    """A selection read back from ``policy.json``, with what it was measured on."""

    selection: object  # a backend name or {"prefill": ..., "decode": ...}
    environment: Mapping = field(default_factory=dict)
    workload: Mapping = field(default_factory=dict)
    source: str = ""
    compile: str | None = None  # the torch.compile mode it was measured under (None: uncompiled)

    def apply(self, model):
        """``attnswitch.patch(model, selection)``: every thread, until ``attnswitch.unpatch(model)``. The attention
        only: where it was measured compiled (``compile`` not None), compile after this as the report's Deploy
        snippet does (``model.forward`` in that mode; a generate's decode steps alone). Warns where ``model``
        is not of the architecture, attention shape or dtype measured."""
        from .switch import patch

        self._check(model)
        return patch(model, self.selection)

    def backend(self, model=None):
        """``attnswitch.backend(selection, model=model)``: for a block (warns as ``apply`` does)."""
        from .switch import backend

        if model is not None:
            self._check(model)
        return backend(self.selection, model=model)

    def differences(self, model) -> list[str]:
        """What of ``model`` differs from the model measured: its architecture, its attention's shape
        (``modelshape``) and its dtype; nothing where the policy has no record of them."""
        out = differences(self.workload.get("model_shape"), model)
        measured, dtype = self.workload.get("dtype"), dtype_of(model)  # (as the report read it)
        if isinstance(measured, str) and dtype is not None and dtype != measured:
            out.append(f"dtype {measured} (here {dtype})")
        return out

    def _check(self, model) -> None:
        differ = self.differences(model)
        if differ:
            warnings.warn(f"{self.source or 'the policy'} was measured on another model ({', '.join(differ)}): the "
                          "pick may not hold for this one; measure it with `attnswitch compare`", stacklevel=3)


_WARNED: set = set()


def _mismatches(measured: Mapping, env: Mapping | None = None) -> list[str]:
    """The versions, GPU and (``env``: the policy's "Measured with" variables) settings the measurement had and
    this process has not."""
    from .env import environment

    device = measured.get("device")
    here = environment(device if device in ("cpu", "cuda") else None)
    out = [f"{k} {version_text(k, measured[k])} (here {version_text(k, here[k]) if here.get(k) else 'none'})"
           for k in _VERSIONS if measured.get(k) is not None and str(measured.get(k)) != str(here.get(k))]
    now = here.get("env_vars") or {}
    if isinstance(env, Mapping):  # the variables that change what runs: unset, changed or set since
        out += [f"{k}={env[k]} (here {f'{k}={now[k]}' if k in now else 'unset'})" for k in sorted(env)
                if str(env[k]) != str(now.get(k))]
        # (set here only: not what inductor may have set in this process before attnswitch was imported)
        out += [f"{k} unset (here {k}={now[k]})" for k in sorted(now) if k not in env and k not in SET_BY_TORCH]
    return out


def _shown(value) -> str:
    """A value of a policy file as JSON writes it, cut short where it is long (a line of an error message)."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _checked_parts(path, doc: dict) -> tuple[dict, dict]:
    """A policy file's ``environment`` and ``workload``, each field of the types written (``ValueError``, one line,
    naming the field that is not); its ``ties``, ``model`` and ``env`` checked alike."""
    for key in ("environment", "workload", "env"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise ValueError(f"{path}: '{key}' must be an object (or absent), not {_shown(doc[key])}")
    ties = doc.get("ties")
    if ties is not None and not (isinstance(ties, list) and all(isinstance(t, str) for t in ties)):
        raise ValueError(f"{path}: 'ties' must be a list of backend names (or absent), not {_shown(ties)}")
    if doc.get("model") is not None and not isinstance(doc["model"], str):
        raise ValueError(f"{path}: 'model' must be a name (or absent), not {_shown(doc['model'])}")
    workload = doc.get("workload") or {}
    wrong = malformed(workload["model_shape"]) if workload.get("model_shape") is not None else None
    if wrong:
        raise ValueError(f"{path}: 'workload'.'model_shape' {wrong}, not {_shown(workload['model_shape'])}")
    if workload.get("dtype") is not None and not isinstance(workload["dtype"], str):
        raise ValueError(f"{path}: 'workload'.'dtype' must be a dtype's name (or absent), not "
                         f"{_shown(workload['dtype'])}")
    env = doc.get("env") or {}
    odd = next((k for k, v in env.items() if v is not None and not isinstance(v, str)), None)
    if odd is not None:
        raise ValueError(f"{path}: 'env'.'{odd}' must be a string (or null), not {_shown(env[odd])}")
    environment = doc.get("environment") or {}
    for key in (*_VERSIONS, "attnswitch", "device"):
        value = environment.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise ValueError(f"{path}: 'environment'.'{key}' must be a version or a name (or null), not "
                             f"{_shown(value)}")
    return environment, workload


def load_policy(path: str | Path) -> MeasuredPolicy:
    """The policy ``compare --out`` wrote, to apply in a serving process. Warns once per file where it was
    measured with other versions or on another GPU, or has no record of them; raises ``ValueError`` (one
    line) for a file that is not one, and for a backend this process cannot resolve."""
    from .backends.policy import resolve_selection

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{path}: not a policy file (not JSON); `attnswitch compare --out DIR` writes "
                         "DIR/policy.json") from None
    if not isinstance(doc, dict) or "schema" not in doc or "selection" not in doc:
        raise ValueError(f"{path}: not a policy file of schema {POLICY_SCHEMA} (it needs 'schema' and 'selection')")
    schema = doc["schema"]
    if type(schema) is not int or schema != POLICY_SCHEMA:  # (not true, nor 1.0)
        raise ValueError(f"{path}: not a policy file of schema {POLICY_SCHEMA} ('schema' is {_shown(schema)})")
    selection = doc["selection"]
    mode = doc.get("compile")
    if mode is not None and (not isinstance(mode, str) or mode not in MODES):
        raise ValueError(f"{path}: 'compile' must be one of {', '.join(MODES)} (or null), not {_shown(mode)}")
    if not isinstance(selection, (str, dict)):
        raise ValueError(f"{path}: 'selection' must be a backend name or {{\"prefill\": ..., \"decode\": ...}}, "
                         f"not {_shown(selection)}")
    try:
        selection, mode = _selection_and_mode(selection, None if mode == "none" else mode)
        resolve_selection(selection)  # an unknown backend: the registry's own error
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: 'selection': {e}") from None
    environment, workload = _checked_parts(path, doc)
    policy = MeasuredPolicy(selection, environment, workload, str(path), mode)
    key = str(p.resolve())
    differ = _mismatches(policy.environment, doc.get("env"))
    unrecorded = not any(environment.get(k) for k in ("torch", "transformers", "device"))
    if (differ or unrecorded) and key not in _WARNED:
        _WARNED.add(key)
        said = [f"was measured with {', '.join(differ)}"] if differ else []
        said += ["has no record of the versions and the device it was measured with"] if unrecorded else []
        warnings.warn(f"{path} {' and '.join(said)}: the pick may not hold here; measure again with "
                      "`attnswitch compare`", stacklevel=2)
    return policy
