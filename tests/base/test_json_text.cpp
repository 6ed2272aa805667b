// base/json_text: a JSON file's errors in one line naming the file and the place (line and
// column of a syntax error; line and key of a number beyond a double's range).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "base/json_text.hpp"

namespace {

std::string error_of(const std::string& text) {
  try {
    rp::parse_json_text(text, "f.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(JsonText, ASyntaxErrorNamesLineAndColumn) {
  EXPECT_EQ(error_of("{\"a\": 1,\n \"b\": }"),
            "f.json:2:7: invalid JSON: syntax error while parsing value - unexpected '}'; expected '[', "
            "'{', or a literal");
  EXPECT_EQ(rp::parse_json_text("{\"a\": [1, 2.5]}", "f.json")["a"][1], 2.5);
}

TEST(JsonText, ANumberBeyondADoubleNamesLineAndKeyPath) {
  EXPECT_EQ(error_of("{\"a\": 1,\n \"b\": {\"c\": 1e400}}"),
            "f.json:2: key 'b.c': expected a number within a double's range (about 1.8e308), got 1e400");
  // inside a list: the key holding the list; the same digits earlier in a string are not it
  EXPECT_EQ(error_of("{\"name\": \"-1e999\",\n\n \"f\": [1, -1e999]}"),
            "f.json:3: key 'f': expected a number within a double's range (about 1.8e308), got -1e999");
  // not under a key
  EXPECT_EQ(error_of("1e400"),
            "f.json:1: expected a number within a double's range (about 1.8e308), got 1e400");
}

}  // namespace
