// The model card (trainer/model_card.hpp): its front matter and facts, the ownership line that
// lets a later save replace only an unedited card of ours, and a user's README.md kept as it is.
#include <gtest/gtest.h>

#include <fstream>

#include "base/output_folder.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/model_card.hpp"

namespace {

using namespace rp::clitest;

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

rp::ModelCardFacts facts(const rp::TrainSpec& spec) {
  rp::ModelCardFacts f;
  f.kind = rp::ModelCardFacts::Kind::adapter;
  f.folder = "runs/x/final";
  f.base = {"HuggingFaceTB/SmolLM2-135M", "/models/smol.gguf", "base_model_id"};
  f.spec = &spec;
  f.steps_done = 20;
  f.epochs = 0.5;
  f.train_sequences = 160;
  f.train_loss = 0.8231;
  f.eval_loss = 2.25;
  f.eval_step = 20;
  f.version = "9.9.9";
  return f;
}

TEST(ModelCard, NamesTheBaseDataHyperparametersAndLosses) {
  auto d = tmpdir();
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n");
  rp::TrainSpec spec;
  spec.data = (d / "data.jsonl").string();
  spec.steps = 20;
  spec.adam.lr = 2e-3;
  spec.lr_schedule.kind = "cosine";
  spec.lr_schedule.warmup_steps = 3;
  rp::LoraConfig l;
  l.r = 16;
  l.alpha = 32;
  l.target_modules = {"q_proj", "v_proj"};
  spec.lora = l;
  const std::string card = rp::model_card_text(facts(spec));
  EXPECT_EQ(card.rfind("---\nlibrary_name: peft\nbase_model: \"HuggingFaceTB/SmolLM2-135M\"\n", 0), 0u)
      << card;
  for (const char* want :
       {"- lora\n", "`/models/smol.gguf`", "(18 bytes)", "lr 0.002", "cosine, warmup 3 steps",
        "rank 16, alpha 32", "targets [q_proj, v_proj]", "| train (step 20) | 0.8231 |",
        "| eval (after step 20) | 2.2500 (perplexity 9.49) |", "RoundPipe C++ 9.9.9",
        "steps: 20 of 20 (0.5 epochs of 160 training sequences)"})
    EXPECT_NE(card.find(want), std::string::npos) << want << "\n" << card;
  EXPECT_EQ(card.find("http"), std::string::npos) << "the card links outside: " << card;
  // no id known: no base_model key (the hub needs an id there), the local file still named
  rp::ModelCardFacts f = facts(spec);
  f.base = {"", "/models/smol.gguf", ""};
  f.kind = rp::ModelCardFacts::Kind::full;
  spec.lora.reset();
  const std::string full = rp::model_card_text(f);
  EXPECT_EQ(full.find("base_model:"), std::string::npos) << full;
  EXPECT_NE(full.find("library_name: transformers"), std::string::npos) << full;
  EXPECT_NE(full.find("full fine-tuning"), std::string::npos) << full;
  fs::remove_all(d);
}

// The card says what ran: the backend "auto" resolved to, and f32 compute on the CPU backend
// (it computes in f32 whatever compute_dtype says; the card said "compute bf16").
TEST(ModelCard, NamesTheBackendThatRanAndItsComputeDtype) {
  rp::TrainSpec spec;
  spec.data = "data.jsonl";
  spec.backend = "auto";
  rp::ModelCardFacts f = facts(spec);
  f.backend = "cpu";
  const std::string cpu = rp::model_card_text(f);
  EXPECT_NE(cpu.find("(cpu backend)"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("- precision: compute f32, weights saved as bf16"), std::string::npos) << cpu;
  f.backend = "cuda";
  const std::string cuda = rp::model_card_text(f);
  EXPECT_NE(cuda.find("(cuda backend)"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("- precision: compute bf16"), std::string::npos) << cuda;
  // a run's own card
  TinyRun t = tiny_run();
  ASSERT_EQ(roundpipe("train " + t.spec.string(), t.d).code, 0);
  const std::string run = read(t.d / "run/final/README.md");
  EXPECT_NE(run.find("(cpu backend)"), std::string::npos) << run;
  EXPECT_NE(run.find("- precision: compute f32,"), std::string::npos) << run;
  fs::remove_all(t.d);
}

TEST(ModelCard, OnlyAnUneditedCardOfOursIsReplaced) {
  auto d = tmpdir();
  rp::TrainSpec spec;
  spec.data = "data.jsonl";
  const std::string card = rp::model_card_text(facts(spec));
  fs::create_directories(d / "old");
  fs::create_directories(d / "new1");
  // no README yet: ours is written
  EXPECT_TRUE(rp::place_model_card((d / "new1").string(), (d / "old").string(), card));
  EXPECT_EQ(read(d / "new1/README.md"), card);
  EXPECT_TRUE(rp::is_roundpipe_model_card((d / "new1/README.md").string()));
  // an unedited card of ours (its folder's manifest lists it as it is) is replaced
  write(d / "old/README.md", card);
  rp::write_manifest((d / "old").string(), "train");
  fs::create_directories(d / "new2");
  EXPECT_TRUE(rp::place_model_card((d / "new2").string(), (d / "old").string(), card + "x"));
  EXPECT_EQ(read(d / "new2/README.md"), card + "x");
  // an edited card, a user's own README, or any README no manifest proves ours is not written
  // over: the card is left out (replace_folder keeps the user's file, unlisted)
  for (const std::string& user :
       {card.substr(0, 10) + "my words" + card.substr(10), std::string("# my model\n")}) {
    write(d / "old/README.md", user);
    EXPECT_FALSE(rp::is_roundpipe_model_card((d / "old/README.md").string()));
    fs::remove_all(d / "new3");
    fs::create_directories(d / "new3");
    EXPECT_FALSE(rp::place_model_card((d / "new3").string(), (d / "old").string(), card));
    EXPECT_FALSE(fs::exists(d / "new3/README.md"));
  }
  fs::remove(d / "old" / rp::kManifestFile);
  write(d / "old/README.md", card);
  fs::remove_all(d / "new3");
  fs::create_directories(d / "new3");
  EXPECT_FALSE(rp::place_model_card((d / "new3").string(), (d / "old").string(), card));
  fs::remove_all(d);
}

}  // namespace
