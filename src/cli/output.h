// Shared output helpers for the `shardsafe` tool: sizes, JSON printing,
// error lines and a progress line on stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardsafe/checkpoint.h"

namespace shardsafe::cli {

using Json = nlohmann::json;  // --json output

// Exit codes: 0 success, 1 a check found problems (verify, diff), 2 error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitProblems = 1;
inline constexpr int kExitError = 2;

std::string FormatBytes(uint64_t bytes);  // "1.69 GB" (decimal units)
std::string FormatRate(uint64_t bytes, double seconds);  // "2.41 GB/s"

// `text` safe for a terminal: control characters (bytes below 0x20, and
// 0x7f) as \xNN, and a backslash as \\, so a key or file name from a
// checkpoint cannot move the cursor, clear the screen or forge a line of
// output. Human output passes every name it prints through this; --json
// output is escaped by JSON itself.
std::string Printable(std::string_view text);

// Prints "shardsafe: error: <message>" to stderr (Printable) and returns
// kExitError.
int Fail(const Status& status);
int Fail(std::string_view message);
// Fail, saying for AlreadyExists that --overwrite replaces what is there
// (the commands that create a path: import, export-hf).
int FailOverwritable(const Status& status);

// Prints `j` (indented) to stdout.
void PrintJson(const Json& j);

// A progress line on stderr: redrawn in place on a terminal, else one line
// per phase change or per 10%. Call Update from one thread.
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  ~ProgressLine();
  void Update(const Progress& p);
  ProgressFn Callback();
  void Finish();

 private:
  bool enabled_;
  bool tty_;
  std::string phase_;
  int last_decile_ = -1;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point phase_start_;
};

}  // namespace shardsafe::cli
