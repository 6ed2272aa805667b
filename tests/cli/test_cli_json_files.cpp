// JSON files the commands read (the spec, a model folder's config.json and tokenizer files):
// a folder or a pipe without a writer where the file should be, and a syntax error, are one
// line naming the file.
#include <sys/stat.h>

#include <algorithm>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

// A named pipe or a device as the data file is one line naming it: the run blocked opening the
// pipe (no writer ever came), and read /dev/zero without end.
TEST(CliJsonFiles, AFifoOrDeviceAsDataIsOneLineNamingIt) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  ASSERT_EQ(::mkfifo((d / "pipe.jsonl").c_str(), 0600), 0);
  write(d / "spec.json", spec_for(model, d / "pipe.jsonl", d / "run"));
  for (const std::string& data : {(d / "pipe.jsonl").string(), std::string("/dev/zero")}) {
    const CliRun r = roundpipe("train " + (d / "spec.json").string() + " --data " + data, d);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("key 'data': " + data + ": not a regular file (a device, FIFO or socket)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "run"));
  fs::remove_all(d);
}

// A named pipe that no program writes to, given as the spec, a trace or a --messages file, is
// one line naming it: `roundpipe train` waited at its open forever. A pipe that has a writer (a
// shell's <(...)) is still read as the spec.
TEST(CliJsonFiles, ANamedPipeWithoutAWriterIsOneLineNamingIt) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  const std::string fifo = (d / "pipe.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string refused =
      fifo +
      ": is a named pipe that no program writes to (reading it would wait forever), expected a JSON file";
  for (const std::string& args :
       {"train " + fifo, "trace " + fifo, "generate " + model.string() + " --messages " + fifo}) {
    // bounded: a command that waits on the pipe ends with timeout's exit status 124
    expect_one_line_error(roundpipe_in(d, args, d, "timeout 60"), refused);
  }
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const std::string cmd = "timeout 60 bash -c '" + std::string(RP_BUILD_DIR) + "/roundpipe train <(cat " +
                          (d / "spec.json").string() + ") --dump-batch " + (d / "b.json").string() +
                          "' > /dev/null 2> " + (d / "err.txt").string() + " < /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(d / "err.txt");
  EXPECT_TRUE(fs::exists(d / "b.json"));
  fs::remove_all(d);
}

// Model weights that are a named pipe no program writes to: `generate` of such a .gguf, or of a
// folder whose model.safetensors or model.safetensors.index.json is one, waited forever.
TEST(CliJsonFiles, ModelWeightsThatAreANamedPipeAreRefusedAtOnce) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  const std::string gguf = (d / "pipe.gguf").string();
  ASSERT_EQ(::mkfifo(gguf.c_str(), 0600), 0);
  expect_one_line_error(roundpipe_in(d, "generate " + gguf + " --prompt hi", d, "timeout 60"),
                        gguf + ": not a regular file (a device, FIFO or socket)");
  const fs::path piped = d / "piped";
  fs::create_directories(piped);
  for (const auto& e : fs::directory_iterator(model))
    if (e.path().filename() != "model.safetensors") fs::copy(e.path(), piped / e.path().filename());
  const std::string weights = (piped / "model.safetensors").string();
  ASSERT_EQ(::mkfifo(weights.c_str(), 0600), 0);
  expect_one_line_error(roundpipe_in(d, "generate " + piped.string() + " --prompt hi", d, "timeout 60"),
                        "model.safetensors: not a regular file (a device, FIFO or socket)");
  // a folder where the weights go is called one (it was "a device, FIFO or socket")
  fs::remove(weights);
  fs::create_directories(weights);
  expect_one_line_error(roundpipe_in(d, "generate " + piped.string() + " --prompt hi", d, "timeout 60"),
                        "model.safetensors: is a folder, expected a safetensors file");
  // a sharded model's index
  fs::remove_all(weights);
  const std::string index = (piped / "model.safetensors.index.json").string();
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  expect_one_line_error(roundpipe_in(d, "generate " + piped.string() + " --prompt hi", d, "timeout 60"),
                        index +
                            ": is a named pipe that no program writes to (reading it would wait forever), "
                            "expected a JSON file");
  fs::remove_all(d);
}

// A folder reads as an empty file: the line said "<path>:1:1: invalid JSON: ... unexpected end
// of input", as if the file were empty.
TEST(CliJsonFiles, AFolderWhereAJsonFileShouldBeIsNamedAsAFolder) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  fs::create_directories(d / "spec.json");
  const CliRun spec = roundpipe("train " + (d / "spec.json").string(), d);
  EXPECT_EQ(spec.code, 1);
  EXPECT_EQ(spec.err,
            "roundpipe: error: " + (d / "spec.json").string() + ": is a folder, expected a JSON file\n");
  write(d / "good.json", spec_for(model, d / "data.jsonl", d / "run"));
  fs::remove(model / "config.json");
  fs::create_directories(model / "config.json");
  const CliRun config = roundpipe("train " + (d / "good.json").string(), d);
  EXPECT_EQ(config.code, 1);
  EXPECT_EQ(config.err, "roundpipe: error: " + (model / "config.json").string() +
                            ": is a folder, expected a JSON file\n");
  const CliRun gen = roundpipe("generate " + model.string() + " --prompt hi --max-tokens 1", d);
  EXPECT_EQ(gen.code, 1);
  EXPECT_NE(gen.err.find((model / "config.json").string() + ": is a folder"), std::string::npos) << gen.err;
  fs::remove_all(d);
}

// tokenizer.json's errors come from the same parser as the spec's and config.json's: line and
// column, without nlohmann's "[json.exception.parse_error.101]" prefix.
TEST(CliJsonFiles, ATokenizerFilesSyntaxErrorNamesItsLineAndColumn) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  write(model / "tokenizer.json", "{\"model\":\n  }");
  const CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find((model / "tokenizer.json").string() + ":2:3: invalid JSON: syntax error"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  fs::remove(model / "tokenizer.json");
  fs::create_directories(model / "tokenizer.json");
  const CliRun f = roundpipe("train " + (d / "spec.json").string(), d);
  EXPECT_NE(f.err.find((model / "tokenizer.json").string() + ": is a folder, expected a JSON file"),
            std::string::npos)
      << f.err;
  fs::remove_all(d);
}

// A spec that is no text (a binary file, or Latin-1) is one line that quotes what it read with
// the bytes that are not UTF-8 escaped as \xNN, as control characters are: the parser's "last
// read: '\xff'" reached the terminal as the raw byte. A valid UTF-8 character stays as it is.
TEST(CliJsonFiles, ABinarySpecsSyntaxErrorEscapesTheBytesThatAreNotText) {
  auto d = tmpdir();
  const struct {
    std::string text, says;
  } cases[] = {
      {"\xff\xfe{\"model\": 1}",
       "spec.json:1:1: invalid JSON: syntax error while parsing value - invalid "
       "literal; last read: '\\xff'"},
      {"{\"model\": \"x\",\n \"steps\": 1\xe9}",
       "spec.json:2:12: invalid JSON: syntax error while parsing "
       "object - invalid literal; last read: '1\\xe9'"},
      {"{\"model\": \"x\",\n \"steps\": 1\x85}", "last read: '1\\x85'"},
      {"{\"model\": \"x\",\n \"st\xc3\xa9ps\"\xff}", "last read: '\"st\xc3\xa9ps\"\\xff'"},
  };
  for (const auto& c : cases) {
    write(d / "spec.json", c.text);
    const CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
    expect_one_line_error(r, c.says);
    // nothing but printable ASCII and the one valid character (é) reached the terminal
    std::string rest = r.err;
    for (size_t at; (at = rest.find("\xc3\xa9")) != std::string::npos;) rest.erase(at, 2);
    EXPECT_TRUE(std::all_of(rest.begin(), rest.end(), [](char ch) {
      return (ch >= 0x20 && ch < 0x7f) || ch == '\n';
    })) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "runs"));
  fs::remove_all(d);
}

}  // namespace
