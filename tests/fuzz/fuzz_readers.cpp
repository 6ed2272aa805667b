// A mutation fuzzer over every reader of user files: GGUF, safetensors, config.json, experiment
// specs, JSONL, Parquet and Arrow IPC data, optimizer.bin and trainer_state.json. Each target starts from a
// valid seed file written here, mutates it (bit flips, interesting integers and numbers, inserted, deleted,
// duplicated and truncated ranges) and feeds it to the reader. A reader may accept the input or throw a
// std::exception; anything else is a failure: a crash or a sanitizer report (CI builds this program with
// AddressSanitizer and UBSan, scripts/fuzz.sh), a case running longer than --timeout-s (a hang: the program
// reports the case and exits 1), or an allocation beyond the sanitizer's limit (unbounded: ASAN_OPTIONS
// max_allocation_size_mb). The cases are deterministic in --seed, so a failure reproduces with --only and
// --from.
//
//   fuzz_readers [--cases N] [--seed S] [--timeout-s T] [--only TARGET] [--from K] [--work DIR]
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/arrow_records.hpp"
#include "data/dataset.hpp"
#include "data/tokenizer.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/optimizer_state.hpp"
#include "formats/safetensors.hpp"
#include "model/config.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/spec.hpp"
#include "tests/formats/test_io_util.hpp"
#include "trainer/trainer_state.hpp"

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

/// The longest error a refused input may print: whole messages are capped at 1,000 bytes and
/// quotes of the input at 80 (base/error_text.hpp); the rest is the file's path and the text.
constexpr size_t kMaxErrorBytes = 1500;

// ---- the case being run, for the hang report --------------------------------------------
const char* g_target = "";
long g_case = 0;
void on_alarm(int) {
  char msg[256];
  const int n = std::snprintf(
      msg, sizeof msg, "fuzz_readers: HANG: target %s case %ld ran past the time limit\n", g_target, g_case);
  [[maybe_unused]] auto w = ::write(2, msg, size_t(n));
  ::_exit(1);
}

Bytes read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
void write_file(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

// ---- mutations -------------------------------------------------------------------------
const uint64_t kInteresting[] = {0,
                                 1,
                                 2,
                                 0x7f,
                                 0x80,
                                 0xff,
                                 0x7fff,
                                 0x8000,
                                 0xffff,
                                 0x7fffffff,
                                 0x80000000,
                                 0xffffffff,
                                 0x100000000,
                                 1ull << 40,
                                 1ull << 62,
                                 0x7fffffffffffffffull,
                                 0x8000000000000000ull,
                                 0xffffffffffffffffull};
const char* kNumbers[] = {"0",
                          "-1",
                          "1",
                          "4294967295",
                          "4294967296",
                          "9223372036854775807",
                          "-9223372036854775808",
                          "18446744073709551615",
                          "1e300",
                          "-1e300",
                          "1e-300",
                          "0.5",
                          "NaN",
                          "null",
                          "true",
                          "\"x\"",
                          "[]",
                          "{}",
                          "4611686018427387904",
                          "2147483648"};

/// One random mutation of `b` (text inputs also get JSON-aware number replacements).
void mutate(Bytes& b, std::mt19937_64& rng, bool text) {
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  switch (rng() % (text ? 9 : 7)) {
    case 0:  // bit flips
      for (int k = 0, n = 1 + int(rng() % 4); k < n && !b.empty(); ++k)
        b[pick(b.size())] ^= uint8_t(1u << (rng() % 8));
      break;
    case 1:  // a random byte
      if (!b.empty()) b[pick(b.size())] = uint8_t(rng());
      break;
    case 2: {  // an interesting integer of 1, 2, 4 or 8 bytes, little-endian
      const size_t w = size_t(1) << (rng() % 4);
      if (b.size() < w) break;
      const uint64_t v = kInteresting[pick(std::size(kInteresting))];
      std::memcpy(&b[pick(b.size() - w + 1)], &v, w);
      break;
    }
    case 3: {  // delete a range
      if (b.empty()) break;
      const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(64, b.size() - at));
      b.erase(b.begin() + long(at), b.begin() + long(std::min(b.size(), at + n)));
      break;
    }
    case 4: {  // insert random bytes
      const size_t at = pick(b.size() + 1), n = 1 + pick(16);
      Bytes ins(n);
      for (auto& x : ins) x = uint8_t(rng());
      b.insert(b.begin() + long(at), ins.begin(), ins.end());
      break;
    }
    case 5: {  // duplicate a range
      if (b.empty()) break;
      const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(256, b.size() - at));
      Bytes chunk(b.begin() + long(at), b.begin() + long(at + n));
      b.insert(b.begin() + long(pick(b.size() + 1)), chunk.begin(), chunk.end());
      break;
    }
    case 6:  // truncate
      b.resize(pick(b.size() + 1));
      break;
    default: {  // text: replace a number (or a literal) with an interesting one
      std::vector<std::pair<size_t, size_t>> spans;
      for (size_t i = 0; i < b.size();) {
        if (std::isdigit(b[i]) || b[i] == '-') {
          size_t j = i + 1;
          while (j < b.size() && (std::isdigit(b[j]) || b[j] == '.' || b[j] == 'e' || b[j] == 'E' ||
                                  b[j] == '-' || b[j] == '+'))
            ++j;
          spans.push_back({i, j});
          i = j;
        } else {
          ++i;
        }
      }
      if (spans.empty()) break;
      auto [a, e] = spans[pick(spans.size())];
      const std::string n = kNumbers[pick(std::size(kNumbers))];
      b.erase(b.begin() + long(a), b.begin() + long(e));
      b.insert(b.begin() + long(a), n.begin(), n.end());
    }
  }
}

// ---- seeds -------------------------------------------------------------------------------
rp::ModelConfig tiny_config() {
  rp::ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.tie_word_embeddings = true;
  c.eos_token_id = 0;
  return c;
}

Bytes gguf_seed() {
  rp::test::GgufBuilder g;
  g.str("general.architecture", "llama");
  g.u32("llama.block_count", 1);
  g.u32("llama.embedding_length", 16);
  g.u32("llama.feed_forward_length", 32);
  g.u32("llama.attention.head_count", 2);
  g.u32("llama.attention.head_count_kv", 1);
  g.f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  g.u32("tokenizer.ggml.eos_token_id", 0);
  g.str("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> toks;
  toks = {"t", "t1", "tt1"};  // the merge "t t1" -> "tt1"
  for (int i = 3; i < 40; ++i) toks.push_back("x" + std::to_string(i));
  g.str_array("tokenizer.ggml.tokens", toks);
  g.str_array("tokenizer.ggml.merges", {"t t1"});
  auto f32 = [&](const std::string& n, std::vector<uint64_t> ne) {
    uint64_t k = 1;
    for (auto d : ne) k *= d;
    g.tensor_f32(n, ne, rp::test::random_values(size_t(k), uint32_t(k)));
  };
  f32("token_embd.weight", {16, 40});
  f32("blk.0.attn_norm.weight", {16});
  f32("blk.0.attn_q.weight", {16, 16});
  f32("blk.0.attn_k.weight", {16, 8});
  f32("blk.0.attn_v.weight", {16, 8});
  f32("blk.0.attn_output.weight", {16, 16});
  f32("blk.0.ffn_norm.weight", {16});
  f32("blk.0.ffn_gate.weight", {16, 32});
  f32("blk.0.ffn_up.weight", {16, 32});
  // one quantized tensor (Q4_0: 32 weights in 18 bytes, one block per row) exercises the dequantizer
  g.tensor("blk.0.ffn_down.weight", {32, 16}, 2, std::vector<uint8_t>(16 * 18, 0x35));
  f32("output_norm.weight", {16});
  return g.build();
}

/// A checkpoint folder of the tiny model (config.json, model.safetensors, tokenizer.json).
void write_model_dir(const fs::path& dir) {
  const rp::ModelLayout m = rp::make_layout(tiny_config());
  std::vector<std::vector<float>> w;
  for (auto& g : m.groups) w.push_back(rp::test::random_values(size_t(g.numel), 5));
  std::vector<const float*> ptrs;
  for (auto& g : w) ptrs.push_back(g.data());
  rp::save_hf_checkpoint(dir.string(), m, ptrs, nlohmann::json(), "", rp::DType::bf16);
}

Bytes optimizer_state_seed(const fs::path& work) {
  const rp::ModelLayout m = rp::make_layout(tiny_config());
  std::vector<rp::AdamWState> adam(m.groups.size());
  std::vector<std::vector<float>> master;
  rp::AdamWOptions o;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    master.push_back(rp::test::random_values(size_t(m.groups[g].numel), 9));
    std::vector<float> grad(master.back().size(), 0.01f);
    rp::adamw_update(master.back().data(), adam[g], grad.data(), int64_t(grad.size()), 1.f, o, 1e-3);
  }
  rp::LossScaler scaler;
  rp::OptimizerStateView v;
  v.header.steps = 1;
  v.header.async = false;
  v.header.has_master = true;
  v.header.has_scaler = true;
  v.header.loss_scales = {65536.f};
  v.layout = &m;
  v.adam = &adam;
  v.adam_options = &o;
  v.master = &master;
  v.scaler = &scaler;
  const fs::path p = work / "seed_optimizer.bin";
  rp::write_optimizer_state(p.string(), v);
  return read_file(p);
}

// ---- readers -----------------------------------------------------------------------------
void read_optimizer_state(const std::string& path) {
  const rp::ModelLayout m = rp::make_layout(tiny_config());
  rp::OptimizerStateReader r(path);
  r.check_groups(m);
  std::vector<float> buf;
  for (const auto& g : m.groups) {
    rp::AdamWState st;
    rp::AdamWOptions o;
    r.read_adam(g, st, o);
    buf.resize(size_t(g.numel));
    if (r.header().has_master) r.read_master(g, buf.data());
    if (r.header().has_lowp) r.read_lowp(g, nullptr, rp::DType::f32);
  }
  rp::LossScaler s;
  if (r.header().has_scaler) r.read_scaler(s);
  r.finish();
}

struct Target {
  const char* name;
  bool text;
  std::string file;  // the mutated file's name in the case folder
  std::function<Bytes()> seed;
  std::function<void(const fs::path& dir)> prepare;  // other files of the case folder
  std::function<void(const fs::path& file)> read;
};

}  // namespace

/// A PEFT adapter folder read (roundpipe/adapter.hpp) and merged onto the fixture's base model.
static void read_and_merge_adapter(const fs::path& dir, const std::string& fixtures) {
  const rp::PeftAdapter a = rp::read_peft_adapter(dir.string());
  rp::LoadedModel m = rp::load_model(fixtures + "/peft/base_untied");
  rp::merge_peft_adapter(m, a);
}

int main(int argc, char** argv) {
  long cases = 200, from = 0;
  uint64_t seed = 1;
  unsigned timeout_s = 20;
  std::string only;
  fs::path work = fs::temp_directory_path() / ("rp_fuzz_" + std::to_string(::getpid()));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fuzz_readers: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--cases") cases = std::stol(next());
      else if (a == "--seed") seed = std::stoull(next());
      else if (a == "--timeout-s") timeout_s = unsigned(std::stoul(next()));
      else if (a == "--only") only = next();
      else if (a == "--from") from = std::stol(next());
      else if (a == "--work") work = next();
      else {
        std::fprintf(stderr,
                     "usage: fuzz_readers [--cases N] [--seed S] [--timeout-s T] [--only TARGET] [--from K] "
                     "[--work DIR]\n");
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "fuzz_readers: %s: not a number\n", a.c_str());
      return 2;
    }
  }
  fs::create_directories(work);
  const std::string fixtures = RP_FIXTURES_DIR;
  const rp::Tokenizer tok = rp::Tokenizer::from_file(fixtures + "/smollm2-tokenizer/tokenizer.json");
  write_model_dir(work / "model_seed");
  rp::TrainerState ts;
  ts.step = 3;
  ts.data_position = 12;
  ts.sequences_per_step = 4;
  ts.seq_len = 128;
  ts.save_dtype = "bf16";
  ts.compute_dtype = "bf16";
  ts.lr_schedule = {
      {"kind", "cosine"}, {"lr", 1e-4}, {"min_lr", 0.0}, {"warmup_steps", 0}, {"total_steps", 20}};
  rp::write_trainer_state((work / "seed_trainer_state.json").string(), ts);

  std::vector<Target> targets = {
      {"gguf",
       false,
       "model.gguf",
       gguf_seed,
       {},
       [](const fs::path& f) {
         rp::LoadedModel m = rp::load_model(f.string());
         if (!m.tokenizer_json.is_null()) (void)rp::Tokenizer::from_json(m.tokenizer_json, "fuzz");
       }},
      // Qwen3-MoE: stacked Q8_0 expert tensors split into per-expert matrices
      {"gguf_moe",
       false,
       "model.gguf",
       [] { return read_file(fs::path(RP_FIXTURES_DIR) / "gguf_moe/tiny_qwen3_moe.q8_0.gguf"); },
       {},
       [](const fs::path& f) { rp::load_model(f.string()); }},
      // GPT-OSS: MXFP4 expert stacks with llama.cpp's fused gate/up, sliced per expert
      {"gguf_gpt_oss",
       false,
       "model.gguf",
       [] { return read_file(fs::path(RP_FIXTURES_DIR) / "gguf_gpt_oss/tiny_gpt_oss.mxfp4_fused.gguf"); },
       {},
       [](const fs::path& f) { rp::load_model(f.string()); }},
      // GPT-OSS checkpoint: MXFP4 _blocks / _scales and interleaved biases, sliced per expert
      {"safetensors_gpt_oss", false, "model.safetensors",
       [] {
         return read_file(fs::path(RP_FIXTURES_DIR) / "hf_gpt_oss/tiny_gpt_oss_mxfp4/model.safetensors");
       },
       [](const fs::path& dir) {
         fs::copy_file(fs::path(RP_FIXTURES_DIR) / "hf_gpt_oss/tiny_gpt_oss_mxfp4/config.json",
                       dir / "config.json");
       },
       [](const fs::path& f) { rp::load_model(f.parent_path().string()); }},
      {"safetensors", false, "model.safetensors",
       [&] { return read_file(work / "model_seed/model.safetensors"); },
       [&](const fs::path& dir) { fs::copy_file(work / "model_seed/config.json", dir / "config.json"); },
       [](const fs::path& f) { rp::load_model(f.parent_path().string()); }},
      {"config", true, "config.json", [&] { return read_file(work / "model_seed/config.json"); },
       [&](const fs::path& dir) {
         fs::copy_file(work / "model_seed/model.safetensors", dir / "model.safetensors");
       },
       [](const fs::path& f) { rp::load_model(f.parent_path().string()); }},
      {"spec",
       true,
       "spec.json",
       [&] { return read_file(fs::path(RP_SOURCE_DIR) / "examples/specs/default.json"); },
       {},
       [](const fs::path& f) { rp::validate_spec(rp::load_spec(f.string())); }},
      {"jsonl",
       true,
       "data.jsonl",
       [] {
         return bytes_of(
             "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
             "{\"prompt\": \"Recite Genesis 1:2\", \"completion\": \" And the earth was without form, and "
             "void.\"}\n"
             "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
             "\"content\": "
             "\"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello.\"}]}\n");
       },
       {},
       [&](const fs::path& f) {
         rp::Dataset d = rp::load_json_records(f.string(), tok, rp::ChatTemplate::smollm2);
         rp::PackedSequences p = rp::pack_sequences(d, 16, 0, size_t(1) << 28);
         if (p.size() > 0) rp::BatchStream(std::move(p), 1).next(3);
       }},
      {"optimizer_state",
       false,
       "optimizer.bin",
       [&] { return optimizer_state_seed(work); },
       {},
       [](const fs::path& f) { read_optimizer_state(f.string()); }},
      {"adapter_config", true, "adapter_config.json",
       [&] { return read_file(fs::path(fixtures) / "peft/untied_all/adapter/adapter_config.json"); },
       [&](const fs::path& dir) {
         fs::copy_file(fs::path(fixtures) / "peft/untied_all/adapter/adapter_model.safetensors",
                       dir / "adapter_model.safetensors");
       },
       [&](const fs::path& f) { read_and_merge_adapter(f.parent_path(), fixtures); }},
      {"adapter_weights", false, "adapter_model.safetensors",
       [&] { return read_file(fs::path(fixtures) / "peft/untied_all/adapter/adapter_model.safetensors"); },
       [&](const fs::path& dir) {
         fs::copy_file(fs::path(fixtures) / "peft/untied_all/adapter/adapter_config.json",
                       dir / "adapter_config.json");
       },
       [&](const fs::path& f) { read_and_merge_adapter(f.parent_path(), fixtures); }},
      {"trainer_state",
       true,
       "trainer_state.json",
       [&] { return read_file(work / "seed_trainer_state.json"); },
       {},
       [](const fs::path& f) { rp::read_trainer_state(f.string()); }},
  };
  // Parquet and Arrow IPC data (Arrow C++'s readers and the row-to-record mapping), when this
  // build reads them: pyarrow-written seeds with messages as list<struct>
  if (rp::arrow_input_built())
    for (const char* name : {"chat.parquet", "chat.arrow", "chat.arrows"})
      targets.push_back({name,
                         false,
                         std::string("data") + fs::path(name).extension().string(),
                         [name, &fixtures] { return read_file(fs::path(fixtures) / "columnar" / name); },
                         {},
                         [&](const fs::path& f) {
                           rp::Dataset d = rp::load_dataset(f.string(), tok, rp::ChatTemplate::smollm2);
                           rp::PackedSequences p = rp::pack_sequences(d, 16, 0, size_t(1) << 28);
                           if (p.size() > 0) rp::BatchStream(std::move(p), 1).next(3);
                         }});

  ::signal(SIGALRM, on_alarm);
  long total = 0, accepted = 0, refused = 0;
  for (const Target& t : targets) {
    if (!only.empty() && only != t.name) continue;
    g_target = t.name;
    const Bytes base = t.seed();
    // the seed itself must be accepted: a reader that refuses valid input is broken too
    const fs::path dir = work / t.name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    if (t.prepare) t.prepare(dir);
    write_file(dir / t.file, base);
    try {
      t.read(dir / t.file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_readers: the valid seed of %s is refused: %s\n", t.name, e.what());
      return 1;
    }
    long ok = 0, bad = 0;
    for (long k = from; k < from + cases; ++k) {
      g_case = k;
      std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(k) * 7919 +
                          std::hash<std::string>()(t.name));
      Bytes b = base;
      for (int m = 0, n = 1 + int(rng() % 4); m < n; ++m) mutate(b, rng, t.text);
      write_file(dir / t.file, b);
      ::alarm(timeout_s);
      try {
        t.read(dir / t.file);
        ++ok;
      } catch (const std::exception& e) {
        ++bad;
        if (std::strchr(e.what(), '\n')) {
          std::fprintf(stderr, "fuzz_readers: target %s case %ld: a multi-line error: %s\n", t.name, k,
                       e.what());
          return 1;
        }
        // what an error quotes of the input is bounded (base/error_text.hpp): a megabyte key or
        // value must not come back whole
        if (std::strlen(e.what()) > kMaxErrorBytes) {
          std::fprintf(stderr,
                       "fuzz_readers: target %s case %ld: an error of %zu bytes (at most %zu): %.300s...\n",
                       t.name, k, std::strlen(e.what()), kMaxErrorBytes, e.what());
          return 1;
        }
      }
      ::alarm(0);
    }
    std::printf("fuzz_readers: %-16s %ld cases: %ld accepted, %ld refused with one line\n", t.name, cases, ok,
                bad);
    total += cases;
    accepted += ok;
    refused += bad;
  }
  std::printf("fuzz_readers: %ld cases, %ld accepted, %ld refused, no crash, hang or unbounded allocation\n",
              total, accepted, refused);
  fs::remove_all(work);
  return 0;
}
