"""RoundPipe from Python: fine-tune LLMs with all state in host memory (docs/python.md).

A thin layer over the compiled module ``roundpipe._roundpipe`` (pybind11 over the C++ library
the ``roundpipe`` command is built from): the same specs, the same runs, the same files.

    import roundpipe
    t = roundpipe.Trainer("examples/specs/lora.json", steps=10)
    result = t.run(on_step=lambda r: print(r["step"], r["loss"]))

Errors are Python exceptions carrying the command's one-line message: ``ValueError`` for bad
input (a spec key, an option: "spec: key 'workers': expected an integer, got \"two\""),
``RuntimeError`` for files and data ("<file>: <what>"), and the runtime's own subclasses of
``RuntimeError``: ``RuntimeFailure``, ``TrainingDiverged``, ``DeviceError``,
``DeviceOutOfMemory``.
"""
import json
import numbers
import os
import threading

try:
    from ._roundpipe import (DeviceError, DeviceOutOfMemory, RuntimeFailure, TrainingDiverged, __version__)
    from . import _roundpipe
except ImportError as e:  # the pure-Python files without the compiled module beside them
    raise ImportError("roundpipe: the compiled module roundpipe._roundpipe is missing ({}); build it "
                      "(cmake, RP_PYTHON_MODULE) and put build/python on PYTHONPATH, or "
                      "`pip install .` from the repository (docs/python.md)".format(e)) from None

__all__ = ["Trainer", "train", "plan", "generate", "merge", "export_gguf", "convert", "version",
           "format_progress", "RuntimeFailure", "TrainingDiverged", "DeviceError", "DeviceOutOfMemory",
           "__version__"]


def _json_text(value, where, key=""):
    """JSON text of a spec value; paths (os.PathLike) become strings. A value JSON cannot hold
    (NaN, inf, a set, an arbitrary object) raises ValueError naming its key under `where`."""
    def check(v, key):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            raise ValueError("{}: key '{}': expected a finite number, got {}".format(where, key, v))
        if isinstance(v, dict):
            for k, x in v.items():
                check(x, "{}.{}".format(key, k) if key else str(k))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                check(x, "{}[{}]".format(key, i))
        elif not (v is None or isinstance(v, (str, bool, int, float, os.PathLike))):
            raise ValueError("{}: key '{}': a {} is not a JSON value".format(where, key, type(v).__name__))
    check(value, key)
    return json.dumps(value, default=os.fspath, allow_nan=False)


def _check(where, name, value, kinds, expected):
    """TypeError "<where>: <name>: expected <expected>, got <type>" unless `value` is one of
    `kinds`: the compiled functions would otherwise raise pybind11's many-line listing of their
    private signature. A bool is no number here."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
        return value
    raise TypeError("{}: {}: expected {}, got {}".format(where, name, expected, type(value).__name__))


def _check_callbacks(where, **callbacks):
    """Each given callback must be callable, checked before anything runs or is written."""
    for name, f in callbacks.items():
        if f is not None and not callable(f):
            raise TypeError("{}: {}: expected a callable or None, got {}".format(where, name, type(f).__name__))


def _paths(where, **paths):
    """Each path argument must be a str or an os.PathLike; `base` may also be None (not given)."""
    for name, value in paths.items():
        if not (name == "base" and value is None):
            _check(where, name, value, (str, os.PathLike), "a path")


def _settings(overrides, settings):
    """(dotted key, JSON text) pairs: `overrides` first, then the keyword settings."""
    if overrides is not None and not isinstance(overrides, dict):
        raise TypeError("overrides must be a dict of dotted keys to values ({'lora.r': 8}), got "
                        + type(overrides).__name__)
    pairs = []
    for source in (overrides or {}), settings:
        for key, value in source.items():
            pairs.append((str(key), _json_text(value, "overrides", str(key))))
    return pairs


def format_progress(report):
    """The progress line ``roundpipe train`` prints, from an on_step report dict."""
    line = "step {:>5}/{} | loss {:.4f} | epoch {:.2f}".format(
        report["step"], report["total_steps"], report["loss"], report["epoch"])
    if report.get("evaluated"):
        line += " | eval loss {:.4f} (ppl {:.2f})".format(report["eval_loss"], report["eval_perplexity"])
    line += " | {:>8.1f} tokens/s | lr {:.3e} | grad norm {:.3f}".format(
        report["tokens_per_s"], report["lr"], report["grad_norm"])
    if report.get("skipped"):
        line += " (skipped)"
    return line


class Trainer:
    """A training run from a spec (docs/spec.md lists every key), as ``roundpipe train``.

    ``spec``: a dict (the spec's JSON object; errors name it "spec") or the path of a spec
    file. ``overrides``: dotted keys set on the spec before it is checked, like
    ``roundpipe train --set KEY=VALUE`` ({"lora.r": 8, "optimizer.lr": 1e-4}); keyword
    arguments do the same for top-level keys (``steps=5``, ``resume_from="runs/x/checkpoint-4"``).
    The spec is checked here: a bad key raises ValueError naming it.
    """

    def __init__(self, spec, overrides=None, **settings):
        pairs = _settings(overrides, settings)
        if isinstance(spec, dict):
            self._t = _roundpipe._Trainer("spec", _json_text(spec, "spec"), pairs)
        elif isinstance(spec, (str, os.PathLike)):
            path = os.fspath(spec)
            if "\0" in path:
                raise ValueError("Trainer: the spec path {!r} holds a NUL character".format(path))
            if os.path.isdir(path):
                raise ValueError("{}: is a folder; give the path of a spec file (JSON)".format(path))
            self._t = _roundpipe._Trainer(path, "", pairs)
        else:
            raise TypeError("Trainer: spec must be a dict or the path of a spec file, got "
                            + type(spec).__name__)
        #: The dict run() returned last (also set when it raised KeyboardInterrupt).
        self.result = None

    @property
    def output_dir(self):
        """The folder the run writes (the spec's output_dir)."""
        return self._t.output_dir

    def run(self, on_step=None, on_eval=None, on_checkpoint=None, on_ready=None, progress=None,
            handle_interrupt=True):
        """Trains; returns a dict of how the run ended.

        The GIL is released while training; the callbacks run on the calling thread (the
        training loop's) and take it again:
          on_ready()          once the model, data and runtime are ready (resumed, if resuming)
          on_step(report)     after every optimizer step: a dict with step, total_steps,
                              epoch, loss, lr, grad_norm, tokens, target_tokens, tokens_per_s,
                              elapsed_s, eta_s, skipped, evaluated and, when evaluated,
                              eval_loss, eval_perplexity, eval_tokens
          on_eval(report)     the same dict, for the steps followed by an evaluation
          on_checkpoint(info) a checkpoint was written: {"dir", "step", "seconds"}
        ``progress``: print ``format_progress`` lines (default: when on_step is None).

        Stopping: ``stop()`` (e.g. from a callback) ends the run after the steps in flight,
        saved as checkpoint-<n>; the result has stopped True and checkpoint. An exception
        raised by a callback stops the run the same way (the checkpoint is kept) and is
        raised again here. Ctrl-C (a notebook's interrupt) during run() on the main thread
        stops it likewise and then raises KeyboardInterrupt (``self.result`` holds the
        result); ``handle_interrupt=False`` leaves SIGINT alone.

        Result keys: first_step, steps_done, total_steps, stopped, interrupted,
        steps_abandoned, skipped_steps, checkpoint (the last one written, "" if none),
        latest_checkpoint (stopped: the newest to resume from), metrics (metrics.csv),
        seconds, peak_device_bytes, plan, sample_before, sample_after, early_stopped,
        early_stop_reason, best_checkpoint, best_metric, best_step, final_step, replica,
        replicas. Raises ValueError (spec, output folder), RuntimeError (files),
        RuntimeFailure, TrainingDiverged, DeviceError, DeviceOutOfMemory.
        """
        _check_callbacks("Trainer.run", on_step=on_step, on_eval=on_eval, on_checkpoint=on_checkpoint,
                         on_ready=on_ready)
        if progress is None:
            progress = on_step is None
        if progress:
            user_step = on_step

            def on_step(report):
                print(format_progress(report), flush=True)
                if user_step is not None:
                    user_step(report)
        sigint = handle_interrupt and threading.current_thread() is threading.main_thread()
        self.result = None
        result = self._t.run(on_ready, on_step, on_eval, on_checkpoint, sigint)
        self.result = result
        if result["interrupted"]:
            where = result["checkpoint"] or result["latest_checkpoint"]
            raise KeyboardInterrupt("training interrupted after {} steps; {}".format(
                result["steps_done"],
                "resume with resume_from=%r" % where if where else "no checkpoint was written"))
        return result

    def stop(self):
        """Asks the running run() to stop after the steps in flight (any thread, any callback).
        Returns True for the first request, False when already stopping or not running."""
        return self._t.stop()


def train(spec, overrides=None, on_step=None, on_eval=None, on_checkpoint=None, **settings):
    """``Trainer(spec, overrides, **settings).run(on_step, on_eval, on_checkpoint)``."""
    return Trainer(spec, overrides, **settings).run(on_step=on_step, on_eval=on_eval, on_checkpoint=on_checkpoint)


def plan(model, **options):
    """The report ``roundpipe plan --model MODEL ...`` prints, as a string (docs/plan.md).

    Options are the command's flags with '_' for '-': gpus, seq, micro, gpu ("H200"),
    memory_cap ("24GiB"), host_gib, sequences_per_micro, profile, trace, peak_tflops, fp8,
    fp8_wgrad, bf16_wgrad, fp8_tflops, hbm_gbps, pcie_gbps, iterations, sync, max_seq, mlp_chunk,
    save_attention (False: --no-save-attention), frozen, lora_r, lora_targets, nodes, net_gbps,
    net_latency_us, accumulation, grouped_gemm_efficiency, and the disk tier's disk_gbps,
    disk_write_gbps, host_budget_gib, disk_ring (a prediction: training does not stream from a
    disk yet). Nothing needs a GPU or weights
    (a config.json is enough). Raises ValueError naming an unknown or bad option.
    """
    _paths("plan", model=model)
    options["model"] = os.fspath(model)
    return _roundpipe._plan(options)


def generate(model, prompt=None, *, chat=None, system=None, messages=None, tokens=None, base=None,
             max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop=(),
             chat_template="auto", think=True, backend="cpu", dtype="bf16", context=0, on_text=None):
    """Generates with a KV cache on one device, as ``roundpipe generate``.

    ``model``: a .gguf, a Hugging Face folder (a run's final/) or a PEFT adapter folder (a
    LoRA run's final/, folded into its base: ``base`` or the one it names). Give one of
    ``prompt`` (plain text, with the tokenizer's BOS), ``chat`` (a user message, with an
    optional ``system`` one, through the model's chat template), ``messages`` (a list of
    {"role", "content"} dicts or (role, content) pairs) or ``tokens`` (prompt token ids, no
    tokenizer involved). Greedy unless temperature > 0. Stops at eos / end of turn / a
    ``stop`` string (text prompts) or after max_tokens. ``on_text(str)`` receives the text
    as it grows (text prompts). Returns {"tokens": new ids, "prompt_tokens", "text" ("" for a
    ``tokens`` prompt; bytes that are not UTF-8 become U+FFFD), "text_bytes" (the bytes
    ``roundpipe generate`` prints), "seconds"}.
    """
    msgs = []
    if messages is not None:
        for i, m in enumerate(messages):
            if isinstance(m, dict):
                if "role" not in m or "content" not in m:
                    raise ValueError("generate: messages[{}] needs 'role' and 'content', got keys {}".format(
                        i, sorted(m)))
                msgs.append((m["role"], m["content"]))
            elif isinstance(m, (list, tuple)) and len(m) == 2:
                msgs.append((m[0], m[1]))
            else:
                raise ValueError("generate: messages[{}] must be a {{'role', 'content'}} dict or a (role, "
                                 "content) pair".format(i))
    path = (str, os.PathLike)
    _check("generate", "model", model, path, "a path")
    if base is not None:
        _check("generate", "base", base, path, "a path")
    for name, value in (("prompt", prompt), ("chat", chat), ("system", system)):
        if value is not None:
            _check("generate", name, value, str, "a str")
    for i, (role, content) in enumerate(msgs):
        _check("generate", "messages[{}] role".format(i), role, str, "a str")
        _check("generate", "messages[{}] content".format(i), content, str, "a str")
    if tokens is not None:
        if isinstance(tokens, (str, bytes, dict)) or not hasattr(tokens, "__iter__"):
            _check("generate", "tokens", tokens, (), "a list of token ids")
        tokens = list(tokens)
        for i, t in enumerate(tokens):
            _check("generate", "tokens[{}]".format(i), t, numbers.Integral, "a token id (an int)")
            if not -2**31 <= t < 2**31:
                raise ValueError("generate: tokens[{}]: token id {} is outside the vocabulary".format(i, t))
    for name, value in (("max_tokens", max_tokens), ("top_k", top_k), ("seed", seed), ("context", context)):
        _check("generate", name, value, numbers.Integral, "an int")
        if not -2**63 <= value < 2**63:
            raise ValueError("generate: {}: expected a 64-bit integer, got {}".format(name, value))
    if seed < 0:
        raise ValueError("generate: seed must be >= 0, got {}".format(seed))
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        _check("generate", name, value, numbers.Real, "a number")
    for name, value in (("chat_template", chat_template), ("backend", backend), ("dtype", dtype)):
        _check("generate", name, value, str, "a str")
    _check("generate", "think", think, bool, "True or False")
    _check_callbacks("generate", on_text=on_text)
    if isinstance(stop, str):
        stop = [stop]
    _check("generate", "stop", stop, (list, tuple), "a str or a list of str")
    for i, s in enumerate(stop):
        _check("generate", "stop[{}]".format(i), s, str, "a str")
    if max_tokens < 0:
        raise ValueError("generate: max_tokens must be >= 0, got {}".format(max_tokens))
    if chat is not None:
        if system is not None:
            msgs.append(("system", system))
        msgs.append(("user", chat))
    return _roundpipe._generate(os.fspath(model), os.fspath(base) if base else "", prompt or "", msgs,
                                list(tokens or []), max_tokens, temperature, top_k, top_p, seed, list(stop),
                                chat_template, think, backend, dtype, context, on_text)


def merge(adapter, out, base=None, dtype="bf16"):
    """Folds a PEFT LoRA adapter folder into its base model, writing the plain Hugging Face
    folder ``out`` (``roundpipe merge``; out is replaced, so it must be new, empty or an
    earlier convert/merge output). Returns the base model's path."""
    _paths("merge", adapter=adapter, out=out, base=base)
    _check("merge", "dtype", dtype, str, "a str (f32, bf16 or f16)")
    base_path, notes = _roundpipe._merge(os.fspath(adapter), os.fspath(out), os.fspath(base) if base else "", dtype)
    for line in notes:
        print(line)
    return base_path


def export_gguf(model_dir, out, type="f16", force=False):
    """Writes a Hugging Face folder (an adapter folder is merged first) as one GGUF file for
    llama.cpp (``roundpipe export-gguf``): type f16, bf16 or q8_0. Returns the tensor count."""
    _paths("export_gguf", model_dir=model_dir, out=out)
    _check("export_gguf", "type", type, str, "a str (f16, bf16 or q8_0)")
    _check("export_gguf", "force", force, bool, "True or False")
    return _roundpipe._export_gguf(os.fspath(model_dir), os.fspath(out), type, force)


def convert(gguf, out, dtype="bf16"):
    """GGUF file -> Hugging Face folder ``out`` (``roundpipe convert``). Returns ``out``."""
    _paths("convert", gguf=gguf, out=out)
    _check("convert", "dtype", dtype, str, "a str (f32, bf16 or f16)")
    for line in _roundpipe._convert(os.fspath(gguf), os.fspath(out), dtype):
        print(line)
    return os.fspath(out)


def version():
    """What ``roundpipe --version`` prints (version, commit, build type, CUDA, cuDNN)."""
    return _roundpipe._version_text()
