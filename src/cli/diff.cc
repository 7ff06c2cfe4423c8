// shardsafe diff A B: per-tensor equality, max abs difference for floats.
#include <cstdio>

#include "cli/commands.h"
#include "cli/output.h"
#include "shardsafe/tools.h"

namespace shardsafe::cli {
namespace {

Json ToJson(const DiffReport& r) {
  Json tensors = Json::array();
  for (const auto& t : r.tensors) {
    tensors.push_back({{"key", t.key}, {"status", t.status}, {"elements", t.elements},
                       {"differing_elements", t.differing_elements},
                       {"max_abs_diff", t.max_abs_diff ? Json(*t.max_abs_diff) : Json()}});
  }
  return {{"identical", r.identical()}, {"values_equal", r.values_equal},
          {"differing_values", r.differing_values}, {"tensors", tensors}};
}

void PrintHuman(const DiffReport& r) {
  size_t differing = 0;
  for (const auto& t : r.tensors) {
    if (t.status == "equal") continue;
    ++differing;
    std::printf("%-13s %s", t.status.c_str(), Printable(t.key).c_str());
    if (t.status == "differs") {
      std::printf("  (%llu of %llu elements", static_cast<unsigned long long>(t.differing_elements),
                  static_cast<unsigned long long>(t.elements));
      if (t.max_abs_diff) std::printf(", max abs diff %.6g", *t.max_abs_diff);
      std::printf(")");
    }
    std::printf("\n");
  }
  for (const std::string& at : r.differing_values) {
    std::printf("%-13s %s\n", "value differs", Printable(at.empty() ? "(all values)" : at).c_str());
  }
  if (r.identical()) {
    std::printf("identical: %zu tensors\n", r.tensors.size());
  } else {
    std::printf("%zu of %zu tensors differ\n", differing, r.tensors.size());
  }
}

}  // namespace

void AddDiff(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("diff", "Compare two checkpoints tensor by tensor");
  auto a = std::make_shared<std::string>();
  auto b = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("A", *a, "first checkpoint (any loadable path)")->required();
  cmd->add_option("B", *b, "second checkpoint")->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->callback([=] {
    auto report = DiffCheckpoints(*a, *b);
    if (!report.ok()) {
      *exit_code = Fail(report.status());
      return;
    }
    *exit_code = report->identical() ? kExitOk : kExitProblems;
    if (*json) return PrintJson(ToJson(*report));
    PrintHuman(*report);
  });
}

}  // namespace shardsafe::cli
