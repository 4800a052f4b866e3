// `moetrain chat-render` (hidden, a testing aid): renders JSONL records {messages,
// add_generation_prompt, extra} with a chat template (a .jinja file or a tokenizer_config.json),
// writing "<<<record N>>>\n" + text + "\n" per record (or "<<<record N error>>>\n" when the
// template raises), the format tests/reference/node/render_chat_template.js writes too.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/check.h"
#include "tokenizer/chat_template.h"

namespace moetrain::cli {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "[chat-render] cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A tokenizer_config.json gives the template and its special tokens (strings or {"content"}).
void load_template(const std::string& path, std::string& source, ojson& specials) {
  std::string text = read_file(path);
  ojson cfg = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!cfg.is_object() || !cfg.contains("chat_template")) {
    source = text;  // a raw Jinja file
    return;
  }
  const ojson& t = cfg["chat_template"];
  if (t.is_string()) {
    source = t.get<std::string>();
  } else if (t.is_array()) {
    for (auto& e : t)
      if (e.is_object() && e.value("name", "") == "default") source = e.value("template", "");
    MT_CHECK(!source.empty(), "[chat-render] {}: chat_template list has no entry named 'default'", path);
  } else {
    MT_FAIL("[chat-render] {}: chat_template must be a string or a list of {{name, template}}", path);
  }
  for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!cfg.contains(k)) continue;
    const ojson& v = cfg[k];
    if (v.is_string()) specials[k] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) specials[k] = v["content"];
  }
}

int run_chat_render(int argc, char** argv) {
  std::string tmpl_path, input, output = "-";
  CLI::App app{"Render JSONL conversations {messages, add_generation_prompt, extra} with a chat template."};
  app.add_option("--template", tmpl_path, "a .jinja file or a tokenizer_config.json")->required();
  app.add_option("--input", input, "JSONL file of records")->required();
  app.add_option("--output", output, "output file (default: stdout)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::string source;
  ojson specials = ojson::object();
  load_template(tmpl_path, source, specials);
  ChatTemplate tmpl(source);

  std::ifstream in(input, std::ios::binary);
  MT_CHECK(in.good(), "[chat-render] cannot open --input {}", input);
  std::ofstream file;
  if (output != "-") {
    file.open(output, std::ios::binary);
    MT_CHECK(file.good(), "[chat-render] cannot write --output {}", output);
  }
  std::ostream& out = output == "-" ? std::cout : file;
  std::string line;
  int lineno = 0, record = 0, failed = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ojson rec;
    try {
      rec = ojson::parse(line);
    } catch (const ojson::parse_error& e) {
      MT_FAIL("[chat-render] {} line {}: invalid JSON: {}", input, lineno, e.what());
    }
    MT_CHECK(rec.is_object() && rec.contains("messages"), "[chat-render] {} line {}: expected an object with "
             "'messages'", input, lineno);
    ChatRenderOptions opt;
    opt.add_generation_prompt = rec.value("add_generation_prompt", false);
    opt.extra = specials;
    if (rec.contains("extra")) {
      MT_CHECK(rec["extra"].is_object(), "[chat-render] {} line {}: 'extra' must be an object", input, lineno);
      for (auto& [k, v] : rec["extra"].items()) opt.extra[k] = v;
    }
    try {
      std::string text = tmpl.render(rec["messages"], opt);
      out << "<<<record " << record << ">>>\n" << text << "\n";
    } catch (const Error& e) {
      out << "<<<record " << record << " error>>>\n";
      std::fprintf(stderr, "chat-render: %s line %d: %s\n", input.c_str(), lineno, e.what());
      ++failed;
    }
    ++record;
  }
  out.flush();
  std::fprintf(stderr, "chat-render: %d records, %d raised errors\n", record, failed);
  return 0;
}

}  // namespace

MT_COMMAND("chat-render", "", run_chat_render);  // empty summary: not listed in usage

}  // namespace moetrain::cli
