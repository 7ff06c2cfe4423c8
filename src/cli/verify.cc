// shardsafe verify PATH: every file present, every checksum, every tensor
// covered. Exit 1 naming file and tensor on any fault.
#include <iostream>

#include "cli/commands.h"
#include "cli/output.h"
#include "shardsafe/tools.h"

namespace shardsafe::cli {

void AddVerify(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("verify", "Check files, checksums and coverage of a checkpoint");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(4);
  cmd->add_option("PATH", *path, "checkpoint dir, root, Hugging Face dir or .safetensors file")->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->add_option("--threads", *threads, "files checked in parallel")->check(CLI::Range(1, 256));
  cmd->callback([=] {
    ProgressLine progress(!*json);
    VerifyReport r = VerifyCheckpoint(*path, nullptr, *threads, progress.Callback());
    progress.Finish();
    // Nothing to verify there, or no valid path: an error, not a finding.
    if (r.unopened == StatusCode::kNotFound || r.unopened == StatusCode::kInvalidArgument) {
      *exit_code = Fail(r.faults.front());
      return;
    }
    *exit_code = r.ok() ? kExitOk : kExitProblems;
    if (*json) {
      PrintJson({{"path", r.path}, {"ok", r.ok()}, {"faults", r.faults}, {"files", r.files},
                 {"tensors", r.tensors}, {"chunks_verified", r.chunks_verified},
                 {"bytes_checked", r.bytes_checked}});
      return;
    }
    for (const std::string& f : r.faults) std::cout << "FAULT  " << Printable(f) << "\n";
    if (r.ok()) {
      std::cout << "OK  " << Printable(r.path) << ": " << r.files << " files, " << r.tensors << " tensors, "
                << r.chunks_verified << " checksums verified (" << FormatBytes(r.bytes_checked)
                << ")" << (r.native ? "" : "; foreign file: headers and coverage only") << "\n";
    } else {
      std::cout << "FAILED  " << Printable(r.path) << ": " << r.faults.size() << " problem(s)\n";
    }
  });
}

}  // namespace shardsafe::cli
