"""The Python module against the command it wraps, on the CPU backend with a tiny model.

tests/fixtures/hf_golden/tiny_llama (vocab 256) with a byte-level tokenizer written here, a
text excerpt as data. Every expectation is checked against what the `roundpipe` command
produces from the same inputs (metrics.csv, saved weights, the plan report, generated text),
never against numbers written down here. CTest runs it with PYTHONPATH=<build>/python and
RP_BUILD_DIR / RP_SOURCE_DIR set (tests/CMakeLists.txt).
    python3 tests/python/test_roundpipe.py [TestName ...]
"""
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import roundpipe

SRC = os.environ.get("RP_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("RP_BUILD_DIR", os.path.join(SRC, "build"))
CLI = os.path.join(BUILD, "roundpipe")
WORK = None


def byte_level_tokenizer(path):
    """Token id = byte value; eos "<|endoftext|>" = id 2 as in the tiny model's config."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs) if b != 2}
    vocab["<|endoftext|>"] = 2
    with open(path, "w") as f:
        json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []},
                   "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
                   "added_tokens": [{"id": 2, "content": "<|endoftext|>", "special": True}],
                   "normalizer": None, "decoder": {"type": "ByteLevel"}}, f)


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="rp_python_")
    model = os.path.join(WORK, "model")
    os.makedirs(model)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(SRC, "tests/fixtures/hf_golden/tiny_llama", f), model)
    byte_level_tokenizer(os.path.join(model, "tokenizer.json"))


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


def spec(out, **extra):
    s = {"model": os.path.join(WORK, "model"),
         "data": os.path.join(SRC, "tests/fixtures/sotu-excerpt/1790_george_washington.txt"),
         "output_dir": os.path.join(WORK, out), "seq_len": 16, "sequences_per_step": 2, "micro_batches": 2,
         "steps": 6, "backend": "cpu", "workers": 2, "seed": 3, "save_dtype": "f32", "tensorboard": False,
         "optimizer": {"lr": 0.01, "max_grad_norm": 1.0},
         "lr_schedule": {"kind": "cosine", "warmup_steps": 1}}
    s.update(extra)
    return s


def cli(*args, raw=False):
    """The command's stdout (bytes with raw: a random tiny model's text need not be UTF-8)."""
    r = subprocess.run([CLI] + list(args), capture_output=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError("roundpipe %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout if raw else r.stdout.decode()


def cli_run(out, **extra):
    """The uninterrupted run of the command: its output folder."""
    path = os.path.join(WORK, out + ".json")
    with open(path, "w") as f:
        json.dump(spec(out, **extra), f)
    cli("train", "-q", path)
    return os.path.join(WORK, out)


def metrics_losses(folder):
    with open(os.path.join(folder, "metrics.csv")) as f:
        return {int(row["step"]): row["loss"] for row in csv.DictReader(f)}


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class TrainTest(unittest.TestCase):
    def test_callbacks_stop_and_resume_reach_the_commands_weights(self):
        reference = cli_run("cli-full")
        reports, checkpoints, ready = [], [], []
        t = roundpipe.Trainer(spec("py"))

        def on_step(r):
            reports.append(r)
            if r["step"] == 2:
                self.assertTrue(t.stop())
                self.assertFalse(t.stop())  # already stopping

        res = t.run(on_step=on_step, on_checkpoint=checkpoints.append, on_ready=lambda: ready.append(1))
        self.assertEqual(ready, [1])
        self.assertTrue(res["stopped"])
        self.assertFalse(res["interrupted"])
        stopped_at = res["steps_done"]
        self.assertGreaterEqual(stopped_at, 2)
        self.assertLess(stopped_at, 6)
        self.assertEqual([r["step"] for r in reports], list(range(1, stopped_at + 1)))
        # the reports are the command's metrics.csv rows of the same steps
        want = metrics_losses(reference)
        for r in reports:
            self.assertEqual("%.6f" % r["loss"], want[r["step"]], r)
            for key in ("lr", "grad_norm", "tokens_per_s", "epoch", "tokens"):
                self.assertIn(key, r)
            self.assertGreater(r["tokens"], 0)
        self.assertEqual(res["checkpoint"], os.path.join(WORK, "py", "checkpoint-%d" % stopped_at))
        self.assertEqual([c["dir"] for c in checkpoints], [res["checkpoint"]])
        self.assertEqual(checkpoints[0]["step"], stopped_at)

        resumed = []
        res2 = roundpipe.Trainer(spec("py"), resume_from=res["checkpoint"]).run(on_step=resumed.append)
        self.assertFalse(res2["stopped"])
        self.assertEqual(res2["first_step"], stopped_at)
        self.assertEqual(res2["steps_done"], 6)
        self.assertEqual([r["step"] for r in resumed], list(range(stopped_at + 1, 7)))
        for r in resumed:
            self.assertEqual("%.6f" % r["loss"], want[r["step"]], r)
        mine, theirs = os.path.join(WORK, "py"), reference
        self.assertEqual(read_bytes(os.path.join(mine, "final/model.safetensors")),
                         read_bytes(os.path.join(theirs, "final/model.safetensors")),
                         "stopped + resumed weights differ from the command's uninterrupted run")
        self.assertEqual(read_bytes(os.path.join(mine, "state/final/optimizer_state.bin")),
                         read_bytes(os.path.join(theirs, "state/final/optimizer_state.bin")))

    def test_an_exception_in_a_callback_stops_cleanly_and_is_raised(self):
        class Boom(Exception):
            pass

        calls = []

        def on_step(r):
            calls.append(r["step"])
            raise Boom("from step %d" % r["step"])

        t = roundpipe.Trainer(spec("py-boom"))
        with self.assertRaisesRegex(Boom, "from step 1"):
            t.run(on_step=on_step)
        self.assertEqual(calls, [1])  # no callback after the one that raised
        # the run stopped like stop(): the steps it finished are saved and resumable
        saved = [d for d in os.listdir(os.path.join(WORK, "py-boom")) if d.startswith("checkpoint-")]
        self.assertEqual(len(saved), 1, saved)
        res = roundpipe.Trainer(spec("py-boom", steps=3),
                                resume_from=os.path.join(WORK, "py-boom", saved[0])).run(progress=False)
        self.assertEqual(res["steps_done"], 3)

    def test_a_callback_that_is_not_callable_is_refused_before_anything_is_written(self):
        out = os.path.join(WORK, "py-not-callable")
        for name in ("on_step", "on_eval", "on_checkpoint", "on_ready"):
            with self.assertRaisesRegex(TypeError, r"^Trainer.run: %s: expected a callable or None, got int$" % name):
                roundpipe.Trainer(spec("py-not-callable")).run(**{name: 5})
            self.assertFalse(os.path.exists(out), name)

    def test_the_gil_is_released_while_training(self):
        # no callback: no Python runs in the run at all, so another thread counts only if
        # run() let go of the GIL
        counts, done = [0], threading.Event()

        def count():
            while not done.is_set():
                counts[0] += 1
                time.sleep(0.001)

        t = roundpipe.Trainer(spec("py-gil", steps=8))
        th = threading.Thread(target=count)
        th.start()
        time.sleep(0.05)
        before = counts[0]
        res = t.run(progress=False)
        after = counts[0]
        done.set()
        th.join()
        self.assertEqual(res["steps_done"], 8)
        self.assertGreater(after - before, 10, "the counting thread did not run during %.2f s of training"
                           % res["seconds"])

    def test_sigint_stops_like_ctrl_c_and_raises_keyboard_interrupt(self):
        t = roundpipe.Trainer(spec("py-sigint"))
        python_handler = signal.getsignal(signal.SIGINT)

        def on_step(r):
            if r["step"] == 1:
                os.kill(os.getpid(), signal.SIGINT)

        with self.assertRaisesRegex(KeyboardInterrupt, "resume with resume_from="):
            t.run(on_step=on_step)
        self.assertTrue(t.result["stopped"])
        self.assertTrue(t.result["interrupted"])
        self.assertTrue(os.path.isdir(t.result["checkpoint"]), t.result)
        self.assertTrue(os.path.isfile(os.path.join(WORK, "py-sigint", "state",
                                                    os.path.basename(t.result["checkpoint"]),
                                                    "optimizer_state.bin")))
        # Python's own handler is back: SIGINT raises KeyboardInterrupt again
        self.assertIs(signal.getsignal(signal.SIGINT), python_handler)
        with self.assertRaises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)

    def test_sigint_stops_the_outer_run_after_a_run_inside_its_callback(self):
        t = roundpipe.Trainer(spec("py-outer", steps=30))

        def on_step(r):
            if r["step"] == 1:
                roundpipe.Trainer(spec("py-inner", steps=2)).run(progress=False)
            if r["step"] == 3:
                os.kill(os.getpid(), signal.SIGINT)

        with self.assertRaisesRegex(KeyboardInterrupt, "resume with resume_from="):
            t.run(on_step=on_step)
        self.assertLess(t.result["steps_done"], 30)
        self.assertTrue(os.path.isdir(t.result["checkpoint"]), t.result)


class ToolsTest(unittest.TestCase):
    def test_a_bad_spec_raises_naming_the_key(self):
        with self.assertRaisesRegex(ValueError, r"^spec: key 'workers': expected an integer"):
            roundpipe.Trainer(spec("bad", workers="two"))
        # an override (or a keyword setting) that makes the error is named, not the spec it changed
        with self.assertRaisesRegex(ValueError, r"^overrides\['lora.r'\]: key 'lora.r': expected an integer"):
            roundpipe.Trainer(spec("bad"), overrides={"lora.r": 0})
        with self.assertRaisesRegex(ValueError, r"^overrides\['steps'\]: key 'steps'"):
            roundpipe.Trainer(spec("bad"), steps=0)
        with self.assertRaisesRegex(ValueError, r"key 'no_such_key'"):
            roundpipe.Trainer(spec("bad", no_such_key=1))
        # refused as the spec is read, not when the run starts
        with self.assertRaisesRegex(ValueError, r"key 'fp8_weight_gradients': expected false with \"lora\""):
            roundpipe.Trainer(spec("bad"), overrides={"fp8": True, "lora": {"r": 4}, "fp8_weight_gradients": True})
        path = os.path.join(WORK, "broken.json")
        with open(path, "w") as f:
            f.write('{"model": ')
        with self.assertRaisesRegex(Exception, "broken.json:1:"):
            roundpipe.Trainer(path)
        # a spec file works like the dict
        with open(path, "w") as f:
            json.dump(spec("bad", seq_len=-1), f)
        with self.assertRaisesRegex(ValueError, r"broken.json: key 'seq_len'"):
            roundpipe.Trainer(path)
        with self.assertRaises(TypeError):
            roundpipe.Trainer(42)
        # values JSON cannot hold name their key; the wrong kinds of argument say what they need
        with self.assertRaisesRegex(ValueError, r"^spec: key 'optimizer.lr': expected a finite number"):
            roundpipe.Trainer(spec("bad", optimizer={"lr": float("nan")}))
        with self.assertRaisesRegex(ValueError, r"^overrides: key 'lora.r': a object is not a JSON value"):
            roundpipe.Trainer(spec("bad"), overrides={"lora.r": object()})
        with self.assertRaisesRegex(TypeError, r"overrides must be a dict"):
            roundpipe.Trainer(spec("bad"), overrides=[("lora.r", 8)])
        with self.assertRaisesRegex(ValueError, r"is a folder"):
            roundpipe.Trainer(WORK)
        with self.assertRaisesRegex(ValueError, r"^the spec file name is empty"):
            roundpipe.Trainer("")
        with self.assertRaisesRegex(ValueError, r"NUL"):
            roundpipe.Trainer("a\0b")
        with self.assertRaisesRegex(ValueError, r"messages\[0\] needs 'role' and 'content'"):
            roundpipe.generate("nope.gguf", messages=[{"role": "user"}])
        with self.assertRaisesRegex(ValueError, r"max_tokens must be >= 0"):
            roundpipe.generate("nope.gguf", prompt="a", max_tokens=-1)

    def test_a_wrong_argument_type_raises_one_line_naming_the_argument(self):
        model = os.path.join(WORK, "model")
        for call, want in [
            (lambda: roundpipe.generate(model, prompt=5), r"generate: prompt: expected a str, got int"),
            (lambda: roundpipe.generate(model, prompt="a", seed=None), r"generate: seed: expected an int, got NoneType"),
            (lambda: roundpipe.generate(model, prompt="a", max_tokens=2.5), r"generate: max_tokens: expected an int"),
            (lambda: roundpipe.generate(model, prompt="a", temperature="hot"), r"generate: temperature: expected a number"),
            (lambda: roundpipe.generate(model, prompt="a", stop=[1]), r"generate: stop\[0\]: expected a str"),
            (lambda: roundpipe.generate(model, prompt="a", think="no"), r"generate: think: expected True or False"),
            (lambda: roundpipe.generate(model, tokens="abc"), r"generate: tokens: expected a list of token ids"),
            (lambda: roundpipe.generate(model, messages=[("user", 5)]), r"generate: messages\[0\] content: expected a str"),
            (lambda: roundpipe.generate(model, prompt="a", on_text=5), r"generate: on_text: expected a callable"),
            (lambda: roundpipe.merge(model, os.path.join(WORK, "m"), dtype=5), r"merge: dtype: expected a str"),
            (lambda: roundpipe.merge(model, None), r"merge: out: expected a path, got NoneType"),
            (lambda: roundpipe.export_gguf(model, os.path.join(WORK, "m.gguf"), force="yes"),
             r"export_gguf: force: expected True or False"),
            (lambda: roundpipe.convert("x.gguf", os.path.join(WORK, "c"), dtype=None), r"convert: dtype: expected a str"),
        ]:
            with self.assertRaisesRegex(TypeError, "^" + want) as raised:
                call()
            self.assertNotIn("\n", str(raised.exception))
        for call, want in [
            (lambda: roundpipe.generate(model, prompt="a", seed=-1), r"generate: seed must be >= 0"),
            (lambda: roundpipe.generate(model, prompt="a", max_tokens=2**70), r"generate: max_tokens: expected a 64-bit"),
            (lambda: roundpipe.generate(model, tokens=[2**40]), r"generate: tokens\[0\]: token id"),
        ]:
            with self.assertRaisesRegex(ValueError, "^" + want):
                call()

    def test_a_failing_run_raises_the_commands_error_line(self):
        bad = spec("missing-model", model=os.path.join(WORK, "no_such_model"))
        path = os.path.join(WORK, "missing-model.json")
        with open(path, "w") as f:
            json.dump(bad, f)
        r = subprocess.run([CLI, "train", path], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 1, r.stderr)
        line = r.stderr.strip().splitlines()[-1]
        self.assertTrue(line.startswith("roundpipe: error: "), line)
        with self.assertRaises(ValueError) as raised:  # the command's exit 1: a spec key, so ValueError
            roundpipe.Trainer(path).run(progress=False)
        self.assertEqual(str(raised.exception), line[len("roundpipe: error: "):])
        self.assertIn("no_such_model", str(raised.exception))

    def test_plan_returns_what_the_command_prints(self):
        model = os.path.join(WORK, "model")
        for flags, kwargs in [
            (["--gpus", "2", "--seq", "64", "--micro", "4", "--host-gib", "16"],
             dict(gpus=2, seq=64, micro=4, host_gib=16)),
            (["--gpu", "H200", "--gpus", "4", "--seq", "1024", "--lora-r", "8", "--host-gib", "64"],
             dict(gpu="H200", gpus=4, seq=1024, lora_r=8, host_gib=64)),
            (["--gpus", "2", "--seq", "64", "--lora-r", "8", "--disk-gbps", "7", "--disk-write-gbps", "3",
              "--host-budget-gib", "8", "--disk-ring", "3"],
             dict(gpus=2, seq=64, lora_r=8, disk_gbps=7, disk_write_gbps=3, host_budget_gib=8, disk_ring=3)),
        ]:
            want = cli("plan", "--model", model, *flags)
            got = roundpipe.plan(model, **kwargs)
            # the partitioner's own run time is what may differ
            strip = lambda text: re.sub(r"found in [0-9.]+ ms", "found in <t> ms", text).splitlines()
            self.assertEqual(strip(got), strip(want), flags)
            self.assertGreater(len(strip(got)), 5)
        with self.assertRaisesRegex(ValueError, "plan: unknown option 'gpus_'"):
            roundpipe.plan(model, gpus_=2)
        with self.assertRaisesRegex(ValueError, "--net-gbps 50: .*give --nodes"):
            roundpipe.plan(model, net_gbps=50)
        with self.assertRaisesRegex(RuntimeError, "no_such_model"):
            roundpipe.plan(os.path.join(WORK, "no_such_model"))
        # the expert GEMMs: grouped is accepted on a dense model as the command accepts it, bucketed
        # given is refused there, and an unknown mode is named
        strip = lambda text: re.sub(r"found in [0-9.]+ ms", "found in <t> ms", text).splitlines()
        self.assertEqual(strip(roundpipe.plan(model, expert_gemm="grouped")),
                         strip(cli("plan", "--model", model, "--expert-gemm", "grouped")))
        with self.assertRaisesRegex(ValueError, "--expert-gemm bucketed needs a mixture-of-experts model"):
            roundpipe.plan(model, expert_gemm="bucketed")
        with self.assertRaisesRegex(ValueError, "--expert-gemm 'BUCKETED': expected grouped or bucketed"):
            roundpipe.plan(model, expert_gemm="BUCKETED")
        # an explicit plan: a dict is the plan object, a str its JSON text (or a file), as --plan
        given = {"forward": [[0, 1], [2, 3]], "tail": [4, 4], "backward": [[3, 2], [1, 0]]}
        want = cli("plan", "--model", model, "--gpus", "2", "--seq", "64", "--plan", json.dumps(given))
        self.assertIn("given with --plan", want)
        self.assertEqual(strip(roundpipe.plan(model, gpus=2, seq=64, plan=given)), strip(want))
        self.assertEqual(strip(roundpipe.plan(model, gpus=2, seq=64, plan=json.dumps(given))), strip(want))
        with self.assertRaisesRegex(ValueError, "--plan"):
            roundpipe.plan(model, gpus=2, seq=64, plan={"forward": [[0, 1]], "tail": [2, 2], "backward": [[1, 0]]})
        # a False flag would read as bf16 weight gradients and change nothing: refused with the way
        with self.assertRaisesRegex(ValueError, "fp8_wgrad=False: .*bf16_wgrad=True"):
            roundpipe.plan(model, fp8=True, fp8_wgrad=False)

    def test_generate_returns_the_commands_tokens(self):
        model = os.path.join(WORK, "model")
        out = roundpipe.generate(model, tokens=[72, 101, 108], max_tokens=5)
        self.assertEqual(len(out["tokens"]), 5)
        self.assertTrue(all(0 <= t < 256 for t in out["tokens"]), out)
        self.assertEqual(out["prompt_tokens"], [72, 101, 108])
        pieces = []
        text = roundpipe.generate(model, prompt="Hello", max_tokens=8, on_text=pieces.append)
        want = cli("generate", model, "--prompt", "Hello", "--max-tokens", "8", raw=True)
        self.assertTrue(want.endswith(b"\n"))
        self.assertEqual(text["text_bytes"], want[:-1])
        self.assertEqual(text["text"], want[:-1].decode("utf-8", "replace"))
        self.assertEqual("".join(pieces), text["text"])
        self.assertGreater(len(text["tokens"]), 0)
        with self.assertRaisesRegex(ValueError, "give one of"):
            roundpipe.generate(model)
        with self.assertRaisesRegex(ValueError, "token|vocab|id"):
            roundpipe.generate(model, tokens=[100000])

    def test_ctrl_c_during_generate_raises_keyboard_interrupt_between_tokens(self):
        # the default job's model (scripts/setup.sh downloads it): 400 tokens take ~25 s on two
        # cores, so a Ctrl-C that waited for the end of the generation would show
        model = os.path.join(SRC, "assets", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.isfile(model):
            self.skipTest("no %s (scripts/setup.sh downloads it)" % model)
        for prompt in ({"prompt": "In the beginning", "stop": ["zzzzqq"]}, {"tokens": [1, 504, 3260]}):
            # the model loads before the first token, and a Ctrl-C is seen only from then on: what
            # one token takes, load included, measured here (a busy machine, e.g. the test suite's
            # other tests beside this one, can make loading alone take several seconds)
            t0 = time.monotonic()
            roundpipe.generate(model, max_tokens=1, dtype="f32", **prompt)
            one_token = time.monotonic() - t0
            timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            try:
                with self.assertRaises(KeyboardInterrupt):
                    roundpipe.generate(model, max_tokens=400, dtype="f32", **prompt)
                    time.sleep(5)  # a generation that ended first: the signal comes here instead
            finally:
                timer.cancel()
            took = time.monotonic() - t0
            # a Ctrl-C that waited for the end of the generation would come ~25 s after the first token
            self.assertLess(took, 1.5 * one_token + 3.0,
                            "%s: KeyboardInterrupt came %.1f s after the call, 1 s after Ctrl-C (one token: %.1f s)"
                            % (list(prompt)[0], took, one_token))

    def test_version_names_the_build(self):
        self.assertIn("roundpipe " + roundpipe.__version__, roundpipe.version())
        # the commit is the one each build was configured at (an installed package may be newer)
        same = lambda text: [l for l in text.splitlines() if not l.startswith("commit: ")]
        self.assertEqual(same(roundpipe.version()), same(cli("--version")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
