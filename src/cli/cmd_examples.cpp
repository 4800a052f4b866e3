// `moetrain examples --output DIR`: builds the example JSONL datasets from Debian packages
// (FreeDict eng-deu -> translation chats and preference pairs; fortunes-min -> text records).
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cstdio>

#include "cli/command.h"
#include "core/check.h"
#include "data/examples.h"

namespace moetrain::cli {
namespace {

int run_examples(int argc, char** argv) {
  CLI::App app{"Build the example datasets (dict_sft.jsonl, dict_pref.jsonl, fortunes.jsonl)", "moetrain examples"};
  std::string out;
  ExampleSources src;
  int64_t max_words = 3000;
  app.add_option("--output", out, "directory to write into (created if missing)")->required();
  app.add_option("--max-words", max_words, "dictionary words to use")->check(CLI::Range(int64_t{2}, int64_t{1000000}));
  app.add_option("--dict-index", src.dict_index, "dictd index file");
  app.add_option("--dict-data", src.dict_data, "dictd .dict.dz file");
  app.add_option("--fortunes", src.fortunes, "fortune file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  struct stat st;
  if (::stat(out.c_str(), &st) != 0) MT_CHECK(::mkdir(out.c_str(), 0755) == 0, "[examples] cannot create {}", out);
  const ExampleCounts c = build_examples(out, src, max_words);
  std::printf("wrote %s/dict_sft.jsonl (%lld chats), %s/dict_pref.jsonl (%lld pairs), %s/fortunes.jsonl (%lld texts)\n",
              out.c_str(), (long long)c.sft, out.c_str(), (long long)c.pref, out.c_str(), (long long)c.fortunes);
  return 0;
}

}  // namespace

MT_COMMAND("examples", "build example datasets from installed Debian packages (dictionary, fortunes)", run_examples);

}  // namespace moetrain::cli
