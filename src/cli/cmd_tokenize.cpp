// `moetrain tokenize`: text or JSONL records in, one line of space-separated token ids out per
// record; --decode turns such lines back into text (or JSONL). --bench times encoding instead
// (single thread, cold and warm cache, then --threads threads) and prints tokens/s.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/check.h"
#include "core/env.h"
#include "tokenizer/tokenizer.h"

namespace moetrain::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer, input = "-", output = "-", field = "text";
  bool jsonl = false, decode = false, bench = false;
  int threads = 0;
};

// Reads records: lines of text, or the `field` string of each non-empty JSONL line.
class RecordReader {
 public:
  RecordReader(const TokenizeArgs& a) : args_(a) {
    if (a.input != "-") {
      file_.open(a.input, std::ios::binary);
      MT_CHECK(file_.good(), "[tokenize] cannot open --input {}", a.input);
    }
  }
  // Appends up to `max_records` records (or ~max_bytes); returns whether any were appended.
  bool read(std::vector<std::string>& out, size_t max_records, size_t max_bytes) {
    std::istream& in = args_.input == "-" ? std::cin : file_;
    std::string line;
    size_t bytes = 0, before = out.size();
    while (out.size() < max_records && bytes < max_bytes && std::getline(in, line)) {
      ++line_no_;
      if (!args_.jsonl || args_.decode) {
        bytes += line.size();
        out.push_back(std::move(line));
        continue;
      }
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        MT_FAIL("[tokenize] {}:{}: malformed JSON ({})", name(), line_no_, e.what());
      }
      auto it = j.is_object() ? j.find(args_.field) : j.end();
      if (!j.is_object() || it == j.end() || !it->is_string())
        MT_FAIL("[tokenize] {}:{}: expected an object with a string field '{}'", name(), line_no_,
                args_.field);
      out.push_back(it->get<std::string>());
      bytes += out.back().size();
    }
    return out.size() > before;
  }
  std::string name() const { return args_.input == "-" ? "<stdin>" : args_.input; }
  size_t line_no() const { return line_no_; }

 private:
  const TokenizeArgs& args_;
  std::ifstream file_;
  size_t line_no_ = 0;
};

std::vector<int32_t> parse_ids(const std::string& line, const std::string& where) {
  std::vector<int32_t> ids;
  const char* p = line.c_str();
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == '\r') ++p;
    if (!*p) break;
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ' ' && *end != '\t' && *end != '\r'))
      MT_FAIL("[tokenize] {}: expected space-separated token ids, got '{}'", where,
              line.substr(static_cast<size_t>(p - line.c_str()), 20));
    ids.push_back(static_cast<int32_t>(v));
    p = end;
  }
  return ids;
}

int run_bench(const Tokenizer& tok, RecordReader& reader, int threads) {
  std::vector<std::string> records;
  while (reader.read(records, SIZE_MAX, SIZE_MAX)) {}
  std::vector<std::string_view> views(records.begin(), records.end());
  size_t bytes = 0;
  for (auto& r : records) bytes += r.size();
  using clock = std::chrono::steady_clock;
  auto pass = [&](int nt, size_t* tokens) {
    auto t0 = clock::now();
    size_t n = 0;
    if (nt == 1) {
      for (auto v : views) n += tok.encode(v).size();
    } else {
      for (auto& ids : tok.encode_batch(views, nt)) n += ids.size();
    }
    *tokens = n;
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  size_t tokens = 0;
  double cold = pass(1, &tokens);
  double warm = pass(1, &tokens);
  double multi = pass(threads, &tokens);
  auto report = [&](const char* what, double s) {
    std::printf("moetrain %-28s %10.0f tokens/s  %7.2f MB/s  (%.3f s)\n", what, tokens / s,
                bytes / s / 1e6, s);
  };
  std::printf("moetrain corpus: %zu records, %zu bytes, %zu tokens\n", records.size(), bytes,
              tokens);
  report("1 thread, cold cache", cold);
  report("1 thread, warm cache", warm);
  report(fmt::format("{} threads, warm cache", threads).c_str(), multi);
  return 0;
}

int run_tokenize(int argc, char** argv) {
  TokenizeArgs a;
  CLI::App app{"Encode text or JSONL records to token ids (one line of ids per record), or "
               "decode id lines back to text."};
  app.add_option("--tokenizer", a.tokenizer, "tokenizer.json or a directory holding it")
      ->required();
  app.add_option("--input", a.input, "input file (default: stdin)");
  app.add_option("--output", a.output, "output file (default: stdout)");
  app.add_flag("--jsonl", a.jsonl, "input records are JSON lines (with --decode: write JSONL)");
  app.add_option("--field", a.field, "JSONL field holding the text (default: text)");
  app.add_flag("--decode", a.decode, "read lines of ids, write the decoded text");
  app.add_option("--threads", a.threads, "encoding threads (default: MT_NUM_THREADS or all)");
  app.add_flag("--bench", a.bench, "time encoding of the input instead of writing ids");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (a.threads <= 0) a.threads = env_num_threads();
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(a.tokenizer);
  RecordReader reader(a);
  if (a.bench) {
    std::printf("moetrain tokenizer load: %.3f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return run_bench(*tok, reader, a.threads);
  }
  FILE* out = stdout;
  if (a.output != "-") {
    out = std::fopen(a.output.c_str(), "wb");
    MT_CHECK(out, "[tokenize] cannot write --output {}", a.output);
  }
  std::vector<std::string> records;
  std::string buf;
  while (true) {
    records.clear();
    size_t before = reader.line_no();
    if (!reader.read(records, 1 << 16, 64u << 20)) break;
    buf.clear();
    if (a.decode) {
      for (size_t i = 0; i < records.size(); ++i) {
        std::string where = fmt::format("{}:{}", reader.name(), before + i + 1);
        std::string text = tok->decode(parse_ids(records[i], where));
        if (a.jsonl) {
          nlohmann::json j = nlohmann::json::object();
          j[a.field] = std::move(text);
          buf += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        } else {
          buf += text;
        }
        buf += '\n';
      }
    } else {
      std::vector<std::string_view> views(records.begin(), records.end());
      for (const auto& ids : tok->encode_batch(views, a.threads)) {
        for (size_t k = 0; k < ids.size(); ++k) {
          if (k) buf += ' ';
          fmt::format_to(std::back_inserter(buf), "{}", ids[k]);
        }
        buf += '\n';
      }
    }
    MT_CHECK(std::fwrite(buf.data(), 1, buf.size(), out) == buf.size(),
             "[tokenize] write failed ({})", a.output);
  }
  if (out != stdout) MT_CHECK(std::fclose(out) == 0, "[tokenize] cannot close {}", a.output);
  return 0;
}

}  // namespace

MT_COMMAND("tokenize", "encode text/JSONL to token ids with a tokenizer.json, or --decode",
           run_tokenize);

}  // namespace moetrain::cli
