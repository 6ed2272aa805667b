// Data inputs that cannot train are refused with their line, and packing checks its size
// before it allocates: an example with nothing to predict, and a seq_len whose padded
// sequences would not fit the memory given.
#include <gtest/gtest.h>

#include "common.hpp"
#include "data/dataset.hpp"
#include "data/tokenizer.hpp"

using namespace rp;
using rp::test::qwen;
using rp::test::TempDir;

TEST(DataLimits, EmptyPromptAndCompletionIsRefusedWithItsLine) {
  TempDir dir;
  const std::string path = dir.write(
      "data.jsonl", "{\"prompt\":\"a\",\"completion\":\"b\"}\n{\"prompt\":\"\",\"completion\":\"\"}\n");
  try {
    load_json_records(path, qwen(), ChatTemplate::chatml);
    FAIL() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ":2: \"prompt\" and \"completion\" are both empty (nothing to train on)");
  }
  // one of them empty still trains: the completion (or the eos after the prompt) is predicted
  const std::string ok = dir.write(
      "ok.jsonl", "{\"prompt\":\"\",\"completion\":\"b\"}\n{\"prompt\":\"a\",\"completion\":\"\"}\n");
  const Dataset d = load_json_records(ok, qwen(), ChatTemplate::chatml);
  EXPECT_EQ(pack_sequences(d, 8, 0).size(), 2);
}

TEST(DataLimits, PackingChecksItsBytesBeforeAllocating) {
  Dataset d;
  for (int i = 0; i < 3; ++i) d.examples.push_back({{1, 2, 3, 4}, {0, 0, 1, 1}});
  d.examples.push_back({{1, 2}, {0, 0}});  // no target: dropped, not counted
  for (int i = 0; i < 21; ++i) d.text_stream.push_back(5 + i);
  // 3 examples + ceil(20 / 8) = 3 windows of 8 tokens, 8 bytes per token
  const PackedSequences p = pack_sequences(d, 8, 0, false, 6 * 8 * 8);
  EXPECT_EQ(p.size(), 6);
  EXPECT_EQ(p.dropped_examples, 1u);
  try {
    pack_sequences(d, 8, 0, false, 6 * 8 * 8 - 1);
    FAIL() << "accepted";
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("packing 6 sequences of 8 tokens"), std::string::npos) << e.what();
  }
  // seq_len 5e7 on four sequences: refused at once instead of allocating 1.6 GB per sequence
  EXPECT_THROW(pack_sequences(d, 50000000, 0, false, size_t(1) << 30), std::length_error);
  // a product past size_t: refused whatever the limit
  EXPECT_THROW(pack_sequences(d, int64_t(1) << 62, 0, false, 0), std::length_error);
}
