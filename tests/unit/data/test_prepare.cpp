// `prepare` pipeline with a stand-in encoder (bytes -> ids, a bracketed toy chat format): text,
// chat and preference layouts and masks checked against hand-computed ids, error messages with
// file:line and field, --on-error skip counts, truncation/drop counts, atomic outputs, and output
// bytes independent of the worker count.
#include <gtest/gtest.h>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "data_test_util.h"

using namespace moetrain;
using namespace moetrain::testing;
using json = nlohmann::json;

namespace {

// ids: byte b -> b + 10; chat: per message [1, role id, content..., 9], mask 1 on assistant content
// and its closing 9. eos = 0.
class FakeEncoder : public RecordEncoder {
 public:
  explicit FakeEncoder(bool chat_template = true) : chat_(chat_template) {}
  std::vector<int32_t> encode_text(std::string_view text) const override {
    std::vector<int32_t> v;
    for (unsigned char c : text) v.push_back(c + 10);
    return v;
  }
  MaskedTokens encode_chat(const json& messages) const override {
    MaskedTokens t;
    for (const json& m : messages) {
      const std::string role = m["role"];
      if (role == "explode") MT_FAIL("[chat_template] unknown role 'explode' at 1:5");
      const uint8_t a = role == "assistant";
      t.ids.push_back(1);
      t.mask.push_back(0);
      t.ids.push_back(role == "user" ? 2 : role == "assistant" ? 3 : 4);
      t.mask.push_back(0);
      for (int32_t id : encode_text(m["content"].get<std::string>())) {
        t.ids.push_back(id);
        t.mask.push_back(a);
      }
      t.ids.push_back(9);
      t.mask.push_back(a);
    }
    return t;
  }
  bool has_chat_template() const override { return chat_; }
  int32_t eos_id() const override { return 0; }
  int64_t vocab_size() const override { return 300; }

 private:
  bool chat_;
};

std::vector<int32_t> ids(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c + 10);
  return v;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> v;
  for (auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

struct Fixture {
  TempDir dir;
  PrepareOptions opt;
  FakeEncoder enc;
  explicit Fixture(bool chat = true) : enc(chat) {
    opt.input = dir / "in.jsonl";
    opt.output_prefix = dir / "out";
    opt.chunk_lines = 3;  // several chunks even for small inputs
  }
  PrepareStats run(const std::string& jsonl) {
    write_text(opt.input, jsonl);
    return prepare_dataset(opt, enc);
  }
  // The error message of a failing run; checks that the run changed no file but its input.
  std::string error(const std::string& jsonl) {
    std::vector<std::string> before = dir.files();
    if (std::find(before.begin(), before.end(), "in.jsonl") == before.end()) before.insert(before.begin(), "in.jsonl");
    std::vector<std::vector<uint8_t>> contents;
    for (const std::string& n : before)
      if (n != "in.jsonl") contents.push_back(read_bytes(dir / n));
    try {
      run(jsonl);
    } catch (const Error& e) {
      EXPECT_EQ(dir.files(), before) << "a failed run added or removed files";
      std::vector<std::vector<uint8_t>> after;
      for (const std::string& n : before)
        if (n != "in.jsonl") after.push_back(read_bytes(dir / n));
      EXPECT_TRUE(after == contents) << "a failed run changed earlier outputs";
      return e.what();
    }
    ADD_FAILURE() << "expected an error for:\n" << jsonl;
    return "";
  }
};

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << (hay)

}  // namespace

TEST(Prepare, TextRecordsWithEod) {
  Fixture f;
  f.opt.append_eod = true;
  PrepareStats s = f.run("{\"text\": \"ab\"}\n\n  \n{\"text\": \"c\", \"id\": 7}\n");
  EXPECT_EQ(s.format, RecordFormat::kText);
  EXPECT_EQ(s.lines, 4);
  EXPECT_EQ(s.records, 2);
  EXPECT_EQ(s.tokens, 5);
  EXPECT_EQ(s.trained_tokens, 5);
  EXPECT_EQ(f.dir.files(), (std::vector<std::string>{"in.jsonl", "out_info.json", "out_train.bin", "out_train.idx",
                                                     "out_train_mask.bin", "out_train_mask.idx"}));
  IndexedDataset ds(f.dir / "out_train"), m(f.dir / "out_train_mask");
  EXPECT_EQ(ds.dtype(), IdxDType::kU16);
  EXPECT_EQ(m.dtype(), IdxDType::kU8);
  ASSERT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.sequence(0), cat({ids("ab"), {0}}));
  EXPECT_EQ(ds.sequence(1), cat({ids("c"), {0}}));
  EXPECT_EQ(m.sequence(0), (std::vector<int32_t>{1, 1, 1}));
  json info = json::parse(std::string(reinterpret_cast<const char*>(read_bytes(f.dir / "out_info.json").data()),
                                      read_bytes(f.dir / "out_info.json").size()));
  EXPECT_EQ(info["layout"], "documents");
  EXPECT_EQ(info["records"], 2);
}

TEST(Prepare, ChatMasksAssistantTokens) {
  Fixture f;
  f.opt.format = RecordFormat::kChat;
  f.run(R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}, )"
        R"({"role": "assistant", "content": "yo"}]})" "\n");
  IndexedDataset ds(f.dir / "out_train"), m(f.dir / "out_train_mask");
  EXPECT_EQ(ds.sequence(0), cat({{1, 4}, ids("s"), {9, 1, 2}, ids("hi"), {9, 1, 3}, ids("yo"), {9}}));
  EXPECT_EQ(m.sequence(0), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
}

TEST(Prepare, PreferencePairsMaskOnlyTheResponse) {
  Fixture f;
  PrepareStats s = f.run(
      R"({"prompt": "q", "chosen": "good", "rejected": "bad"})" "\n"
      R"({"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, )"
      R"({"role": "user", "content": "c"}], "chosen": [{"role": "assistant", "content": "d"}], )"
      R"("rejected": {"role": "assistant", "content": "e"}})" "\n");
  EXPECT_EQ(s.format, RecordFormat::kPreference);
  IndexedDataset ds(f.dir / "out_train"), m(f.dir / "out_train_mask");
  ASSERT_EQ(ds.num_documents(), 2);
  ASSERT_EQ(ds.num_sequences(), 4);
  EXPECT_EQ(ds.document_begin(1), 2);
  EXPECT_EQ(ds.sequence(0), cat({{1, 2}, ids("q"), {9, 1, 3}, ids("good"), {9}}));
  EXPECT_EQ(m.sequence(0), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(ds.sequence(1), cat({{1, 2}, ids("q"), {9, 1, 3}, ids("bad"), {9}}));
  // The prompt's own assistant turn ("b") is not trained; only the final reply is.
  EXPECT_EQ(ds.sequence(2), cat({{1, 2}, ids("a"), {9, 1, 3}, ids("b"), {9, 1, 2}, ids("c"), {9, 1, 3}, ids("d"), {9}}));
  EXPECT_EQ(m.sequence(2), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(m.sequence(3), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(s.trained_tokens, 5 + 4 + 2 + 2);
}

TEST(Prepare, PreferenceWithoutChatTemplateConcatenatesText) {
  Fixture f(/*chat=*/false);
  f.run(R"({"prompt": "q:", "chosen": "y", "rejected": "n"})" "\n");
  IndexedDataset ds(f.dir / "out_train"), m(f.dir / "out_train_mask");
  EXPECT_EQ(ds.sequence(0), cat({ids("q:"), ids("y"), {0}}));
  EXPECT_EQ(m.sequence(0), (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_HAS(f.error(R"({"prompt": [{"role": "user", "content": "a"}], "chosen": "y", "rejected": "n"})" "\n"),
             "no chat template");
}

TEST(Prepare, ErrorsNameFileLineAndField) {
  Fixture f;
  const std::string good = R"({"text": "ok"})" "\n";
  struct Case { std::string line, needle; };
  for (const Case& c : std::vector<Case>{
           {R"({"text": "a")", "malformed JSON"},
           {R"({"txt": "a"})", "field 'text' is missing"},
           {R"({"text": 5})", "field 'text' must be a string, got number"},
           {R"({"text": ""})", "field 'text' is empty"},
           {R"([1, 2])", "expected a JSON object, got array"},
           {"{\"text\": \"a\xff\"}", "invalid UTF-8 at byte 11"},
           {"{\"text\": \"\xe0\x80\xaf\"}", "invalid UTF-8 at byte 10"},  // overlong '/'
       }) {
    const std::string msg = f.error(good + c.line + "\n" + good);
    EXPECT_HAS(msg, f.opt.input + ":2: ");
    EXPECT_HAS(msg, c.needle);
  }
  const std::string chat = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})" "\n";
  for (const Case& c : std::vector<Case>{
           {R"({"messages": []})", "field 'messages' is an empty conversation"},
           {R"({"messages": "hi"})", "field 'messages' must be an array of messages, got string"},
           {R"({"messages": [{"role": "user", "content": 3}]})", "field 'messages[0].content' must be a string, got number"},
           {R"({"messages": [{"content": "x"}]})", "field 'messages[0].role' is missing"},
           {R"({"messages": [{"role": "explode", "content": "x"}]})", "field 'messages': chat template error: [chat_template] unknown role"},
           {R"({"messages": [{"role": "user", "content": "x"}]})", "no assistant tokens"},
           {R"({"text": "x"})", "field 'messages' is missing"},  // format fixed by line 1
       }) {
    const std::string msg = f.error(chat + chat + c.line + "\n");
    EXPECT_HAS(msg, f.opt.input + ":3: ");
    EXPECT_HAS(msg, c.needle);
  }
  EXPECT_HAS(f.error(R"({"prompt": "p", "chosen": "c"})" "\n"), ":1: field 'rejected' is missing");
  EXPECT_HAS(f.error(R"({"prompt": 1, "chosen": "c", "rejected": "r"})" "\n"), "field 'prompt' must be a string or an array");
  EXPECT_HAS(f.error(R"({"foo": 1})" "\n"), "none of the fields");
}

TEST(Prepare, SkipCountsBadLines) {
  Fixture f;
  f.opt.on_error = ErrorPolicy::kSkip;
  PrepareStats s = f.run("{\"text\": \"a\"}\n{bad\n{\"text\": \"b\"}\n{\"text\": 1}\n\n{\"text\": \"c\"}\n");
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.records, 3);
  ASSERT_EQ(s.first_errors.size(), 2u);
  EXPECT_HAS(s.first_errors[0], ":2: malformed JSON");
  EXPECT_HAS(s.first_errors[1], ":4: field 'text' must be a string");
  IndexedDataset ds(f.dir / "out_train");
  EXPECT_EQ(ds.sequence(2), ids("c"));
  // Nothing usable at all is still an error, with nothing written.
  EXPECT_HAS(f.error("{bad\n[1]\n"), "no records");
}

TEST(Prepare, OverflowTruncateAndDrop) {
  Fixture f;
  f.opt.max_length = 3;
  PrepareStats s = f.run("{\"text\": \"abcdef\"}\n{\"text\": \"ab\"}\n");
  EXPECT_EQ(s.truncated, 1);
  EXPECT_EQ(s.dropped, 0);
  IndexedDataset ds(f.dir / "out_train");
  EXPECT_EQ(ds.sequence(0), ids("abc"));
  EXPECT_EQ(ds.sequence(1), ids("ab"));

  f.opt.overflow = OverflowPolicy::kDrop;
  s = f.run("{\"text\": \"abcdef\"}\n{\"text\": \"ab\"}\n");
  EXPECT_EQ(s.dropped, 1);
  EXPECT_EQ(s.records, 1);
  // A chat truncated before any assistant token is dropped even under truncate.
  f.opt.overflow = OverflowPolicy::kTruncate;
  f.opt.max_length = 8;
  s = f.run(R"({"messages": [{"role": "user", "content": "long question"}, {"role": "assistant", "content": "a"}]})" "\n"
            R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "abc"}]})" "\n");
  EXPECT_EQ(s.dropped, 1);
  EXPECT_EQ(s.truncated, 1);
  EXPECT_EQ(s.records, 1);
}

TEST(Prepare, SplitIsSeededAndWorkerCountDoesNotMatter) {
  std::string jsonl;
  for (int i = 0; i < 300; ++i) jsonl += "{\"text\": \"record " + std::to_string(i) + "\"}\n";
  auto outputs = [&](int workers, uint64_t seed, PrepareStats* st) {
    Fixture f;
    f.opt.valid_fraction = 0.2;
    f.opt.workers = workers;
    f.opt.seed = seed;
    f.opt.chunk_lines = 17;
    *st = f.run(jsonl);
    std::vector<std::vector<uint8_t>> files;
    for (const char* n : {"out_train.bin", "out_train.idx", "out_valid.bin", "out_valid.idx", "out_valid_mask.idx"})
      files.push_back(read_bytes(f.dir / n));
    return files;
  };
  PrepareStats a, b, c;
  auto one = outputs(1, 5, &a), three = outputs(3, 5, &b), other_seed = outputs(3, 6, &c);
  EXPECT_EQ(one, three);
  EXPECT_NE(one, other_seed);
  EXPECT_EQ(a.records, 300);
  EXPECT_EQ(a.train_records + a.valid_records, 300);
  EXPECT_GT(a.valid_records, 30);  // 60 expected; binomial sd ~7
  EXPECT_LT(a.valid_records, 90);
  EXPECT_EQ(a.valid_records, b.valid_records);
}

TEST(Prepare, BadOptionsFailBeforeWriting) {
  Fixture f;
  f.opt.output_prefix = f.dir / "no/such/dir/out";
  EXPECT_HAS(f.error("{\"text\": \"a\"}\n"), "output directory");
  Fixture g;
  g.opt.input = g.dir / "missing.jsonl";
  try {
    prepare_dataset(g.opt, g.enc);
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "missing.jsonl");
  }
  EXPECT_TRUE(g.dir.files().empty());
}

TEST(Prepare, Utf8Validator) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), -1);
  EXPECT_EQ(find_invalid_utf8("gr\xc3\xbc\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x98\x80"), -1);
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2);          // stray continuation byte
  EXPECT_EQ(find_invalid_utf8("a\xc3"), 1);           // truncated
  EXPECT_EQ(find_invalid_utf8("\xc0\xaf"), 0);        // overlong
  EXPECT_EQ(find_invalid_utf8("x\xed\xa0\x80"), 1);   // surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0);  // > U+10FFFF
}
