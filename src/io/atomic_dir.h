// AtomicDir: build a directory under a temporary sibling name and rename it into place only
// when complete, so readers never see a half-written checkpoint or export. An uncommitted
// AtomicDir removes its temporary directory on destruction (errors leave nothing behind).
#pragma once
#include <string>
#include <vector>

namespace moetrain {

enum class Overwrite : uint8_t { kRefuse, kReplace };

class AtomicDir {
 public:
  // Fails (before creating anything) when `final_dir` exists and is not an empty directory,
  // unless `ow` is kReplace.
  AtomicDir(const std::string& final_dir, Overwrite ow = Overwrite::kRefuse);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& tmp_dir() const { return tmp_; }
  std::string path(const std::string& file) const;  // tmp_dir()/file
  // Syncs the files, then renames the temporary directory to the final name (replacing an old
  // one when allowed) and syncs the parent directory.
  void commit();

 private:
  std::string final_, tmp_;
  Overwrite ow_;
  bool committed_ = false;
};

// The AtomicDir constructor's check alone, for callers that want to fail before long work.
void check_output_dir(const std::string& final_dir, Overwrite ow);

// Copies the files of `names` that exist in `src_dir` into `dst_dir`; returns those copied.
std::vector<std::string> copy_files_if_present(const std::string& src_dir, const std::string& dst_dir,
                                               const std::vector<std::string>& names);

// Writes `text` to `path` (through path.tmp + rename).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace moetrain
