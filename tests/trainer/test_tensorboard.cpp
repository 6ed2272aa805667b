// TensorBoard event files: CRC-32C against published check values, the TFRecord framing and
// the Event protobuf bytes decoded independently here, and (when Python's tensorboard
// package is installed: pip install tensorboard) tensorboard's own EventAccumulator reading
// what a training run wrote.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "base/checksum.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/tensorboard.hpp"

namespace {
using namespace rp::clitest;

uint64_t le(const std::string& s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(uint8_t(s[at + i])) << (8 * i);
  return v;
}
uint32_t unmask(uint32_t m) {
  const uint32_t r = m - 0xa282ead8u;
  return (r << 15) | (r >> 17);
}
uint64_t varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int sh = 0;; sh += 7) {
    const uint8_t b = uint8_t(s[at++]);
    v |= uint64_t(b & 0x7F) << sh;
    if (!(b & 0x80)) return v;
  }
}
/// The fields of one protobuf message: field number -> raw bytes (length-delimited), or the
/// 8/4 bytes of fixed64/fixed32, or the varint's decimal text.
std::multimap<int, std::string> fields(const std::string& m) {
  std::multimap<int, std::string> out;
  for (size_t at = 0; at < m.size();) {
    const uint64_t key = varint(m, at);
    const int f = int(key >> 3), wt = int(key & 7);
    if (wt == 0) out.emplace(f, std::to_string(varint(m, at)));
    else if (wt == 1) out.emplace(f, m.substr(at, 8)), at += 8;
    else if (wt == 5) out.emplace(f, m.substr(at, 4)), at += 4;
    else if (wt == 2) {
      const size_t n = size_t(varint(m, at));
      out.emplace(f, m.substr(at, n));
      at += n;
    } else {
      ADD_FAILURE() << "wire type " << wt;
      break;
    }
  }
  return out;
}
}  // namespace

TEST(TensorBoard, Crc32cCheckValues) {
  EXPECT_EQ(rp::crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(rp::crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(rp::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(rp::crc32c("6789", 4, rp::crc32c("12345", 5)), 0xE3069283u);  // continued
}

TEST(TensorBoard, RecordFramingAndEventBytes) {
  const std::string ev = rp::scalar_event(1234.5, 77, "train/loss", 2.25f);
  const std::string rec = rp::tfrecord(ev);
  ASSERT_EQ(rec.size(), 8 + 4 + ev.size() + 4);
  EXPECT_EQ(le(rec, 0, 8), ev.size());
  EXPECT_EQ(unmask(uint32_t(le(rec, 8, 4))), rp::crc32c(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, ev.size()), ev);
  EXPECT_EQ(unmask(uint32_t(le(rec, 12 + ev.size(), 4))), rp::crc32c(ev.data(), ev.size()));
  // Event { wall_time = 1, step = 2, summary = 5 { value = 1 { tag = 1, simple_value = 2 } } }
  const auto e = fields(ev);
  double wt;
  std::memcpy(&wt, e.find(1)->second.data(), 8);
  EXPECT_EQ(wt, 1234.5);
  EXPECT_EQ(e.find(2)->second, "77");
  const auto v = fields(fields(e.find(5)->second).find(1)->second);
  EXPECT_EQ(v.find(1)->second, "train/loss");
  float x;
  std::memcpy(&x, v.find(2)->second.data(), 4);
  EXPECT_EQ(x, 2.25f);
  EXPECT_EQ(fields(rp::version_event(1.0)).find(3)->second, "brain.Event:2");
}

// A training run with evaluation writes loss, lr, tokens/s and eval scalars that
// tensorboard's EventAccumulator reads back with the values of metrics.csv.
TEST(TensorBoard, TensorboardReadsTheRunsEventFile) {
  if (std::system("python3 -c 'import tensorboard' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "Python's tensorboard package is not installed (pip install tensorboard): the pure C++ "
                    "framing test above still checks the bytes";
  auto d = tmpdir();
  write(d / "data.jsonl",
        "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
        "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n{\"text\": \"Let there be light.\"}\n");
  rp::TrainSpec s = rp::spec_from_json(
      nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", d / "run")), "test spec");
  s.steps = 3;
  s.eval_fraction = 0.5;
  std::vector<rp::StepReport> reports;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { reports.push_back(r); };
  rp::Trainer(s).run(cb);
  const std::string script = d.string() + "/read.py";
  write(script,
        "import json, sys\n"
        "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
        "ea = EventAccumulator(sys.argv[1]); ea.Reload()\n"
        "print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()['scalars']}))\n");
  const std::string cmd = "python3 " + script + " " + (d / "run/tensorboard").string() + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_TRUE(j.contains("train/loss")) << out;
  ASSERT_EQ(j["train/loss"].size(), 3u) << out;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["train/loss"][i][0], int64_t(i + 1));
    EXPECT_FLOAT_EQ(j["train/loss"][i][1].get<float>(), float(reports[i].loss));
    EXPECT_FLOAT_EQ(j["train/lr"][i][1].get<float>(), float(reports[i].lr));
    EXPECT_FLOAT_EQ(j["train/epoch"][i][1].get<float>(), float(reports[i].epoch));
  }
  EXPECT_EQ(j["train/tokens_per_s"].size(), 3u);
  ASSERT_TRUE(j.contains("eval/loss")) << out;
  EXPECT_FLOAT_EQ(j["eval/loss"].back()[1].get<float>(), float(reports.back().eval_loss));
  EXPECT_TRUE(j.contains("eval/perplexity"));
  EXPECT_FALSE(j.contains("train/mfu"));  // CPU backend
  fs::remove_all(d);
}
