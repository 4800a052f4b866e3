// AtomicDir: temporary sibling directory + fsync + rename (see atomic_dir.h).
#include "io/atomic_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace moetrain {

namespace fs = std::filesystem;

namespace {

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

bool is_empty_dir(const fs::path& p) { return fs::is_directory(p) && fs::is_empty(p); }

}  // namespace

void check_output_dir(const std::string& final_dir, Overwrite ow) {
  const fs::path f(final_dir);
  if (!fs::exists(f)) return;
  MT_CHECK(fs::is_directory(f), "[output] {} exists and is not a directory", final_dir);
  MT_CHECK(ow == Overwrite::kReplace || is_empty_dir(f),
           "[output] {} exists and is not empty; choose a new directory (or allow overwriting)", final_dir);
}

AtomicDir::AtomicDir(const std::string& final_dir, Overwrite ow) : ow_(ow) {
  MT_CHECK(!final_dir.empty(), "[output] empty output directory name");
  fs::path f = fs::absolute(fs::path(final_dir)).lexically_normal();
  if (f.has_filename() == false) f = f.parent_path();
  final_ = f.string();
  check_output_dir(final_, ow);
  fs::create_directories(f.parent_path());
  tmp_ = final_ + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  fs::create_directory(tmp_, ec);
  MT_CHECK(!ec, "[output] cannot create {}: {}", tmp_, ec.message());
}

AtomicDir::~AtomicDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

std::string AtomicDir::path(const std::string& file) const { return (fs::path(tmp_) / file).string(); }

void AtomicDir::commit() {
  MT_CHECK(!committed_, "[output] {} committed twice", final_);
  for (const auto& de : fs::directory_iterator(tmp_))
    if (de.is_regular_file()) fsync_path(de.path());
  fsync_path(tmp_);
  std::error_code ec;
  std::string old;
  if (fs::exists(final_)) {
    if (is_empty_dir(final_)) {
      fs::remove(final_, ec);
    } else {
      MT_CHECK(ow_ == Overwrite::kReplace, "[output] {} appeared while writing; not replacing it", final_);
      old = final_ + ".old-" + std::to_string(::getpid());
      fs::remove_all(old, ec);
      fs::rename(final_, old, ec);
      MT_CHECK(!ec, "[output] cannot move {} aside: {}", final_, ec.message());
    }
  }
  fs::rename(tmp_, final_, ec);
  MT_CHECK(!ec, "[output] cannot rename {} to {}: {}", tmp_, final_, ec.message());
  committed_ = true;
  fsync_path(fs::path(final_).parent_path());
  if (!old.empty()) fs::remove_all(old, ec);
}

std::vector<std::string> copy_files_if_present(const std::string& src_dir, const std::string& dst_dir,
                                               const std::vector<std::string>& names) {
  std::vector<std::string> copied;
  for (const auto& n : names) {
    fs::path s = fs::path(src_dir) / n;
    if (!fs::is_regular_file(s)) continue;
    std::error_code ec;
    fs::copy_file(s, fs::path(dst_dir) / n, fs::copy_options::overwrite_existing, ec);
    MT_CHECK(!ec, "[output] copying {} to {} failed: {}", s.string(), dst_dir, ec.message());
    copied.push_back(n);
  }
  return copied;
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(f.good(), "[output] cannot create {}", tmp);
    f << text;
    f.flush();
    MT_CHECK(f.good(), "[output] writing {} failed (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  MT_CHECK(!ec, "[output] renaming {} to {} failed: {}", tmp, path, ec.message());
}

}  // namespace moetrain
