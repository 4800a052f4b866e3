// moetrain entry point: finds the subcommand in the registry and runs it. A moetrain::Error
// (bad input, bad config) prints its message and exits 1; nothing else happens here.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "cli/command.h"
#include "core/check.h"
#include "core/env.h"
#include "core/log.h"

namespace moetrain::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace moetrain::cli

static void usage() {
  auto cmds = moetrain::cli::command_registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: moetrain <command> [options]   (moetrain <command> --help for its options)\n\ncommands:\n");
  for (auto& c : cmds)
    if (!c.summary.empty())  // commands registered without a summary are hidden testing aids
      std::fprintf(stderr, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  using namespace moetrain;
  set_log_level(parse_log_level(env_string("MT_LOG_LEVEL", "info")));
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (auto& c : cli::command_registry()) {
    if (c.name != argv[1]) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const Error& e) {
      std::fprintf(stderr, "moetrain %s: error: %s\n", argv[1], e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "moetrain %s: error: %s\n", argv[1], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "moetrain: unknown command '%s'\n", argv[1]);
  usage();
  return 2;
}
