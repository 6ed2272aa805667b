// Training with rp::Trainer from C++: a spec built in code, callbacks for progress,
// checkpoints and an evaluation point between steps, a stop requested through a StopToken
// (as a signal handler or another thread would), and resuming from the checkpoint the stop
// left behind.
//
//   trainer_example MODEL DATA OUT_DIR [STEPS]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <roundpipe/roundpipe.hpp>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL(.gguf|dir) DATA(.jsonl|.txt) OUT_DIR [STEPS]\n", argv[0]);
    return 2;
  }
  try {
    rp::TrainSpec spec;  // the keys of a JSON spec (docs/spec.md), here in code
    spec.model = argv[1];
    spec.data = argv[2];
    spec.output_dir = argv[3];
    spec.steps = argc > 4 ? std::atoll(argv[4]) : 6;
    spec.seq_len = 32;
    spec.sequences_per_step = 4;
    spec.micro_batches = 2;
    spec.backend = "cpu";
    spec.workers = 2;
    spec.save_dtype = "f32";
    spec.adam.lr = 1e-3;
    spec.lr_schedule.kind = "cosine";
    spec.lr_schedule.lr = spec.adam.lr;
    spec.lr_schedule.warmup_steps = 1;
    spec.lr_schedule.total_steps = spec.steps;

    rp::StopToken stop;
    bool stop_halfway = true;
    rp::TrainerCallbacks cb;
    cb.on_step = [&](const rp::StepReport& r) {
      std::printf("step %lld/%lld loss %.6f lr %.3e %.0f tokens/s\n", static_cast<long long>(r.step),
                  static_cast<long long>(r.total_steps), r.loss, r.lr, r.tokens_per_s);
      if (stop_halfway && r.step == r.total_steps / 2) stop.request_stop();  // e.g. from a SIGINT handler
    };
    cb.on_checkpoint = [](const rp::CheckpointReport& c) {
      std::printf("checkpoint %s (%lld steps)\n", c.dir.c_str(), static_cast<long long>(c.step));
    };
    cb.eval_every = 2;  // the program's own evaluation, between steps: here the weights' norm
    cb.on_eval = [](const rp::EvalContext& e) {
      double sum = 0;
      for (const auto& g : e.weights)
        for (float x : g) sum += double(x) * x;
      std::printf("eval after step %lld: weight norm %.6f\n", static_cast<long long>(e.step), std::sqrt(sum));
    };

    const rp::TrainResult first = rp::Trainer(spec).run(cb, stop);
    if (first.stopped) {
      std::printf("stopped after %lld steps; resuming from %s\n", static_cast<long long>(first.steps_done),
                  first.checkpoint.c_str());
      stop_halfway = false;
      spec.resume_from = first.checkpoint;
      rp::Trainer(spec).run(cb);  // a fresh StopToken: runs to the end
    }
    std::printf("done: %s/final\n", spec.output_dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_example: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
