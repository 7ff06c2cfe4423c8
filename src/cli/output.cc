#include "cli/output.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace shardsafe::cli {

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string FormatRate(uint64_t bytes, double seconds) {
  if (seconds <= 0) return "-";
  return FormatBytes(static_cast<uint64_t>(bytes / seconds)) + "/s";
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += c;
    }
  }
  return out;
}

int Fail(std::string_view message) {
  std::cerr << "shardsafe: error: " << Printable(message) << "\n";
  return kExitError;
}

int Fail(const Status& status) { return Fail(status.message()); }

int FailOverwritable(const Status& status) {
  if (status.code() != StatusCode::kAlreadyExists) return Fail(status);
  return Fail(status.message() + " (pass --overwrite to replace it)");
}

void PrintJson(const Json& j) { std::cout << j.dump(2) << "\n"; }

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO)) {}

ProgressLine::~ProgressLine() { Finish(); }

void ProgressLine::Update(const Progress& p) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (p.phase != phase_) {
    Finish();
    phase_ = std::string(p.phase);
    phase_start_ = now;
    last_decile_ = -1;
  }
  if (p.total_bytes == 0) return;
  const int pct = static_cast<int>(100.0 * p.done_bytes / p.total_bytes);
  if (!tty_ && pct / 10 == last_decile_) return;
  last_decile_ = pct / 10;
  const double secs = std::chrono::duration<double>(now - phase_start_).count();
  const int filled = pct / 5;
  std::fprintf(stderr, "%s  %-8s [%.*s%*s] %3d%%  %s / %s  %s%s", tty_ ? "\r" : "", phase_.c_str(),
               filled, "####################", 20 - filled, "", pct,
               FormatBytes(p.done_bytes).c_str(), FormatBytes(p.total_bytes).c_str(),
               FormatRate(p.done_bytes, secs).c_str(), tty_ ? "   " : "\n");
  drawn_ = tty_;
}

ProgressFn ProgressLine::Callback() {
  return [this](const Progress& p) { Update(p); };
}

void ProgressLine::Finish() {
  if (drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace shardsafe::cli
