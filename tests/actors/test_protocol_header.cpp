// The protocol is declared once (actors/messages.hpp): every message has a type ID of the one
// block and is registered by register_protocol, and no other file of the product declares a
// message type. (The typed interfaces are checked by the compiler: sending an actor a message
// outside its interface does not build.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <typeindex>

#include "actors/messages.hpp"

namespace rp {
namespace {

namespace fs = std::filesystem;

TEST(ProtocolHeader, EveryMessageHasATypeIdOfOneBlockAndIsRegistered) {
  using Block = caf::id_block::roundpipe;
  EXPECT_EQ(Block::begin, caf::first_custom_type_id);
  EXPECT_EQ(caf::type_id<RunStage>::value, Block::begin);
  EXPECT_EQ(caf::type_id<GradsFinal>::value, Block::end - 1);
  EXPECT_STREQ(caf::type_name<CopyDone>::value, "rp::CopyDone");
  caf::actor_system_config cfg;
  register_protocol(cfg);
  for (auto [ti, name] : {std::pair{std::type_index(typeid(ComputeDone)), "rp::ComputeDone"},
                          {std::type_index(typeid(JobDone)), "rp::JobDone"},
                          {std::type_index(typeid(FrozenFetched)), "rp::FrozenFetched"},
                          {std::type_index(typeid(SpillDone)), "rp::SpillDone"},
                          {std::type_index(typeid(GradsFinal)), "rp::GradsFinal"},
                          {std::type_index(typeid(StreamDone)), "rp::StreamDone"},
                          {std::type_index(typeid(StepResult)), "rp::StepResult"}}) {
    auto it = cfg.type_names_by_rtti.find(ti);
    ASSERT_NE(it, cfg.type_names_by_rtti.end()) << name;
    EXPECT_EQ(it->second, name);
  }
  EXPECT_EQ(size_t(Block::end - Block::begin), 43u) << "a message was added: count it here";
}

TEST(ProtocolHeader, NoOtherProductFileDeclaresAMessageType) {
  const fs::path root = RP_SOURCE_DIR;
  int files = 0;
  for (const char* dir : {"actors", "trainer", "cli", "scheduler", "kernels", "model", "optimizer", "trace",
                          "data", "base", "include", "examples"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".hpp" && ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
      if (e.path() == root / "actors" / "messages.hpp") continue;
      std::ifstream f(e.path());
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string text = ss.str();
      ++files;
      for (const char* macro :
           {"CAF_ALLOW_UNSAFE_MESSAGE_TYPE", "CAF_ADD_TYPE_ID", "CAF_BEGIN_TYPE_ID_BLOCK"})
        EXPECT_EQ(text.find(macro), std::string::npos)
            << e.path() << " uses " << macro << ": declare message types in actors/messages.hpp";
    }
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace rp
