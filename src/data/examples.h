// Example datasets built from Debian packages: English->German word-translation chats and
// preference pairs from the FreeDict eng-deu dictionary (dictd format), and text records from
// fortunes-min. Deterministic: the same package files always give the same JSONL bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moetrain {

struct ExampleSources {
  std::string dict_index = "/usr/share/dictd/freedict-eng-deu.index";
  std::string dict_data = "/usr/share/dictd/freedict-eng-deu.dict.dz";
  std::string fortunes = "/usr/share/games/fortunes/fortunes";
};

struct ExampleCounts {
  int64_t sft = 0, pref = 0, fortunes = 0;
};

// Writes DIR/dict_sft.jsonl, DIR/dict_pref.jsonl and DIR/fortunes.jsonl (each to a temporary
// file renamed at the end). `max_words` bounds the dictionary records.
ExampleCounts build_examples(const std::string& out_dir, const ExampleSources& src = {}, int64_t max_words = 3000);

// dictd index numbers: base64 digits, most significant first, alphabet A-Z a-z 0-9 + /.
int64_t dictd_base64_decode(std::string_view s);

// The German translation from a dictd entry body ("dog /dog/\nHund <masc> [zool.]\n..."): the
// first comma-separated item of the second line, annotations removed, with der/die/das for nouns
// of known gender. "" when the entry gives nothing clean to use.
std::string dict_translation(std::string_view body);

// Fortune-file records (separated by lines holding a single %), trimmed, empty ones dropped.
std::vector<std::string> split_fortunes(std::string_view text);

}  // namespace moetrain
