// `moetrain prepare`: JSONL (text, chat or preference records) -> Megatron indexed datasets with
// loss masks (PREFIX_train, PREFIX_valid; see docs/data.md). Prints the record and token counts.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "core/check.h"
#include "data/prepare.h"
#include "tokenizer/tokenizer.h"

namespace moetrain::cli {
namespace {

int run_prepare(int argc, char** argv) {
  CLI::App app{"Tokenize a JSONL file into indexed datasets (tokens + loss masks) for training", "moetrain prepare"};
  PrepareOptions opt;
  std::string tokenizer, format = "auto", overflow = "truncate", on_error = "stop", template_args = "{}";
  app.add_option("--input", opt.input, "JSONL file: {text} | {messages} | {prompt, chosen, rejected} per line")->required();
  app.add_option("--tokenizer", tokenizer, "directory holding tokenizer.json (and tokenizer_config.json)")->required();
  app.add_option("--output", opt.output_prefix, "output prefix: writes PREFIX_train*, PREFIX_valid*, PREFIX_info.json")
      ->required();
  app.add_option("--format", format, "record format")->check(CLI::IsMember({"auto", "text", "chat", "preference"}));
  app.add_flag("--append-eod", opt.append_eod, "append the tokenizer's eos token to each text record");
  app.add_option("--max-length", opt.max_length, "longest sequence in tokens (0: no limit)")->check(CLI::NonNegativeNumber);
  app.add_option("--overflow", overflow, "what to do with longer sequences")->check(CLI::IsMember({"truncate", "drop"}));
  app.add_option("--workers", opt.workers, "tokenizer threads")->check(CLI::Range(1, 1024));
  app.add_option("--valid-fraction", opt.valid_fraction, "fraction of records for PREFIX_valid")
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--seed", opt.seed, "seed of the train/valid split");
  app.add_option("--on-error", on_error, "bad input line: stop with an error, or skip and count it")
      ->check(CLI::IsMember({"stop", "skip"}));
  app.add_option("--template-args", template_args, "JSON object passed to the chat template, e.g. "
                 "'{\"enable_thinking\": false}'");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  opt.format = parse_record_format(format);
  opt.overflow = overflow == "drop" ? OverflowPolicy::kDrop : OverflowPolicy::kTruncate;
  opt.on_error = on_error == "skip" ? ErrorPolicy::kSkip : ErrorPolicy::kStop;
  nlohmann::json targs = nlohmann::json::parse(template_args, nullptr, false);
  MT_CHECK(!targs.is_discarded() && targs.is_object(), "[prepare] --template-args must be a JSON object, got '{}'",
           template_args);

  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(tokenizer);
  std::unique_ptr<RecordEncoder> enc = make_tokenizer_encoder(*tok, targs);
  const PrepareStats s = prepare_dataset(opt, *enc);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("prepared %s (%s records) in %.1f s\n", opt.output_prefix.c_str(), record_format_name(s.format), secs);
  std::printf("  lines %lld  records %lld (train %lld, valid %lld)\n", (long long)s.lines, (long long)s.records,
              (long long)s.train_records, (long long)s.valid_records);
  std::printf("  tokens %lld (train %lld, valid %lld)  trained tokens %lld\n", (long long)s.tokens,
              (long long)s.train_tokens, (long long)s.valid_tokens, (long long)s.trained_tokens);
  std::printf("  truncated %lld  dropped %lld  skipped %lld\n", (long long)s.truncated, (long long)s.dropped,
              (long long)s.skipped);
  for (const std::string& e : s.first_errors) std::printf("  skipped: %s\n", e.c_str());
  if (s.skipped > static_cast<int64_t>(s.first_errors.size()))
    std::printf("  ... and %lld more skipped lines\n", (long long)(s.skipped - (int64_t)s.first_errors.size()));
  return 0;
}

}  // namespace

MT_COMMAND("prepare", "tokenize JSONL (text, chat, preference) into indexed datasets with loss masks", run_prepare);

}  // namespace moetrain::cli
