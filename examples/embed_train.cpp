// Embedding RoundPipe in a C++ program: load a model, wrap it in a Session and drive
// forward_backward / step from our own loop, then save a Hugging Face checkpoint.
//
//   build/examples/embed_train assets/SmolLM2-135M-Instruct.Q4_1.gguf assets/kjv_instruct.jsonl 5
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "data/dataset.hpp"
#include "data/tokenizer.hpp"
#include "model/checkpoint.hpp"
#include "roundpipe/session.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL(.gguf|dir) DATA(.jsonl|.txt) [STEPS] [OUT_DIR]\n", argv[0]);
    return 2;
  }
  try {
    const int steps = argc > 3 ? std::atoi(argv[3]) : 5;
    rp::LoadedModel lm = rp::load_model(argv[1]);
    rp::ModelLayout layout = rp::make_layout(lm.config);
    std::vector<std::vector<float>> weights;
    rp::fill_groups(lm, layout, weights);

    rp::Tokenizer tok = rp::Tokenizer::from_json(lm.tokenizer_json, argv[1]);
    if (lm.config.eos_token_id >= 0) tok.set_eos_id(int32_t(lm.config.eos_token_id));
    rp::ChatTemplate chat = lm.chat_template.empty() ? rp::ChatTemplate::chatml
                                                     : rp::detect_chat_template(lm.chat_template);
    rp::BatchStream data(rp::pack_sequences(rp::load_dataset(argv[2], tok, chat), 64, tok.eos_id()), 1);

    rp::SessionOptions opt;
    opt.workers = 2;            // two virtual GPUs (CPU backend)
    opt.micro_batches = 2;      // M micro-batches per pass
    opt.micro = {1, 64};        // one sequence of 64 tokens per micro-batch
    opt.adam.lr = 5e-5;
    rp::Session session(layout, std::move(weights), opt);

    for (int t = 0; t < steps; ++t) {
      rp::TokenBatch b = data.next(opt.micro_batches * opt.micro.n_seq);
      session.forward_backward(b.ids, b.targets);
      session.step(opt.adam.lr);
      if (t > 0) {  // results arrive one step behind: the next pass is already running
        rp::StepResult r = session.wait(t - 1);
        std::printf("step %d loss %.4f\n", t, r.loss_sum / r.tokens);
      }
    }
    rp::StepResult last = session.wait(steps - 1);
    std::printf("step %d loss %.4f\n", steps, last.loss_sum / last.tokens);
    session.synchronize();
    if (argc > 4) {
      std::vector<const float*> ptrs;
      for (auto& g : session.master_weights()) ptrs.push_back(g.data());
      rp::save_hf_checkpoint(argv[4], layout, ptrs, lm.tokenizer_json, lm.chat_template, rp::DType::bf16);
      std::printf("saved %s\n", argv[4]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
