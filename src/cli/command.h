// Subcommand registry. Each src/cli/cmd_<name>.cpp registers itself with MT_COMMAND; main()
// looks the name up and calls it with the remaining arguments (argv[0] is the command name).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace moetrain::cli {

using CommandFn = std::function<int(int argc, char** argv)>;

struct Command {
  std::string name;
  std::string summary;
  CommandFn run;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn) {
    command_registry().push_back({name, summary, std::move(fn)});
  }
};

}  // namespace moetrain::cli

#define MT_COMMAND_CAT2_(a, b) a##b
#define MT_COMMAND_CAT_(a, b) MT_COMMAND_CAT2_(a, b)
#define MT_COMMAND(name, summary, fn) \
  static ::moetrain::cli::CommandRegistrar MT_COMMAND_CAT_(mt_command_, __LINE__)(name, summary, fn)
