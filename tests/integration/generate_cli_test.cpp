// `petrel run` and `petrel chat` as a person uses them, on the bundled petrel-tiny model: the
// binary is driven through a pseudo-terminal (chat) or pipes (run) and its output checked.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace petrel {
namespace {

const std::string kPetrel = std::string(PETREL_BINARY_DIR) + "/src/petrel";
const std::string kTiny = std::string(PETREL_FIXTURES_DIR) + "/../../models/petrel-tiny";

// A program running on a pseudo-terminal: keys typed in, screen output read back.
class Terminal {
 public:
  explicit Terminal(const std::vector<std::string>& argv) {
    pid_ = forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Terminal() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  bool started() const { return pid_ > 0; }
  void type(const std::string& keys) { ASSERT_EQ(write(fd_, keys.data(), keys.size()), ssize_t(keys.size())); }

  // Waits until `text` appears after the previous match; true when it did within the timeout.
  bool wait_for(const std::string& text, double timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      const size_t at = out_.find(text, seen_);
      if (at != std::string::npos) {
        seen_ = at + text.size();
        return true;
      }
      if (std::chrono::steady_clock::now() > end || !pump(100)) return false;
    }
  }

  // The exit status, or -1 when the program is still running after the timeout.
  int wait_exit(double timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      pump(50);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        while (pump(50)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    return -1;
  }

  const std::string& output() const { return out_; }

 private:
  // Reads what the program wrote; false once the terminal is closed.
  bool pump(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    out_.append(buf, size_t(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string out_;
  size_t seen_ = 0;
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void require_binary() {
  ASSERT_TRUE(std::filesystem::exists(kPetrel)) << kPetrel << " is missing: build the petrel target";
}

TEST(ChatCli, AnswersTwoTurnsHandlesResetAndExitsCleanly) {
  require_binary();
  Terminal t({kPetrel, "chat", kTiny});
  ASSERT_TRUE(t.started());
  t.type("What is 2 + 3?\rReverse the word petrel.\r/reset\rWhat is 10 + 5?\r/exit\r");
  EXPECT_TRUE(t.wait_for("Answer: 5"));
  EXPECT_TRUE(t.wait_for("lertep"));
  EXPECT_TRUE(t.wait_for("(conversation reset)"));
  EXPECT_TRUE(t.wait_for("Answer: 15"));
  EXPECT_EQ(t.wait_exit(), 0);
  EXPECT_EQ(count(t.output(), "ended: eos]"), 3u) << t.output();
  EXPECT_EQ(count(t.output(), "cached)"), 1u) << "the second turn reuses the first's state\n" << t.output();
}

TEST(ChatCli, CtrlCStopsTheAnswerNotTheProgram) {
  require_binary();
  Terminal t({kPetrel, "chat", kTiny, "--ignore-eos", "-n", "1800"});
  ASSERT_TRUE(t.started());
  t.type("What is 2 + 3?\r");
  ASSERT_TRUE(t.wait_for("Answer: 5")) << t.output();
  t.type("\x03");
  EXPECT_TRUE(t.wait_for("ended: interrupted]")) << t.output();
  t.type("half a line\x03");
  EXPECT_TRUE(t.wait_for("(Ctrl-C stops an answer; /exit or Ctrl-D quits)")) << t.output();
  t.type("Reverse the word petrel.\r");
  EXPECT_TRUE(t.wait_for("lertep")) << t.output();
  t.type("\x03");
  EXPECT_TRUE(t.wait_for("ended: interrupted]")) << t.output();
  t.type("\x04");
  EXPECT_EQ(t.wait_exit(), 0) << t.output();
}

// Runs `command` through the shell; returns its stdout.
std::string shell(const std::string& command, int* status = nullptr) {
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int s = pclose(p);
  if (status) *status = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  return out;
}

TEST(PetrelCli, VersionNamesTheProgramAndItsVersion) {
  require_binary();
  int status = -1;
  EXPECT_EQ(shell(kPetrel + " --version", &status), std::string("petrel ") + PETREL_VERSION + "\n");
  EXPECT_EQ(status, 0);
}

// A number outside a flag's range is one short line naming the flag, the range and the value as
// typed (CLI11's own ranges print a double's limit in 309 digits).
TEST(PetrelCli, OutOfRangeNumbersNameTheFlagTheRangeAndTheValue) {
  require_binary();
  const std::pair<std::string, std::string> cases[] = {
      {"run " + kTiny + " -p hi --temperature 1e400",
       "--temperature: expected a number >= 0, found 1e400 (the largest accepted is 3.40282e+38)"},
      {"run " + kTiny + " -p hi -n 99999999999999999999",
       "--max-tokens: expected an integer >= -1, found 99999999999999999999 (the largest accepted is 2147483647)"},
      {"run " + kTiny + " -p hi --top-p 1.5", "--top-p: expected a number from 0 to 1, found 1.5"},
      {"run " + kTiny + " -p hi --repeat-penalty 0", "--repeat-penalty: expected a number > 0, found 0"},
      {"run " + kTiny + " -p hi --seed -1", "--seed: expected an integer >= 0, found -1"},
      {"run " + kTiny + " -p hi --top-k 2.5", "--top-k: expected an integer >= 0, found '2.5'"},
      {"chat " + kTiny + " --threads -2", "--threads: expected an integer >= 0, found -2"},
      {"serve " + kTiny + " --port 70000", "--port: expected an integer from 0 to 65535, found 70000"},
      {"serve " + kTiny + " --header-timeout 1e400", "--header-timeout: expected a number from 0.1 to 3600, found 1e400"},
      {"dump-logits " + kTiny + " --prompt-ids 1 --out x.npy --chunk 0", "--chunk: expected an integer >= 1, found 0"},
  };
  for (const auto& [args, message] : cases) {
    int status = 0;
    const std::string out = shell(kPetrel + " " + args + " 2>&1", &status);
    EXPECT_NE(status, 0) << args;
    EXPECT_EQ(out.substr(0, out.find('\n')), message) << args;
    EXPECT_LT(out.size(), 200u) << out;
  }
}

// serve --synthetic: random weights of a released shape, read with --tokenizer's folder; the
// flags are checked before listening, and the CPU refuses (synthetic weights have no host data).
TEST(PetrelCli, ServeSyntheticNeedsATokenizerAndCuda) {
  require_binary();
  const std::pair<std::string, std::string> cases[] = {
      {"serve --synthetic qwen3.5-35b-a3b --port 0",
       "petrel serve: --synthetic and --tokenizer go together (random weights need a tokenizer to read requests with)"},
      {"serve " + kTiny + " --synthetic qwen3.5-35b-a3b --tokenizer " + kTiny + " --port 0",
       "petrel serve: give a checkpoint DIR or --synthetic NAME (not both)"},
      {"serve --synthetic qwen9 --tokenizer " + kTiny + " --port 0", "--synthetic 'qwen9' is not a known shape"},
  };
  for (const auto& [args, message] : cases) {
    int status = 0;
    const std::string out = shell(kPetrel + " " + args + " 2>&1", &status);
    EXPECT_NE(status, 0) << args;
    EXPECT_NE(out.find(message), std::string::npos) << args << "\n" << out;
    EXPECT_EQ(out.find("listening on"), std::string::npos) << out;
  }
  if (cuda_available()) return;
  int status = 0;
  const std::string out = shell(kPetrel + " serve --synthetic qwen3.5-35b-a3b --tokenizer " + kTiny + " --port 0 2>&1",
                                &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("synthetic weights (qwen3.5-35b-a3b) have no host data: they run on CUDA"), std::string::npos)
      << out;
}

TEST(RunCli, AnswersAPromptThroughTheChatTemplate) {
  require_binary();
  EXPECT_EQ(shell(kPetrel + " run " + kTiny + " -p 'What is 48213 + 9377?' 2>/dev/null"),
            "Digits from the right: 09575\nAnswer: 57590\n");
  EXPECT_EQ(shell("echo 'Reverse the word petrel.' | " + kPetrel + " run " + kTiny + " 2>/dev/null"), "lertep\n");
}

TEST(RunCli, PromptIdsGiveIdsOnOneLine) {
  require_binary();
  EXPECT_EQ(shell(kPetrel + " run " + kTiny +
                  " --prompt-ids 1,269,201,294,292,223,22,26,20,19,21,295,223,27,21,25,25,33,2,201,1,271,201"
                  " -n 21 --temperature 0 --output-ids 2>/dev/null"),
            "289 277 273 287 28 223 18 27 23 25 23 201 288 28 223 23 25 23 27 18 2\n");
}

TEST(RunCli, StopStringEndsTheAnswerAndIsNotPrinted) {
  require_binary();
  EXPECT_EQ(shell(kPetrel + " run " + kTiny + " -p 'What is 48213 + 9377?' --stop 'Answer' 2>/dev/null"),
            "Digits from the right: 09575\n");
  EXPECT_EQ(shell(kPetrel + " run " + kTiny + " -p 'What is 48213 + 9377?' --stop '575\nAns' 2>/dev/null"),
            "Digits from the right: 09\n");
}

TEST(RunCli, ShortFlagsAndAliases) {
  require_binary();
  int status = -1;
  const std::string out = shell(kPetrel + " run -m " + kTiny + " -p 'What is 48213 + 9377?' -t 1 -c 100 --temp 0 2>&1",
                                &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("sampling greedy, context 100\n"), std::string::npos) << out;
  EXPECT_NE(out.find("Answer: 57590"), std::string::npos) << out;
  EXPECT_EQ(shell(kPetrel + " run --model " + kTiny + " --prompt-ids 1,269,201 -n 3 --ctx-size 16 --output-ids "
                  "--threads 1 2>/dev/null | wc -w"),
            "3\n");
  const std::string both = shell(kPetrel + " run " + kTiny + " -m " + kTiny + " -p hi 2>&1", &status);
  EXPECT_NE(status, 0) << both;
  EXPECT_NE(both.find("Exactly 1 option from [dir,-m,--model] is required and 2 were given"), std::string::npos) << both;
}

// The MTP fixture has no tokenizer: ids in, ids out, the statistics on stderr.
TEST(RunCli, SpeculativeMtpGivesThePlainTokensAndReportsAcceptance) {
  require_binary();
  const std::string run = kPetrel + " run " + std::string(PETREL_FIXTURES_DIR) +
                          "/models/qwen35moe-mtp --prompt-ids 47,211,38,53,204,116,152,249 -n 24 --temperature 0 "
                          "--output-ids --threads 1";
  int status = -1;
  const std::string plain = shell(run + " 2>/dev/null", &status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), ' '), 23) << plain;
  EXPECT_EQ(shell(run + " --speculative mtp --draft-tokens 3 2>/dev/null", &status), plain);
  EXPECT_EQ(status, 0);
  const std::string err = shell(run + " --speculative mtp --draft-tokens 3 2>&1 >/dev/null", &status);
  EXPECT_NE(err.find("speculative mtp (draft 3)"), std::string::npos) << err;
  EXPECT_NE(err.find("tokens per verify step"), std::string::npos) << err;
  const std::string none = shell(kPetrel + " run " + kTiny + " -p hi --speculative mtp 2>&1", &status);
  EXPECT_EQ(status, 1);
  EXPECT_NE(none.find("--speculative mtp needs a checkpoint with a multi-token prediction head"), std::string::npos)
      << none;
}

TEST(PetrelCli, AHubModelIdSaysHowToDownloadIt) {
  require_binary();
  // serve says it before listening: no "listening on" line comes first.
  for (const std::string command : {"run Qwen/Qwen3.5-35B-A3B -p hi", "serve Qwen/Qwen3.5-35B-A3B --port 0"}) {
    int status = 0;
    const std::string out = shell("cd " + std::string(PETREL_BINARY_DIR) + " && " + kPetrel + " " + command + " 2>&1",
                                  &status);
    EXPECT_EQ(status, 1) << command;
    EXPECT_EQ(out, "error: Qwen/Qwen3.5-35B-A3B is not a local folder; it looks like a Hugging Face model id, and "
                   "petrel reads local folders only: download it with `hf download Qwen/Qwen3.5-35B-A3B --local-dir "
                   "models/Qwen3.5-35B-A3B` and pass models/Qwen3.5-35B-A3B\n")
        << command;
  }
}

TEST(RunCli, BadFlagsAreClearErrors) {
  require_binary();
  int status = 0;
  const std::string err = shell(kPetrel + " run " + kTiny + " -p hi --logit-bias 5x 2>&1 >/dev/null; true", &status);
  EXPECT_NE(err.find("--logit-bias: expected TOKEN_ID=BIAS"), std::string::npos) << err;
  const std::string ctx = shell(kPetrel + " run " + kTiny + " -p 'What is 1 + 1?' --context 8 2>&1", &status);
  EXPECT_NE(ctx.find("the prompt is 16 tokens but the context holds 8 (the model's limit is 2048)"), std::string::npos) << ctx;
  EXPECT_EQ(status, 1);
}

}  // namespace
}  // namespace petrel
