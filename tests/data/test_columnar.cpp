// Parquet / Arrow IPC data files (data/arrow_records.hpp) against their JSON lines twins, and
// the refusal of other binary files (data/file_kind.hpp).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "common.hpp"
#include "data/arrow_records.hpp"
#include "data/chat_jinja.hpp"
#include "data/chat_template.hpp"
#include "data/dataset.hpp"
#include "data/file_kind.hpp"
#include "data/sequence_packer.hpp"
#include "data/tokenizer.hpp"

using namespace rp;
using rp::test::fixture;
using rp::test::qwen;
using rp::test::read_file;
using rp::test::TempDir;

namespace {
// The fixtures' pyarrow twins: IPC file (Feather v2) and stream formats, and Parquet.
const char* const kTwins[] = {".parquet", ".arrow", ".arrows"};

ChatFormat qwen3_jinja() {
  return ChatFormat(std::make_shared<const JinjaChat>(
      read_file(fixture("chat_templates/Qwen-Qwen3-0.6B.jinja")), "", "<|im_end|>"));
}

std::string columnar(const std::string& name) { return fixture("columnar/" + name); }

std::string load_error(const std::string& path, const ChatFormat& chat = ChatTemplate::chatml) {
  try {
    load_dataset(path, qwen(), chat);
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "<no exception>";
}

void expect_same(const Dataset& a, const Dataset& b, const std::string& what) {
  ASSERT_EQ(a.examples.size(), b.examples.size()) << what;
  for (size_t i = 0; i < a.examples.size(); ++i) {
    EXPECT_EQ(a.examples[i].ids, b.examples[i].ids) << what << " example " << i;
    EXPECT_EQ(a.examples[i].loss_mask, b.examples[i].loss_mask) << what << " example " << i;
  }
  EXPECT_EQ(a.text_stream, b.text_stream) << what;
  EXPECT_EQ(a.num_documents, b.num_documents) << what;
}

#define SKIP_WITHOUT_ARROW() \
  if (!arrow_input_built())  \
  GTEST_SKIP() << "this build has no Arrow C++ (run scripts/setup.sh, or configure with -DRP_ARROW_DIR)"
}  // namespace

TEST(Columnar, FormatsAreToldByTheirMagic) {
  EXPECT_EQ(columnar_format_of(read_file(columnar("text.parquet"))), ColumnarFormat::parquet);
  EXPECT_EQ(columnar_format_of(read_file(columnar("text.arrow"))), ColumnarFormat::arrow_file);
  EXPECT_EQ(columnar_format_of(read_file(columnar("text.arrows"))), ColumnarFormat::arrow_stream);
  EXPECT_EQ(columnar_format_of(read_file(columnar("text.jsonl"))), ColumnarFormat::none);
  EXPECT_EQ(columnar_format_of(std::string("\xFF\xFF\xFF\xFF\0\0\0\0", 8)), ColumnarFormat::none);
  EXPECT_EQ(columnar_format_of("PAR"), ColumnarFormat::none);
}

// The same rows from JSON lines and from pyarrow's Parquet / IPC files give the same token ids
// and loss masks: plain text, prompt/completion, chat, and tool calls through the model's own
// template (messages as list<struct>, tool-call arguments and the tools' schemas as structs).
TEST(Columnar, SameRowsAsJsonLinesGiveTheSameTokens) {
  SKIP_WITHOUT_ARROW();
  const ChatFormat jinja = qwen3_jinja();
  const struct {
    const char* name;
    ChatFormat chat;
    size_t examples, documents;
  } cases[] = {{"text", ChatTemplate::chatml, 0, 3},
               {"prompt_completion", ChatTemplate::chatml, 3, 0},
               {"chat", ChatTemplate::chatml, 2, 0},
               {"chat", jinja, 2, 0},
               {"tools", jinja, 2, 0}};
  for (const auto& c : cases) {
    const Dataset want = load_dataset(columnar(std::string(c.name) + ".jsonl"), qwen(), c.chat);
    ASSERT_EQ(want.examples.size(), c.examples) << c.name;
    ASSERT_EQ(want.num_documents, c.documents) << c.name;
    for (const char* ext : kTwins) {
      const std::string path = columnar(std::string(c.name) + ext);
      expect_same(want, load_dataset(path, qwen(), c.chat), path + " (" + c.chat.name() + ")");
    }
  }
  // the tool call reached the template: its name is among the trained tokens
  const Dataset tools = load_dataset(columnar("tools.parquet"), qwen(), jinja);
  std::vector<int32_t> trained;
  for (size_t i = 0; i < tools.examples[0].ids.size(); ++i)
    if (tools.examples[0].loss_mask[i]) trained.push_back(tools.examples[0].ids[i]);
  EXPECT_NE(qwen().decode(trained).find("\"name\": \"get_weather\""), std::string::npos)
      << qwen().decode(trained);
}

TEST(Columnar, ABadRowNamesTheFileAndRow) {
  SKIP_WITHOUT_ARROW();
  EXPECT_NE(load_error(columnar("missing_completion.jsonl"))
                .find("missing_completion.jsonl:2: missing key \"completion\""),
            std::string::npos);
  for (const char* ext : kTwins) {
    const std::string path = columnar(std::string("missing_completion") + ext);
    EXPECT_NE(load_error(path).find(path + ": row 2: missing key \"completion\""), std::string::npos)
        << load_error(path);
  }
  const std::string bad = columnar("unsupported_type.parquet");
  EXPECT_NE(load_error(bad).find(bad + ": column \"blob\": Arrow type binary has no JSON counterpart"),
            std::string::npos)
      << load_error(bad);
}

TEST(Columnar, ADamagedFileIsOneLineNamingIt) {
  SKIP_WITHOUT_ARROW();
  TempDir dir;
  for (const char* ext : kTwins) {
    const std::string whole = read_file(columnar(std::string("chat") + ext));
    for (size_t keep : {size_t(8), whole.size() / 2, whole.size() - 3}) {
      const std::string path = dir.write(std::string("cut") + ext, whole.substr(0, keep));
      const std::string e = load_error(path);
      EXPECT_EQ(e.rfind(path + ": ", 0), 0u) << e;
    }
  }
}

// Arrow's own reasons can end in a newline (Parquet's thrift errors do): the line ends with the
// reason, not with an escaped "\x0a".
TEST(Columnar, ADamagedFooterEndsWithTheReason) {
  SKIP_WITHOUT_ARROW();
  TempDir dir;
  std::string bytes = read_file(columnar("chat.parquet"));
  // the footer: its thrift metadata, then its length (4 bytes) and "PAR1"
  uint32_t meta = 0;
  std::memcpy(&meta, bytes.data() + bytes.size() - 8, 4);
  ASSERT_LT(meta + 8, bytes.size());
  bytes[bytes.size() - 8 - meta] = '\xff';  // the metadata's first field header
  const std::string path = dir.write("footer.parquet", bytes);
  const std::string e = load_error(path);
  EXPECT_EQ(e.rfind(path + ": Couldn't deserialize thrift: ", 0), 0u) << e;
  EXPECT_EQ(e.find("\\x0a"), std::string::npos) << e;
  EXPECT_NE(e.back(), ' ') << e;
}

TEST(Columnar, WithoutArrowTheFileIsRefusedSayingHowToEnableIt) {
  if (arrow_input_built()) GTEST_SKIP() << "this build reads Arrow (the refusal is for builds without it)";
  const std::string path = columnar("text.parquet");
  EXPECT_NE(
      load_error(path).find(path + ": a Parquet file, and this roundpipe was built without Arrow C++: run "
                                   "scripts/setup.sh"),
      std::string::npos);
}

// Any other binary file is refused naming it and its first bytes, instead of being trained on
// as text.
TEST(BinaryFiles, AreRefusedWithTheirFirstBytes) {
  TempDir dir;
  const std::string nul = dir.write("data.jsonl", std::string("{\"text\": \"a\0b\"}\n", 16));
  EXPECT_NE(load_error(nul).find(
                nul + ": not text: its first bytes are 7b 22 74 65 78 74 22 3a 20 22 61 00 62 22 7d 0a;"),
            std::string::npos)
      << load_error(nul);
  // a NUL after a line of text (a JSON lines file with one bad record): its line and column
  const std::string later =
      dir.write("later.jsonl", std::string("{\"text\": \"hello world\"}\n{\"text\": \"a\0b\"}\n", 40));
  EXPECT_EQ(binary_file_error(later, read_file(later)),
            later +
                ":2:12: a NUL byte in the text; expected UTF-8 text without NUL bytes (JSON lines, a JSON "
                "array or plain text)");
  const std::string gz = dir.write("data.txt", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00", 8));
  EXPECT_NE(
      load_error(gz).find(gz + ": not text: its first bytes are 1f 8b 08 00 00 00 00 00 (a gzip archive"),
      std::string::npos)
      << load_error(gz);
  const std::string latin1 = dir.write("corpus/a.txt", "caf\xe9 au lait");
  EXPECT_NE(
      load_error(dir.path.string() + "/corpus").find(latin1 + ": not text: its first bytes are 63 61 66 e9"),
      std::string::npos);
  // a UTF-8 character cut by the 1 KiB sniffed is still text
  const std::string cut = dir.write("cut.txt", std::string(kSniffBytes - 1, 'a') + "\xc3\xa9 end");
  EXPECT_EQ(binary_file_error(cut, read_file(cut)), "");
  EXPECT_EQ(load_dataset(cut, qwen(), ChatTemplate::chatml).num_documents, 1u);
}

// Text with an invalid UTF-8 byte is refused naming its line and column: past the sniffed
// 1 KiB it reached the tokenizer ("byte 0xff has no token in the vocab", no file or line), and
// within it the error showed the first 16 bytes, fine text, as the reason.
TEST(BinaryFiles, InvalidUtf8InTextNamesItsLine) {
  TempDir dir;
  std::string lines;
  for (int i = 1; i <= 60; ++i)
    lines += "More plain words about the heaven and the earth, line " + std::to_string(i) + ".\n";
  ASSERT_GT(lines.size(), kSniffBytes);
  const std::string late = dir.write("late.txt", lines + "And the earth was \xff without form.\n");
  EXPECT_NE(load_error(late).find(late + ":61: not UTF-8: byte 0xff at column 19 (offset " +
                                  std::to_string(lines.size() + 18) + " of the file); expected UTF-8 text"),
            std::string::npos)
      << load_error(late);
  const std::string early =
      dir.write("early.txt", "In the beginning God created\nthe heaven \xfe and the earth.\n");
  EXPECT_NE(load_error(early).find(early + ":2: not UTF-8: byte 0xfe at column 12 (offset 40 of the file)"),
            std::string::npos)
      << load_error(early);
  // a bad byte within the first 16 bytes but after a whole line: still text with a bad byte
  const std::string short_line = dir.write("corpus/c.txt", "ok\n\xff\xfe bad utf8\n");
  EXPECT_NE(
      load_error(short_line).find(short_line + ":2: not UTF-8: byte 0xff at column 1 (offset 3 of the file)"),
      std::string::npos)
      << load_error(short_line);
  EXPECT_EQ(utf8_error("x", "caf\xc3\xa9\n"), "");
}

// A device or FIFO as a data file is refused before it is read (/dev/zero was counted line by
// line without end, a FIFO blocked the open), and an empty text file says so (the run blamed
// seq_len: "no training target in any of the 0 examples ... their prompts are longer").
TEST(BinaryFiles, DevicesAndEmptyTextAreRefusedNamingWhy) {
  TempDir dir;
  EXPECT_EQ(load_error("/dev/null"),
            "/dev/null: not a regular file (a device, FIFO or socket); expected a data "
            "file or a folder of .txt files");
  const std::string fifo = (dir.path / "pipe.jsonl").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  SequencePacker packer(16, 0, false);
  EXPECT_THROW(load_dataset_into(fifo, qwen(), ChatTemplate::chatml, packer, 0), std::runtime_error);
  EXPECT_THROW(load_dataset_into("/dev/zero", qwen(), ChatTemplate::chatml, packer, 0), std::runtime_error);
  const std::string empty = dir.write("empty.txt", "");
  EXPECT_EQ(load_error(empty), empty + ": empty; expected text");
  dir.write("corpus/a.txt", "");
  EXPECT_EQ(load_error((dir.path / "corpus").string()),
            (dir.path / "corpus").string() + ": its .txt files are empty");
}

// ---- prompt / completion as TRL tokenizes it --------------------------------------------

namespace {
Example one_example(const std::string& line, const ChatFormat& chat) {
  TempDir dir;
  const Dataset d = load_dataset(dir.write("pc.jsonl", line + "\n"), qwen(), chat);
  EXPECT_EQ(d.examples.size(), 1u);
  return d.examples.empty() ? Example{} : d.examples[0];
}
std::string trained_text(const Example& ex) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < ex.ids.size(); ++i)
    if (ex.loss_mask[i]) t.push_back(ex.ids[i]);
  return qwen().decode(t);
}
size_t untrained_prefix(const Example& ex) {
  return size_t(std::find(ex.loss_mask.begin(), ex.loss_mask.end(), 1) - ex.loss_mask.begin());
}
}  // namespace

// TRL tokenizes prompt + completion joined and trains after as many tokens as the prompt alone
// has: "Hello" + "world" is not encode("Hello") ++ encode("world").
TEST(PromptCompletion, PlainTextIsTokenizedJoinedAsTrlDoes) {
  const Example ex = one_example(R"({"prompt": "Hello", "completion": "world"})", ChatTemplate::chatml);
  std::vector<int32_t> want = qwen().encode("Helloworld"), separate = qwen().encode("Hello");
  const auto world = qwen().encode("world");
  separate.insert(separate.end(), world.begin(), world.end());
  ASSERT_NE(want, separate) << "the case must tell joined from separate tokenization";
  want.push_back(qwen().eos_id());
  EXPECT_EQ(ex.ids, want);
  EXPECT_EQ(untrained_prefix(ex), qwen().encode("Hello").size());
}

// TRL's conversational prompt-completion: the completion's tokens are those after the prompt
// rendered with its generation prompt, so the loss covers the assistant turn, its end-of-turn
// token and the newline the template writes after it; the ids are the conversation's.
TEST(PromptCompletion, ConversationalTrainsOnTheCompletionAfterTheGenerationPrompt) {
  const std::string prompt =
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";
  const std::string completion = R"([{"role": "assistant", "content": "Hello there."}])";
  for (const ChatFormat& chat : {ChatFormat(ChatTemplate::chatml), qwen3_jinja()}) {
    const Example ex =
        one_example(R"({"prompt": )" + prompt + R"(, "completion": )" + completion + "}", chat);
    const Example conv = one_example(
        R"({"messages": )" + prompt.substr(0, prompt.size() - 1) + ", " + completion.substr(1) + "}", chat);
    EXPECT_EQ(ex.ids, conv.ids) << chat.name();
    EXPECT_EQ(trained_text(conv),
              chat.jinja ? "<think>\n\n</think>\n\nHello there.<|im_end|>" : "Hello there.<|im_end|>");
    EXPECT_EQ(trained_text(ex),
              chat.jinja ? "<think>\n\n</think>\n\nHello there.<|im_end|>\n" : "Hello there.<|im_end|>\n")
        << chat.name();
    // the untrained tokens are exactly the prompt with its generation prompt
    EXPECT_EQ(
        qwen().decode(std::vector<int32_t>(ex.ids.begin(), ex.ids.begin() + long(untrained_prefix(ex)))),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        << chat.name();
  }
}

TEST(PromptCompletion, MismatchedShapesAreOneLine) {
  TempDir dir;
  const auto err = [&](const std::string& line) { return load_error(dir.write("pc.jsonl", line + "\n")); };
  EXPECT_NE(
      err(R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": "Hello"})")
          .find("pc.jsonl:1: expected a list of messages at key \"completion\" (as \"prompt\"), got string"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "user", "content": "x"}]})")
          .find("pc.jsonl:1: expected an assistant message in \"completion\""),
      std::string::npos);
  EXPECT_NE(err(R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"content": "x"}]})")
                .find("pc.jsonl:1: completion[0]: missing key \"role\""),
            std::string::npos);
}
