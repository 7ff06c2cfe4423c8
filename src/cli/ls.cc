// shardsafe ls ROOT / prune ROOT --keep N: committed checkpoints of a root.
#include <charconv>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "cli/commands.h"
#include "cli/output.h"

namespace shardsafe::cli {
namespace {

std::string FormatTime(int64_t unix_seconds) {
  std::time_t t = unix_seconds;
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
  return buf;
}

Json ToJson(const CheckpointInfo& c) {
  return {{"tag", c.tag}, {"path", c.path}, {"step", c.step ? Json(*c.step) : Json()},
          {"bytes", c.bytes}, {"mtime_unix", c.mtime_unix}, {"sequence", c.sequence},
          {"committed_ns", c.committed_ns}, {"moved_latest", c.moved_latest},
          {"latest", c.is_latest},
          {"order_fault", c.order_fault.empty() ? Json() : Json(c.order_fault)}};
}

}  // namespace

void AddLs(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("ls", "List the committed checkpoints under ROOT");
  auto root = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("ROOT", *root, "directory of checkpoints")->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->callback([=] {
    auto list = ListCheckpoints(*root);
    if (!list.ok()) {
      *exit_code = Fail(list.status());
      return;
    }
    if (*json) {
      Json j = Json::array();
      for (const auto& c : *list) j.push_back(ToJson(c));
      PrintJson(j);
      return;
    }
    std::printf("%-32s %10s %12s  %-19s\n", "TAG", "STEP", "SIZE", "SAVED (UTC)");
    bool latest = false;
    for (const auto& c : *list) {
      std::printf("%-32s %10s %12s  %-19s%s\n", Printable(c.tag).c_str(),
                  c.step ? std::to_string(*c.step).c_str() : "-", FormatBytes(c.bytes).c_str(),
                  FormatTime(c.mtime_unix).c_str(),
                  c.is_latest ? "  <- latest" : !c.order_fault.empty() ? "  ? order unknown" : "");
      latest |= c.is_latest;
    }
    if (list->empty()) std::printf("(no committed checkpoints)\n");
    for (const auto& c : *list) {
      if (c.order_fault.empty()) continue;
      std::printf("%s: order unknown, kept by retention: %s\n", Printable(c.tag).c_str(),
                  Printable(c.order_fault).c_str());
    }
    if (!list->empty() && !latest) {
      std::printf("latest: cannot be told (a checkpoint of unknown order may be the newest)\n");
    }
  });
}

void AddPrune(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("prune", "Delete all but the newest N committed checkpoints");
  auto root = std::make_shared<std::string>();
  auto keep = std::make_shared<int>(1);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("ROOT", *root, "directory of checkpoints")->required();
  cmd->add_option("--keep", *keep, "how many to keep, at least 1 (the newest and `latest` always stay)")
      ->required()
      ->check(CLI::Validator(
          [](const std::string& value) -> std::string {
            int n = 0;
            const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
            if (ec == std::errc() && end == value.data() + value.size() && n >= 1) return "";
            return "must be a whole number of checkpoints, at least 1 (the newest always "
                   "stays), not " + value;
          },
          "N>=1"));
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->callback([=] {
    CheckpointManager manager(*root, {});
    std::vector<std::string> warnings;
    auto removed = manager.Prune(*keep, &warnings);
    if (!removed.ok()) {
      *exit_code = Fail(removed.status());
      return;
    }
    if (*json) return PrintJson({{"removed", *removed}, {"warnings", warnings}});
    for (const auto& w : warnings) std::cerr << "warning: " << Printable(w) << "\n";
    for (const auto& tag : *removed) std::cout << "removed " << tag << "\n";
    std::cout << removed->size() << " checkpoint(s) removed\n";
  });
}

}  // namespace shardsafe::cli
