// shardsafe: inspect, verify, list, prune and compare checkpoints, import
// and export Hugging Face files, and run the end-to-end demo. `shardsafe --help` lists the subcommands.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/output.h"

int main(int argc, char** argv) {
  using namespace shardsafe::cli;
  CLI::App app{"shardsafe: sharded, crash-safe checkpoints in safetensors format"};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 success; 1 a check found problems (verify, diff); 2 a usage error, a path\n"
      "that does not exist, or any other error (the message on stderr says which).");
  int exit_code = kExitOk;
  AddInspect(app, &exit_code);
  AddVerify(app, &exit_code);
  AddLs(app, &exit_code);
  AddPrune(app, &exit_code);
  AddDiff(app, &exit_code);
  AddDemo(app, &exit_code);
  AddImport(app, &exit_code);
  AddExportHf(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitError;
  }
  return exit_code;
}
