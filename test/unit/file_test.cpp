// Input files that are not what they claim to be: FIFOs, devices, huge files,
// and names in a checkpoint index that leave the checkpoint directory. Every
// reader (config.json, the index, safetensors headers, tokenizer.json,
// tokenizer_config.json, chat templates, mapped plans and weights) gives one
// error line and returns promptly.
#include "nf/file.h"

#include "chat/chat_template.h"
#include "hf/HFConfig.h"
#include "nf/safetensors.h"
#include "nf/tokenizer.h"
#include "weights.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace nf;
using namespace nf::test;
using ::testing::HasSubstr;

namespace {

// A FIFO at `path` for the duration of a test. A reader that blocks on it
// (the defect under test) is released after a few seconds by opening and
// closing the write end, and the test fails instead of hanging.
class Fifo {
public:
  explicit Fifo(std::string path) : path_(std::move(path)) {
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0) << path_;
    watchdog_ = std::thread([this] {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!done_ && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      while (!done_) {
        int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) {
          blocked_ = true;
          (void)::write(fd, "{}", 2);
          ::close(fd);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~Fifo() {
    done_ = true;
    watchdog_.join();
    EXPECT_FALSE(blocked_) << "a reader blocked on the FIFO " << path_;
  }
  const std::string &path() const { return path_; }

private:
  std::string path_;
  std::atomic<bool> done_{false}, blocked_{false};
  std::thread watchdog_;
};

// A sparse file of `bytes` bytes (no disk blocks used).
void writeSparse(const std::string &path, uint64_t bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  ::close(fd);
}

} // namespace

//===----------------------------------------------------------------------===//
// The shared helper
//===----------------------------------------------------------------------===//

TEST(InputFile, RefusesWhatIsNotARegularFile) {
  TempDir dir;
  Fifo fifo(dir.file("fifo"));
  EXPECT_EQ(InputFile::open(fifo.path()).message(),
            fifo.path() + ": not a regular file (a FIFO)");
  EXPECT_EQ(InputFile::open("/dev/zero").message(),
            "/dev/zero: not a regular file (a character device)");
  EXPECT_EQ(InputFile::open(dir.path()).message(),
            dir.path() + ": cannot open: Is a directory");
  EXPECT_EQ(InputFile::open(dir.file("none")).message(),
            dir.file("none") + ": cannot open: No such file or directory");
}

TEST(InputFile, ReadsRegularFiles) {
  TempDir dir;
  writeFile(dir.file("a.json"), "{\"a\": 1}");
  StatusOr<std::string> text = readWholeFile(dir.file("a.json"));
  ASSERT_TRUE(text.ok()) << text.message();
  EXPECT_EQ(*text, "{\"a\": 1}");
  // Through a symbolic link too (the Hugging Face cache layout).
  fs::create_symlink(dir.file("a.json"), dir.file("link.json"));
  text = readWholeFile(dir.file("link.json"));
  ASSERT_TRUE(text.ok()) << text.message();
  EXPECT_EQ(*text, "{\"a\": 1}");
}

TEST(InputFile, SizeLimit) {
  TempDir dir;
  writeFile(dir.file("small"), "0123456789");
  EXPECT_EQ(readWholeFile(dir.file("small"), 9).message(),
            dir.file("small") +
                ": file is too large (10 bytes; the limit is 9)");
  EXPECT_TRUE(readWholeFile(dir.file("small"), 10).ok());
  writeSparse(dir.file("huge"), kMaxTextFileBytes + 1);
  EXPECT_EQ(readWholeFile(dir.file("huge")).message(),
            dir.file("huge") + ": file is too large (268435457 bytes; the "
                               "limit is 268435456)");
}

TEST(PathInside, StaysInTheDirectory) {
  auto ok = [](const std::string &name) {
    StatusOr<std::string> p = pathInside("/ckpt", name, "idx", "shard");
    EXPECT_TRUE(p.ok()) << name << ": " << p.message();
    return p.ok() ? *p : std::string();
  };
  EXPECT_EQ(ok("model-00001-of-00002.safetensors"),
            "/ckpt/model-00001-of-00002.safetensors");
  EXPECT_EQ(ok("sub/dir/x.safetensors"), "/ckpt/sub/dir/x.safetensors");
  EXPECT_EQ(ok("a..b.safetensors"), "/ckpt/a..b.safetensors");
  for (std::string bad :
       {"../x.safetensors", "a/../../x", "/etc/passwd", "a/..", "..", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(pathInside("/ckpt", bad, "idx", "shard").message(),
              "idx: shard '" + bad +
                  "' is not a file name inside the checkpoint directory");
  }
  EXPECT_EQ(
      pathInside("/ckpt", std::string("a\0b", 3), "idx", "shard").message(),
      "idx: shard 'a\\x00b' is not a file name inside the checkpoint "
      "directory");
}

//===----------------------------------------------------------------------===//
// Every reader
//===----------------------------------------------------------------------===//

TEST(UntrustedFiles, ConfigJson) {
  TempDir dir;
  Fifo fifo(dir.file("config.json"));
  EXPECT_EQ(hf::parseConfigFile(fifo.path()).message(),
            fifo.path() + ": not a regular file (a FIFO)");
  EXPECT_EQ(hf::parseConfigFile("/dev/zero").message(),
            "/dev/zero: not a regular file (a character device)");
  writeSparse(dir.file("big.json"), kMaxTextFileBytes + 1);
  EXPECT_THAT(hf::parseConfigFile(dir.file("big.json")).message(),
              HasSubstr("big.json: file is too large"));
}

TEST(UntrustedFiles, CheckpointIndexAndShards) {
  TempDir dir;
  {
    Fifo fifo(dir.file("model.safetensors.index.json"));
    EXPECT_EQ(openCheckpoint(dir.path()).message(),
              fifo.path() + ": not a regular file (a FIFO)");
  }
  fs::remove(dir.file("model.safetensors.index.json"));
  writeFile(dir.file("model.safetensors.index.json"),
            R"({"weight_map": {"a": "shard.safetensors"}})");
  Fifo shard(dir.file("shard.safetensors"));
  EXPECT_EQ(openCheckpoint(dir.path()).message(),
            shard.path() + ": not a regular file (a FIFO)");
}

TEST(UntrustedFiles, SafetensorsHeader) {
  TempDir dir;
  Fifo fifo(dir.file("model.safetensors"));
  EXPECT_EQ(readSafetensorsHeader(fifo.path()).message(),
            fifo.path() + ": not a regular file (a FIFO)");
  EXPECT_EQ(openCheckpoint(dir.path()).message(),
            fifo.path() + ": not a regular file (a FIFO)");
  EXPECT_EQ(readSafetensorsHeader("/dev/zero").message(),
            "/dev/zero: not a regular file (a character device)");
}

TEST(UntrustedFiles, MappedFiles) {
  TempDir dir;
  Fifo fifo(dir.file("plan.nfb"));
  EXPECT_EQ(MappedFile::open(fifo.path()).message(),
            fifo.path() + ": not a regular file (a FIFO)");
  EXPECT_EQ(MappedFile::open("/dev/zero").message(),
            "/dev/zero: not a regular file (a character device)");
}

TEST(UntrustedFiles, Tokenizer) {
  TempDir dir;
  Fifo fifo(dir.file("tokenizer.json"));
  EXPECT_EQ(Tokenizer::fromFile(fifo.path()).message(),
            fifo.path() + ": not a regular file (a FIFO)");
  EXPECT_EQ(Tokenizer::fromFile("/dev/zero").message(),
            "/dev/zero: not a regular file (a character device)");
}

TEST(UntrustedFiles, ChatTemplates) {
  TempDir dir;
  {
    Fifo fifo(dir.file("tokenizer_config.json"));
    StatusOr<chat::ChatConfig> cfg = chat::loadChatConfig(dir.path(), "");
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    EXPECT_EQ(cfg->templateError,
              fifo.path() + ": not a regular file (a FIFO)");
  }
  fs::remove(dir.file("tokenizer_config.json"));
  {
    Fifo fifo(dir.file("chat_template.jinja"));
    StatusOr<chat::ChatConfig> cfg = chat::loadChatConfig(dir.path(), "");
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    EXPECT_EQ(cfg->templateError,
              fifo.path() + ": not a regular file (a FIFO)");
    EXPECT_EQ(chat::loadChatConfig(dir.path(), "/dev/zero").message(),
              "/dev/zero: not a regular file (a character device)");
  }
}
