// The subcommands of the `shardsafe` tool. Each Add* function registers one
// subcommand on the app; its callback stores the process exit code in
// *exit_code. Subcommands are thin: parse, call the engine, report.
#pragma once

#include <CLI/CLI.hpp>

namespace shardsafe::cli {

void AddInspect(CLI::App& app, int* exit_code);
void AddVerify(CLI::App& app, int* exit_code);
void AddLs(CLI::App& app, int* exit_code);
void AddPrune(CLI::App& app, int* exit_code);
void AddDiff(CLI::App& app, int* exit_code);
void AddDemo(CLI::App& app, int* exit_code);
void AddImport(CLI::App& app, int* exit_code);
void AddExportHf(CLI::App& app, int* exit_code);

}  // namespace shardsafe::cli
